"""Versioned tools in the pure core: a call finishes on the version it started on.

Several versions of one tool are registered side by side (``@tool(version=...)``,
one name); the registry keeps the newest under the name (what the model sees and new
calls run on) and the others beside it. A call's ``executing`` record names its
version; a re-run, a reconcile, a retry and a compensation of that call use that
version while it is registered. When it is gone, the rule for a changed definition
applies to the newest (re-run only if the recorded arguments still fit it), and the
recovery decision says so. Logs older than versions (no version recorded) recover
exactly as before.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import attrs
import pytest

import perdure
from perdure.actors import decide, protocol
from perdure.actors.protocol import Reconcile, RunTool, Step
from perdure.inspect import summarize
from perdure.storage import codec
from perdure.storage.records import (
    RecoveryDecision,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from perdure.tools.contract import ToolDefinitionError, registry
from tests.core.sim import TOOLS, Session, only

KEYED = perdure.ReplayPolicy.KEYED


async def _charge_v1(ctx: perdure.ToolContext, cents: int) -> str:
    """Charge a card."""
    return f"v1 charged {cents}"


async def _charge_v2(ctx: perdure.ToolContext, cents: int, currency: str = "EUR") -> str:
    """Charge a card, in a currency."""
    return f"v2 charged {cents} {currency}"


async def _charge_v3(ctx: perdure.ToolContext, cents: int, card: str) -> str:
    """Charge a given card."""
    return f"v3 charged {cents} to {card}"


async def _refund(ctx: perdure.ToolContext, result: str, cents: int) -> str:
    """Refund a charge."""
    return "refunded"


async def _refund_v2(ctx: perdure.ToolContext, result: str, cents: int, currency: str) -> str:
    """Refund a charge, in its currency."""
    return "refunded (v2)"


async def _unknown(ctx: perdure.ToolContext, cents: int, **args: Any) -> perdure.Reconciled:
    return perdure.Reconciled.unknown()


REFUND_V1 = perdure.tool(name="refund", replay=KEYED)(_refund)
REFUND_V2 = perdure.tool(name="refund", replay=KEYED, version=2)(_refund_v2)
V1 = perdure.tool(name="charge", replay=KEYED, compensate=REFUND_V1)(_charge_v1)
V2 = perdure.tool(name="charge", replay=KEYED, version=2, compensate=REFUND_V2)(_charge_v2)
V3_NO_FIT = perdure.tool(name="charge", replay=KEYED, version="3")(_charge_v3)
NEVER_V1 = perdure.tool(name="charge", reconcile=_unknown)(_charge_v1)
NEVER_V2 = perdure.tool(name="charge", version=2, reconcile=_unknown)(_charge_v2)


def tools(*charges: perdure.Tool) -> dict[str, perdure.Tool]:
    return {**TOOLS, **registry(charges)}


def charging(*charges: perdure.Tool) -> Session:
    """A session whose call c1 to ``charge`` was dispatched (executing) on ``charges``."""
    s = Session(tools(*charges))
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "charge", {"cents": 5}))
    return s


def decision_on(step: Step, call_id: str) -> RecoveryDecision:
    return next(d for d in only(step.records, RecoveryDecision) if d.subject == call_id)


def run_of(step: Step, call_id: str) -> RunTool:
    return next(e for e in step.effects if isinstance(e, RunTool) and e.call_id == call_id)


# -- the registry ------------------------------------------------------------------------------


def test_the_registry_keeps_the_newest_under_the_name_and_the_others_beside_it() -> None:
    by_name = registry([V2, V1])  # the order of registration does not matter
    assert list(by_name) == ["charge"]
    newest = by_name["charge"]
    assert newest.version == "2" and newest.fn is _charge_v2
    assert newest.versions == ("1", "2")
    assert newest.at_version("1") is V1 and newest.at_version("2") is newest
    assert newest.at_version("7") is None
    assert "currency" in newest.input_schema["properties"], "the model sees the newest schema"
    assert registry(by_name.values())["charge"].versions == ("1", "2"), "idempotent"


def test_a_single_version_is_registered_as_it_is() -> None:
    assert registry([V1])["charge"] is V1
    assert V1.versions == ("1",)


def test_versions_are_ordered_as_numbers() -> None:
    nine = perdure.tool(name="charge", version="9")(_charge_v1)
    ten = perdure.tool(name="charge", version="10")(_charge_v1)
    nine_one = perdure.tool(name="charge", version="9.1")(_charge_v1)
    assert registry([ten, nine, nine_one])["charge"].versions == ("9", "9.1", "10")


def test_an_integer_version_is_the_same_as_its_string() -> None:
    assert V2.version == "2"
    again = perdure.tool(name="charge", replay=KEYED, version="2", compensate=REFUND_V2)(_charge_v2)
    assert again.definition_hash == V2.definition_hash


@pytest.mark.parametrize("bad", ["", "  ", 1.5, None, True])
def test_a_version_that_is_not_a_string_or_an_integer_is_refused(bad: Any) -> None:
    with pytest.raises(ToolDefinitionError, match="version must be a non-empty string"):
        perdure.tool(name="charge", version=bad)(_charge_v1)


def test_two_tools_with_one_name_and_one_version_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools are named 'charge' with version '1'"):
        registry([V1, perdure.tool(name="charge")(_charge_v2)])


def test_versions_side_by_side_must_say_which_is_newest() -> None:
    beta = perdure.tool(name="charge", version="beta")(_charge_v2)
    with pytest.raises(ToolDefinitionError, match="'beta' is not a version number"):
        registry([V1, beta])


# -- recovery: the version it started on, while it is registered -------------------------------


def test_a_call_in_flight_on_v1_is_re_run_on_v1_when_v1_and_v2_are_registered() -> None:
    s = charging(V1)
    first = s.state.tasks["c1"].executing
    assert first is not None and first.tool_version == "1"
    s.tools = tools(V1, V2)
    step = s.restart()
    decision = decision_on(step, "c1")
    assert decision.action == "re-run with the same idempotency key (policy keyed) on version 1"
    assert decision.reason == (
        "recorded policy keyed, registered policy keyed; it stays on version 1, "
        "which it started on (registered: 1, 2)"
    )
    rerun = run_of(step, "c1")
    assert rerun.tool is V1
    assert rerun.executing.tool_version == "1"
    assert rerun.executing.fingerprint == first.fingerprint
    assert rerun.executing.idempotency_key == first.idempotency_key


def test_new_calls_get_the_newest_version() -> None:
    s = charging(V1)
    s.tools = tools(V1, V2)
    s.restart()
    s.finish_tool("c1", "v1 charged 5")
    s.reply("again", ("c2", "charge", {"cents": 7}))
    second = s.state.tasks["c2"].executing
    assert second is not None and second.tool_version == "2"
    assert second.args == {"cents": 7, "currency": "EUR"}, "the newest's defaults"


def test_a_never_call_on_v1_asks_v1s_reconcile() -> None:
    s = charging(NEVER_V1)
    s.tools = tools(NEVER_V1, NEVER_V2)
    step = s.restart()
    (asked,) = [e for e in step.effects if isinstance(e, Reconcile)]
    assert asked.tool is NEVER_V1
    decision = decision_on(step, "c1")
    assert decision.action == "ask the tool's reconcile() on version 1"
    assert "no blind re-run; it stays on version 1" in decision.reason


def test_a_reconcile_that_finds_it_not_applied_runs_it_once_more_on_v1() -> None:
    s = charging(NEVER_V1)
    s.tools = tools(NEVER_V1, NEVER_V2)
    s.restart()
    step = s.result(protocol.ReconcileFinished(call_id="c1", status="not_applied"))
    rerun = run_of(step, "c1")
    assert rerun.tool is NEVER_V1 and rerun.executing.tool_version == "1"
    assert rerun.executing.args == {"cents": 5}


def test_a_retry_pending_on_v1_runs_its_next_attempt_on_v1() -> None:
    retrying = perdure.tool(name="charge", replay=KEYED, retry=perdure.RetryPolicy(initial=1.0))(
        _charge_v1
    )
    s = charging(retrying)
    s.finish_tool("c1", "503", outcome="retryable", is_error=True)
    assert s.state.tasks["c1"].phase == "retry_pending"
    s.tools = tools(retrying, V2)
    step = s.restart()
    assert "it stays on version 1" in decision_on(step, "c1").reason
    s.now += 60
    step = s.result(protocol.BackOffOver(call_id="c1", attempt=1))
    assert run_of(step, "c1").tool is retrying
    assert run_of(step, "c1").executing.tool_version == "1"


def test_a_compensation_runs_the_compensation_of_the_version_the_call_ran_on() -> None:
    s = charging(V1)
    s.tools = tools(V1, V2)
    s.finish_tool("c1", "v1 charged 5")
    s.reply("done")
    step, _ = s.command(protocol.Compensate("c1", "undo-1"))
    comp = only(step.records, ToolExecuting)
    assert [c.tool_version for c in comp] == ["1"]
    assert run_of(step, comp[0].call_id).tool is REFUND_V1
    # After a restart the compensation still finishes on version 1's.
    again = s.restart()
    assert run_of(again, comp[0].call_id).tool is REFUND_V1
    assert "it stays on version 1" in decision_on(again, comp[0].call_id).reason


# -- recovery: the version it started on is gone ------------------------------------------------


def test_with_v1_gone_a_call_is_re_run_on_the_newest_if_its_arguments_still_fit() -> None:
    s = charging(V1)
    s.tools = tools(V2)
    step = s.restart()
    decision = decision_on(step, "c1")
    assert decision.action == "re-run with the same idempotency key (policy keyed) on version 2"
    assert decision.reason == (
        "recorded policy keyed, registered policy keyed; version 1, which it started on, "
        "is no longer registered: version 2, the newest, takes it under the rule for a "
        "changed definition; the tool's definition changed since the call was dispatched "
        f"({V1.definition_hash} -> {V2.definition_hash}); the recorded arguments still fit it"
    )
    rerun = run_of(step, "c1")
    assert rerun.tool is V2 and rerun.executing.tool_version == "2"
    assert rerun.executing.args == {"cents": 5}, "the recorded arguments, as they were"


def test_with_v1_gone_a_call_whose_arguments_no_longer_fit_is_not_re_run() -> None:
    s = charging(V1)
    s.tools = tools(V2, V3_NO_FIT)
    step = s.restart()
    decision = decision_on(step, "c1")
    assert decision.action == "report outcome unknown"
    assert "version 1, which it started on, is no longer registered: version 3" in decision.reason
    assert "the recorded arguments no longer fit it" in decision.reason
    assert not [e for e in step.effects if isinstance(e, RunTool)]
    assert only(step.records, ToolOutcomeUnknown)


def test_with_every_version_gone_the_call_is_reported_unknown() -> None:
    s = charging(V1)
    s.tools = dict(TOOLS)
    step = s.restart()
    assert decision_on(step, "c1").reason == "its tool is no longer registered"


# -- logs older than versions -------------------------------------------------------------------


def test_an_executing_record_written_before_versions_decodes_without_one() -> None:
    s = charging(V1)
    record = s.state.tasks["c1"].executing
    assert record is not None
    body = json.loads(codec.encode(record, 9)[5:])
    assert body.pop("tool_version") == "1", "today's payload names the version"
    assert decode_body(9, body) == attrs.evolve(record, tool_version=None)


def decode_body(seq: int, body: dict[str, Any]) -> Any:
    """Frame a payload as an older build wrote it (format byte, CRC, JSON) and decode it."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    crc = zlib.crc32(raw, zlib.crc32(seq.to_bytes(8, "big")))
    return codec.decode(seq, bytes((codec.FRAME_FORMAT,)) + crc.to_bytes(4, "big") + raw)


