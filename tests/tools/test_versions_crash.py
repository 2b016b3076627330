"""Versioned tools across a real crash: a call finishes on the version it started on.

A child runtime with version 1 of ``charge`` is SIGKILLed once the first call's
``executing`` record is durable (``PERDURE_FAULT=tool.before:charge``), before the
tool runs. The log is copied, and restarted twice:

* with versions 1 and 2 registered: the interrupted call is re-run on version 1 (the
  ledger holds version 1's effect, not version 2's), the next call the model makes
  runs on version 2, and the recovery decision names version 1;
* with version 2 alone: the rule for a changed definition applies (the recorded
  arguments still fit version 2, so it re-runs there), and the decision says that
  version 1 is no longer registered.

``perdure tools --log`` is run on the real log in between and after: it lists the
call pinned to version 1, and then that version 1 can be removed. In process: the
model is offered one ``charge``, the newest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure.providers.base import Emit, ModelReply, ModelRequest
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import RecoveryDecision, ToolExecuting
from tests.support.checker import assert_sound, read_log
from tests.support.ledger_tools import read_ledger
from tests.support.procs import ROOT, run_child
from tests.tools.versioned_tools import BOTH

SCRIPT = [
    {"text": "charging", "tool_uses": [{"name": "charge", "input": {"cents": 5}}]},
    {"text": "charging again", "tool_uses": [{"name": "charge", "input": {"cents": 7}}]},
    {"text": "done"},
]
MODULE = "tests.tools.versioned_tools"


def perdure_tools(log: str, tools: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PERDURE_FAULT"}
    env["PYTHONPATH"] = str(ROOT)
    command = ["tools", "--tools", f"{MODULE}:{tools}", "--log", log, *extra]
    return subprocess.run(
        [sys.executable, "-m", "perdure.cli", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def recovery_of(plan: dict[str, Any], call_id: str) -> RecoveryDecision:
    return next(
        c.record
        for c in read_log(Path(plan["log"]))
        if isinstance(c.record, RecoveryDecision) and c.record.subject == call_id
    )


def effects(plan: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [
        (e["call_id"], e["attempt"], e["version"])
        for e in read_ledger(Path(plan["workspace"]))
        if e["event"] == "effect"
    ]


def test_a_call_in_flight_on_v1_finishes_on_v1_and_on_the_newest_once_v1_is_gone(
    make_plan: Any, tmp_path: Path
) -> None:
    both = make_plan(SCRIPT, tools=["charge"], extra_tools=[f"{MODULE}:BOTH"])
    crashed = run_child({**both, "extra_tools": [f"{MODULE}:V1"]}, fault="tool.before:charge")
    assert crashed.killed, crashed.stderr
    (executing,) = [
        c.record for c in read_log(Path(both["log"])) if isinstance(c.record, ToolExecuting)
    ]
    call = executing.call_id
    assert executing.tool_version == "1" and not effects(both), "killed before the tool ran"

    # The same crashed log, for the restart without version 1.
    (tmp_path / "ws2").mkdir()
    v2_only = {
        **both,
        "log": str(tmp_path / "log2"),
        "workspace": str(tmp_path / "ws2"),
        "extra_tools": [f"{MODULE}:V2"],
    }
    shutil.copytree(both["log"], v2_only["log"])

    # perdure tools on the real log: the call is pinned to version 1.
    listed = perdure_tools(both["log"], "BOTH", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {(r["name"], r["version"]): r for r in json.loads(listed.stdout)}
    assert rows["charge", "1"]["newest"] is False and rows["charge", "2"]["newest"] is True
    assert rows["charge", "1"]["pinned"] == [f"s1/{call} (executing)"]
    text = perdure_tools(both["log"], "BOTH").stdout
    assert f"charge version 1: s1/{call} (executing)" in text

    # Restart with versions 1 and 2: the call finishes on version 1, the next on version 2.
    done = run_child(both)
    assert done.outcome("s1")["status"] == "completed"
    assert_sound(both)
    second = next(e for e in effects(both) if e[0] != call)[0]
    assert effects(both) == [(call, 2, "1"), (second, 1, "2")]
    decision = recovery_of(both, call)
    assert decision.action == "re-run with the same idempotency key (policy keyed) on version 1"
    assert "it stays on version 1, which it started on (registered: 1, 2)" in decision.reason
    after = perdure_tools(both["log"], "BOTH")
    assert "charge version 1: none; it can be removed" in after.stdout, after.stdout

    # Restart with version 2 alone: today's rule for a changed definition, said so.
    gone = perdure_tools(v2_only["log"], "V2").stdout
    assert f"charge version 1: s1/{call} (executing) (not registered here: recovery" in gone
    alone = run_child(v2_only)
    assert alone.outcome("s1")["status"] == "completed"
    assert_sound(v2_only)
    assert effects(v2_only)[0] == (call, 2, "2")
    decision = recovery_of(v2_only, call)
    assert decision.action == "re-run with the same idempotency key (policy keyed) on version 2"
    assert (
        "version 1, which it started on, is no longer registered: version 2, the newest, "
        "takes it under the rule for a changed definition; the tool's definition changed"
    ) in decision.reason
    assert decision.reason.endswith("the recorded arguments still fit it")


class Offered(ScriptedProvider):
    """A scripted model that keeps the tool definitions each request offered it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offered: list[list[tuple[str, list[str]]]] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        self.offered.append([(t.name, sorted(t.input_schema["properties"])) for t in request.tools])
        return await super().complete(request, emit)


async def test_the_model_is_offered_the_newest_version_alone(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    script = Offered([Reply(text="charging", tool_uses=[ToolUse("charge", {"cents": 3})]), Reply()])
    async with perdure.open_runtime(
        tmp_path / "log", provider=script, tools=BOTH, workspace=tmp_path / "ws"
    ) as rt:
        assert rt.tools["charge"].versions == ("1", "2")
        await rt.create_session("s1")
        await rt.submit("s1", "go", request_id="r1")
        with trio.fail_after(20):
            await rt.wait_idle("s1")
    assert script.offered == [[("charge", ["cents", "currency"])]] * 2
    assert [e["version"] for e in read_ledger(tmp_path / "ws") if e["event"] == "effect"] == ["2"]


async def test_conformance_runs_the_version_under_test_alone(tmp_path: Path) -> None:
    """``perdure conformance`` over a list holding two versions of one tool checks each
    on its own: its child registers only the version under test (else the call would
    run on the newest whatever version the report names)."""
    from perdure.conformance import _child_main, _plan
    from tests.tools.versioned_tools import charge_v1

    (tmp_path / "ws").mkdir()
    plan = _plan(tmp_path, f"{MODULE}:BOTH", charge_v1, {"cents": 1})
    summary = await _child_main(plan)
    assert summary["result"] == "completed"
    assert [e["version"] for e in read_ledger(tmp_path / "ws") if e["event"] == "effect"] == ["1"]
