"""The tool contract's rules as plain functions: back-off, what is retried, defaults,
approval policies, failure options refused at definition time, and what the model reads.

No runtime: every tool here is declared inside its test, so the mutation campaign
(docs/RELIABILITY.md) can switch a mutant of ``perdure/tools/contract.py`` on under
the declaration too (a module-level ``@tool`` runs at import, before it can).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from perdure import ReplayPolicy, RetryableError, RetryPolicy, ToolContext, tool
from perdure.tools.contract import Tool, render_result

# -- back-off and what is retried ----------------------------------------------------------


def test_the_delay_doubles_from_initial_up_to_the_cap_with_jitter_between_half_and_all() -> None:
    policy = RetryPolicy(max_attempts=9, initial=2.0, multiplier=3.0, max_interval=50.0)
    assert [policy.delay(n, jitter=1.0) for n in (1, 2, 3, 4)] == [2.0, 6.0, 18.0, 50.0]
    assert policy.delay(1, jitter=0.0) == 1.0  # half of the ceiling
    assert policy.delay(2, jitter=0.5) == 6.0 * 0.75
    assert policy.delay(10**6, jitter=1.0) == 50.0  # a huge attempt number: still the cap
    assert policy.delay(700, jitter=1.0) == 50.0  # 3.0 ** 699 overflows a float: the cap
    whole = RetryPolicy(max_attempts=2000, multiplier=3, max_interval=9.0)  # an int multiplier
    assert whole.delay(1500, jitter=1.0) == 9.0


def test_a_servers_retry_after_is_a_floor_of_the_delay_not_a_replacement() -> None:
    policy = RetryPolicy(initial=1.0)
    assert policy.delay(1, jitter=1.0, retry_after=30.0) == 30.0
    assert policy.delay(1, jitter=1.0, retry_after=0.1) == 1.0


class Flaky(ConnectionError):
    pass


def test_retried_are_retryable_errors_and_the_listed_exceptions_with_their_subclasses() -> None:
    policy = RetryPolicy(retry_on=(ConnectionError,))
    assert policy.retries(RetryableError)
    assert policy.retries(ConnectionError)
    assert policy.retries(Flaky)
    assert not policy.retries(ValueError)
    assert not RetryPolicy().retries(ConnectionError)  # nothing listed: only RetryableError


def test_the_defaults_of_a_retry_policy() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial, policy.multiplier, policy.max_interval) == (
        3,
        1.0,
        2.0,
        60.0,
    )
    assert policy.retry_on == () and policy.retry_timeouts is True


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_attempts": True}, "RetryPolicy.max_attempts must be an integer >= 1, not True"),
        ({"max_attempts": 0}, "RetryPolicy.max_attempts must be an integer >= 1, not 0"),
        ({"initial": True}, "RetryPolicy.initial must be a number > 0, not True"),
        ({"initial": "1"}, "RetryPolicy.initial must be a number > 0, not '1'"),
        ({"initial": -1}, "RetryPolicy.initial must be a number > 0, not -1"),
        ({"initial": math.inf}, "RetryPolicy.initial must be finite, not inf"),
        ({"max_interval": 0.0}, "RetryPolicy.max_interval must be a number > 0, not 0.0"),
        ({"multiplier": 0.5}, "RetryPolicy.multiplier must be a number >= 1, not 0.5"),
        ({"multiplier": False}, "RetryPolicy.multiplier must be a number >= 1, not False"),
        ({"multiplier": "2"}, "RetryPolicy.multiplier must be a number >= 1, not '2'"),
        ({"multiplier": math.inf}, "RetryPolicy.multiplier must be finite, not inf"),
        ({"multiplier": math.nan}, "RetryPolicy.multiplier must be a number >= 1, not nan"),
    ],
)
def test_a_retry_policy_refuses_each_bad_value_by_name(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=r"^RetryPolicy\.") as refused:
        RetryPolicy(**options)
    assert str(refused.value) == words


def test_retry_on_must_be_a_tuple_of_exception_classes() -> None:
    for bad in ([ValueError], (ValueError, int), (KeyboardInterrupt,), ("ValueError",)):
        with pytest.raises(TypeError) as refused:
            RetryPolicy(retry_on=bad)  # type: ignore[arg-type]
        assert str(refused.value) == (
            f"RetryPolicy.retry_on must be a tuple of exception classes, not {bad!r}"
        )
    assert RetryPolicy(retry_on=(OSError, ValueError)).retry_on == (OSError, ValueError)
    assert RetryPolicy(multiplier=1).multiplier == 1  # exactly 1 is allowed: no growth


# -- failure options, refused when the tool is declared ------------------------------------


async def _noop(ctx: ToolContext) -> str:
    return "ok"


def test_retry_is_refused_for_a_never_tool_and_must_be_a_policy() -> None:
    with pytest.raises(ValueError, match="needs replay=SAFE or KEYED") as never:
        tool(replay=ReplayPolicy.NEVER, retry=RetryPolicy())(_noop)
    assert str(never.value).startswith("tool _noop: retry= needs replay=SAFE or KEYED.")
    assert "raise perdure.NeedsHuman" in str(never.value)
    with pytest.raises(TypeError) as kind:
        tool(replay=ReplayPolicy.SAFE, retry={"max_attempts": 2})(_noop)  # type: ignore[arg-type]
    assert str(kind.value) == (
        "tool _noop: retry must be a perdure.RetryPolicy, not {'max_attempts': 2}"
    )
    for replay in (ReplayPolicy.SAFE, ReplayPolicy.KEYED):
        assert tool(replay=replay, retry=RetryPolicy())(_noop).retry == RetryPolicy()


def test_evolving_a_tool_is_held_to_the_same_failure_rules() -> None:
    safe = tool(replay=ReplayPolicy.NEVER)(_noop)
    with pytest.raises(ValueError, match="retry= needs replay=SAFE or KEYED"):
        attrs.evolve(safe, retry=RetryPolicy())


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "5"])
def test_a_heartbeat_timeout_must_be_a_positive_finite_number(bad: Any) -> None:
    with pytest.raises(ValueError, match="heartbeat_timeout") as refused:
        tool(replay=ReplayPolicy.SAFE, heartbeat_timeout=bad)(_noop)
    assert str(refused.value) == (
        f"tool _noop: heartbeat_timeout must be a number of seconds > 0, not {bad!r}"
    )


def test_a_heartbeat_timeout_is_kept_in_seconds_as_a_float() -> None:
    declared = tool(replay=ReplayPolicy.SAFE, heartbeat_timeout=5)(_noop)
    assert declared.heartbeat_timeout == 5.0 and isinstance(declared.heartbeat_timeout, float)
    assert tool(_noop).heartbeat_timeout is None


def test_needs_human_on_must_be_exception_classes() -> None:
    with pytest.raises(TypeError) as refused:
        tool(needs_human_on=(PermissionError, "no"))(_noop)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "tool _noop: needs_human_on must be a tuple of exception classes, "
        "not (<class 'PermissionError'>, 'no')"
    )
    assert tool(needs_human_on=(PermissionError,))(_noop).needs_human_on == (PermissionError,)


# -- what a declaration gives --------------------------------------------------------------


def test_a_declared_tool_carries_its_options_and_sensible_defaults() -> None:
    async def lookup(ctx: ToolContext, query: str, limit: int = 3) -> str:
        """Look an order up.

        Read-only."""
        return query

    plain = tool(lookup)
    assert plain.name == "lookup"
    assert plain.description == "Look an order up.\n\nRead-only."
    assert plain.replay is ReplayPolicy.NEVER  # a tool must opt in to being re-run
    assert plain.cancellable is False and plain.terminates is False
    assert plain.requires_approval is False and plain.timeout is None
    assert plain.takes_context is True and plain.version == "1"
    assert plain.param_types == {"query": str, "limit": int}
    safe = tool(replay=ReplayPolicy.SAFE, name="find", description="Find.", timeout=2.5)(lookup)
    assert (safe.name, safe.description, safe.timeout) == ("find", "Find.", 2.5)
    assert safe.cancellable is True  # SAFE tools may be stopped mid-run by default
    assert tool(replay=ReplayPolicy.SAFE, cancellable=False)(lookup).cancellable is False
    assert tool(terminates=True, version="2")(lookup).terminates is True
    undocumented = tool(name="bare")(_noop)
    assert undocumented.description == "bare"  # no docstring: the name describes it


def test_effective_args_add_json_defaults_and_approval_sees_them() -> None:
    seen: list[dict[str, Any]] = []

    def policy(args: dict[str, Any]) -> bool:
        seen.append(args)
        return args["amount"] > 100

    async def pay(ctx: ToolContext, to: str, amount: int = 500, note: str | None = None) -> str:
        return to

    paying = tool(requires_approval=policy)(pay)
    assert paying.effective_args({"to": "a"}) == {"to": "a", "amount": 500, "note": None}
    assert paying.effective_args({"to": "a", "amount": 1}) == {"to": "a", "amount": 1, "note": None}
    assert paying.needs_approval({"to": "a"}) is True  # the default 500 was seen
    assert paying.needs_approval({"to": "a", "amount": 5}) is False
    assert seen[0] == {"to": "a", "amount": 500, "note": None}

    def broken(args: dict[str, Any]) -> bool:
        raise RuntimeError("policy bug")

    assert tool(requires_approval=broken)(pay).needs_approval({"to": "a"}) is True  # closed
    assert tool(requires_approval=True)(pay).needs_approval({"to": "a"}) is True
    assert tool(pay).needs_approval({"to": "a"}) is False


def test_validate_refuses_non_objects_and_defers_to_a_tools_own_checker() -> None:
    async def echo(ctx: ToolContext, text: str) -> str:
        return text

    echoing = tool(echo)
    assert echoing.validate([1]) == ["the arguments must be a JSON object, got list"]
    assert echoing.validate({"text": "hi"}) == []
    assert echoing.validate({}) != []
    own = attrs.evolve(echoing, check_args=lambda args: [f"saw {sorted(args)}"])
    assert own.validate({"x": 1}) == ["saw ['x']"]


async def test_invoke_passes_the_context_only_to_a_tool_that_takes_one() -> None:
    async def with_ctx(ctx: ToolContext, n: int) -> tuple[Any, int]:
        return ctx, n

    async def without(n: int) -> int:
        return n * 2

    ctx = _context()
    assert await tool(with_ctx).invoke(ctx, {"n": 3}) == (ctx, 3)
    assert await tool(without).invoke(ctx, {"n": 3}) == 6
    assert tool(without).takes_context is False


def test_a_plain_compensation_becomes_a_never_tool_of_its_own() -> None:
    async def undo(ctx: ToolContext, result: str, **args: Any) -> None:
        """Cancel the booking."""

    async def book(ctx: ToolContext, room: str) -> str:
        return room

    booking = tool(compensate=undo, timeout=4.0)(book)
    comp = booking.compensation
    assert isinstance(comp, Tool)
    assert comp.name == "book.compensate" and comp.replay is ReplayPolicy.NEVER
    assert comp.description == "Cancel the booking." and comp.timeout == 4.0
    assert comp.requires_approval is False and comp.definition_hash
    with pytest.raises(TypeError) as refused:
        tool(compensate=lambda ctx, result: None)(book)  # type: ignore[arg-type]
    assert str(refused.value) == "the compensation of book must be an async function or a @tool"


# -- what the model reads --------------------------------------------------------------------


@attrs.frozen
class Order:
    number: int
    status: str


def test_render_result_gives_the_model_text() -> None:
    assert render_result("as is") == "as is"
    assert render_result(None) == ""
    assert render_result({"ü": 1}) == '{"ü": 1}'  # not escaped to ASCII
    assert render_result(Order(7, "sent")) == '{"number": 7, "status": "sent"}'
    assert render_result([1, 2.5, True]) == "[1, 2.5, true]"
    # A person's answer (rt.resolve "skip") is never refused: what pydantic cannot
    # serialize is shown as its str(), inside the JSON.
    assert render_result({"when": math}) == '{"when": "' + str(math) + '"}'


# -- what a running tool is handed ------------------------------------------------------


def _context(**hooks: Any) -> ToolContext:
    return ToolContext(
        idempotency_key="k-1", call_id="c-1", session_id="s", attempt=1, workspace=None, **hooks
    )


def test_progress_emits_an_ephemeral_event_naming_the_call() -> None:
    emitted: list[tuple[str, dict[str, Any]]] = []
    ctx = _context(emit=lambda kind, data: emitted.append((kind, data)))
    ctx.progress("half way", done=5, total=10)
    assert emitted == [
        ("tool_progress", {"call_id": "c-1", "message": "half way", "done": 5, "total": 10})
    ]


def test_heartbeat_hands_json_details_on_and_refuses_anything_else_by_name() -> None:
    beats: list[Any] = []
    ctx = _context(beat=beats.append)
    ctx.heartbeat({"rows": 3})
    ctx.heartbeat()
    assert beats == [{"rows": 3}, None]
    for bad in ({"at": object()}, float("nan"), {1, 2}):
        with pytest.raises(TypeError, match=r"ctx\.heartbeat\(details\) of call c-1 needs a JSON"):
            ctx.heartbeat(bad)
    assert beats == [{"rows": 3}, None]  # nothing refused was passed on


def test_a_context_without_hooks_is_quiet_and_has_no_sub_agents() -> None:
    ctx = _context()
    ctx.progress("nobody listens")
    ctx.heartbeat([1, 2])
    assert ctx.last_heartbeat is None


async def test_run_agent_needs_a_runtime_and_passes_its_arguments_through() -> None:
    with pytest.raises(RuntimeError, match=r"^run_agent needs a tool run by a perdure runtime$"):
        await _context().run_agent("summarise")
    asked: list[tuple[str, str | None, list[str] | None]] = []

    async def agents(task: str, system: str | None, tools: list[str] | None) -> str:
        asked.append((task, system, tools))
        return "done"

    ctx = _context(agents=agents)
    assert await ctx.run_agent("summarise") == "done"
    assert await ctx.run_agent("look up", system="be brief", tools=("search",)) == "done"
    assert asked == [("summarise", None, None), ("look up", "be brief", ["search"])]


def test_reconciled_says_what_recovery_found() -> None:
    from perdure.tools.contract import Reconciled

    assert Reconciled.applied({"id": 7}) == Reconciled("applied", {"id": 7}, "")
    assert Reconciled.not_applied() == Reconciled("not_applied", None, "")
    assert Reconciled.unknown() == Reconciled("unknown", None, "")
    assert Reconciled.unknown("the API is down") == Reconciled("unknown", None, "the API is down")


def test_the_failures_a_tool_raises_keep_their_words() -> None:
    from perdure.tools.contract import OutcomeUnknown

    unknown = OutcomeUnknown("connection lost after the request was sent")
    assert unknown.reason == str(unknown) == "connection lost after the request was sent"
    plain = RetryableError("503")
    assert (plain.message, plain.retry_after, str(plain)) == ("503", None, "503")
    later = RetryableError("429", retry_after=2)
    assert later.retry_after == 2.0 and isinstance(later.retry_after, float)
    assert RetryableError("x", retry_after=0).retry_after == 0.0
    for bad in (-1, math.inf, math.nan, "2", True):
        with pytest.raises(ValueError, match="retry_after must be a number of seconds >= 0"):
            RetryableError("x", retry_after=bad)