def test_a_call_from_before_versions_recovers_on_the_newest_by_the_old_rule() -> None:
    s = charging(V1)
    s.log = [_unversioned(r) for r in s.log]
    s.tools = tools(V1, V2)
    step = s.restart()
    decision = decision_on(step, "c1")
    # No version was recorded: the newest is used, and the words are those of a changed
    # definition alone, as before versions existed.
    assert decision.action == "re-run with the same idempotency key (policy keyed)"
    assert "version" not in decision.reason
    assert f"({V1.definition_hash} -> {V2.definition_hash})" in decision.reason
    assert run_of(step, "c1").tool.version == "2"


def test_a_single_version_recovers_with_the_words_of_before() -> None:
    s = charging(V1)
    step = s.restart()
    decision = decision_on(step, "c1")
    assert decision.action == "re-run with the same idempotency key (policy keyed)"
    assert decision.reason == "recorded policy keyed, registered policy keyed"


def _unversioned(record: Any) -> Any:
    if isinstance(record, ToolExecuting):
        return attrs.evolve(record, tool_version=None)
    return record


def test_decide_exports_the_registered_version_of_a_call() -> None:
    s = charging(V1)
    registered = tools(V1, V2)
    assert decide.registered_for(registered, s.state.tasks["c1"]) is V1
    assert decide.tool_for(registered, s.state.tasks["c1"]) is V1


def test_a_sessions_summary_names_the_version_each_call_runs_on() -> None:
    s = charging(V1)
    s.tools = tools(V1, V2)
    s.restart()
    s.finish_tool("c1", "v1 charged 5")
    s.reply("again", ("c2", "charge", {"cents": 7}))
    versions = {t["call_id"]: t["version"] for t in summarize(s.state)["tasks"]}
    assert versions == {"c1": "1", "c2": "2"}
    assert [t.call_id for t in s.state.pinned_calls()] == ["c2"], "c1 is finished"


async def _close(ctx: perdure.ToolContext, result: str, title: str) -> str:
    return f"closed {result}"


def test_a_compensation_runs_on_the_version_of_the_tool_it_undoes() -> None:
    """The compensation function is declared once; its attempts are recorded on the
    version of the call they undo, not on a version of their own."""
    from perdure.storage.records import ToolExecuting
    from tests.core.sim import Session

    async def open_ticket(ctx: perdure.ToolContext, title: str) -> str:
        return "T-1"

    v2 = perdure.tool(
        name="create_ticket", replay=perdure.ReplayPolicy.KEYED, compensate=_close, version=2
    )(open_ticket)
    s = Session(tools={"create_ticket": v2})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "create_ticket", {"title": "t"}))
    s.finish_tool("c1", output="T-1")
    s.reply("done")
    step, _ = s.command(protocol.Compensate("c1", "k1"))
    undo = [r for r in s.log if isinstance(r, ToolExecuting) and r.call_id == "comp-c1"]
    assert [r.tool_version for r in undo] == ["2"], step
