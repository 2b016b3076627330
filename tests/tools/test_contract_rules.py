"""The tool contract's rules as plain functions: back-off, what is retried, defaults,
approval policies, failure options refused at definition time, and what the model reads.

No runtime: every tool here is declared inside its test, so the mutation campaign
(docs/RELIABILITY.md) can switch a mutant of ``perdure/tools/contract.py`` on under
the declaration too (a module-level ``@tool`` runs at import, before it can).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import types
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import attrs
import pydantic
import pytest

from perdure import ReplayPolicy, RetryableError, RetryPolicy, ToolContext, tool
from perdure.tools.contract import (
    NeedsHuman,
    Tool,
    ToolDefinitionError,
    registry,
    render_result,
)

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


def test_a_call_that_needs_a_person_says_why() -> None:
    needs = NeedsHuman("the card was declined")
    assert needs.reason == str(needs) == "the card was declined"


# -- what a declaration checks, and in which order ---------------------------------------------


def test_only_a_function_can_be_declared_a_tool() -> None:
    declared = tool(_noop)
    for bad in (42, declared):
        with pytest.raises(TypeError) as refused:
            tool(bad)  # type: ignore[call-overload]
        assert str(refused.value) == f"@tool needs a function, not {bad!r}"


def test_a_generator_cannot_be_a_tool() -> None:
    def rows(ctx: ToolContext) -> Iterator[int]:
        yield 1

    async def stream(ctx: ToolContext) -> AsyncIterator[int]:
        yield 1

    for generator in (rows, stream):
        with pytest.raises(ToolDefinitionError) as refused:
            tool(generator)
        assert str(refused.value) == (
            f"tool {generator.__name__!r}: a generator cannot be a tool; return the whole result"
        )


def test_a_bad_version_is_refused_naming_the_tool() -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        tool(name="fetch", version=" ")(_noop)
    assert str(refused.value) == (
        "tool 'fetch': version must be a non-empty string or an integer, not ' '"
    )


def test_the_options_are_checked_before_the_signature() -> None:
    """A declaration wrong in both is told about its options: they are checked first,
    so the refusal does not depend on what else is wrong with the function."""

    async def untyped(ctx: ToolContext, x) -> str:  # type: ignore[no-untyped-def]
        return "ok"

    with pytest.raises(ValueError, match=r"^tool untyped: retry= needs replay=SAFE or KEYED"):
        tool(retry=RetryPolicy())(untyped)
    with pytest.raises(ValueError, match=r"^tool untyped: depends_on_goal=True needs replay=SAFE"):
        tool(depends_on_goal=True)(untyped)
    with pytest.raises(ToolDefinitionError, match="tool 'untyped', parameter 'x': needs a type"):
        tool(untyped)


def test_a_retry_on_a_never_tool_is_refused_with_the_whole_explanation() -> None:
    with pytest.raises(ValueError, match="retry=") as refused:
        tool(retry=RetryPolicy())(_noop)
    assert str(refused.value) == (
        "tool _noop: retry= needs replay=SAFE or KEYED. A NEVER tool is never run again "
        "automatically: a failed attempt may still have had its effect. Make the tool "
        "idempotent through ctx.idempotency_key and declare replay=KEYED, or keep NEVER and "
        "raise perdure.NeedsHuman so that a person decides whether to retry (a reconcile= "
        "answering not_applied also lets recovery run it once more)."
    )


def test_a_heartbeat_timeout_under_a_second_is_allowed() -> None:
    assert tool(replay=ReplayPolicy.SAFE, heartbeat_timeout=0.5)(_noop).heartbeat_timeout == 0.5


def test_depends_on_goal_is_for_safe_tools_only_and_is_said_by_name() -> None:
    safe = tool(replay=ReplayPolicy.SAFE, depends_on_goal=True)(_noop)
    assert safe.depends_on_goal is True
    assert tool(replay=ReplayPolicy.SAFE)(_noop).depends_on_goal is False
    with pytest.raises(ValueError, match="depends_on_goal") as refused:
        tool(replay=ReplayPolicy.KEYED, depends_on_goal=True)(_noop)
    assert str(refused.value) == (
        "tool _noop: depends_on_goal=True needs replay=SAFE: the call is run again under a "
        "revised request, which only a call without side effects may be"
    )
    with pytest.raises(TypeError) as kind:
        tool(replay=ReplayPolicy.SAFE, depends_on_goal="yes")(_noop)  # type: ignore[call-overload]
    assert str(kind.value) == "tool _noop: depends_on_goal must be True or False"


def test_an_evolved_tool_is_held_to_every_rule_of_a_declaration() -> None:
    """``attrs.evolve`` builds a Tool without ``@tool``: the Tool checks its options
    itself, naming the tool, so an evolved copy cannot carry what a declaration could not."""
    never = tool(replay=ReplayPolicy.NEVER)(_noop)
    with pytest.raises(ValueError, match=r"^tool _noop: retry= needs replay=SAFE or KEYED"):
        attrs.evolve(never, retry=RetryPolicy())
    with pytest.raises(ValueError, match="heartbeat_timeout") as beat:
        attrs.evolve(never, heartbeat_timeout=-1.0)
    assert str(beat.value) == (
        "tool _noop: heartbeat_timeout must be a number of seconds > 0, not -1.0"
    )
    with pytest.raises(ValueError, match=r"^tool _noop: depends_on_goal=True needs replay=SAFE"):
        attrs.evolve(never, depends_on_goal=True)
    safe = tool(replay=ReplayPolicy.SAFE)(_noop)
    assert attrs.evolve(safe, depends_on_goal=True).depends_on_goal is True


# -- what a declaration records -----------------------------------------------------------------


def test_each_option_of_a_declaration_is_kept_on_the_tool() -> None:
    async def undo(ctx: ToolContext, result: str, **args: Any) -> None:
        """Put it back."""

    declared = tool(
        replay=ReplayPolicy.SAFE,
        compensate=undo,
        compensate_automatically=True,
        changes_workspace=True,
        unknown_outcome="ask_person",
        runs_on="asyncio",
    )(_noop)
    assert declared.compensate_automatically is True
    assert (declared.changes_workspace, declared.workspace_only) == (True, False)
    assert declared.unknown_outcome == "ask_person"
    assert declared.runs_on == "asyncio"
    # Files that are a tool's only effect are files it changes.
    only_files = tool(workspace_only=True)(_noop)
    assert (only_files.changes_workspace, only_files.workspace_only) == (True, True)
    plain = tool(_noop)
    assert plain.compensate_automatically is False
    assert (plain.changes_workspace, plain.workspace_only) == (False, False)
    assert plain.unknown_outcome == "tell_model"


def test_a_plain_def_runs_in_a_thread_whatever_loop_is_named() -> None:
    def count(n: int) -> int:
        return n

    assert tool(count).runs_on == "trio"
    assert tool(runs_on="asyncio")(count).runs_on == "trio"


def _coroutine_function_in(namespace: dict[str, Any]) -> Any:
    """An ``async def`` whose module's globals are ``namespace`` (and the builtins)."""
    module: dict[str, Any] = {"__name__": "app.tools", **namespace}
    exec("async def work() -> str:\n    return 'done'\n", module)
    return module["work"]


def test_the_loop_of_a_coroutine_comes_from_what_its_module_imports() -> None:
    """trio code is a module that imports trio (``import trio``, ``import trio.lowlevel``)
    or something of trio's (``from trio import sleep``); any other is asyncio code."""
    import trio
    import trio.lowlevel

    trio_code = [
        {"trio": trio},
        {"lowlevel": trio.lowlevel},
        {"sleep": trio.sleep},
        {"current_trio_token": trio.lowlevel.current_trio_token},
    ]
    for namespace in trio_code:
        assert tool(_coroutine_function_in(namespace)).runs_on == "trio", namespace
    assert tool(_coroutine_function_in({"asyncio": asyncio, "json": json})).runs_on == "asyncio"
    assert tool(_coroutine_function_in({})).runs_on == "asyncio"
    # A function that is itself named trio is not trio's; a module counts by its name
    # only, not by what it holds; a module without a name is not trio.
    named_trio = _coroutine_function_in({})
    exec("def trio():\n    return None\n", named_trio.__globals__)
    assert tool(named_trio).runs_on == "asyncio"
    holder = types.ModuleType("app.helpers")
    holder.__module__ = "trio"
    nameless = types.ModuleType("app.nameless")
    del nameless.__name__
    assert tool(_coroutine_function_in({"h": holder, "n": nameless})).runs_on == "asyncio"


def test_a_declared_loop_wins_and_only_trio_and_asyncio_are_loops() -> None:
    import trio

    trio_code = _coroutine_function_in({"trio": trio})
    asyncio_code = _coroutine_function_in({"asyncio": asyncio})
    assert tool(runs_on="asyncio")(trio_code).runs_on == "asyncio"
    assert tool(runs_on="trio")(asyncio_code).runs_on == "trio"
    with pytest.raises(ValueError, match="runs_on") as refused:
        tool(runs_on="curio")(asyncio_code)  # type: ignore[call-overload]
    assert str(refused.value) == "runs_on must be 'trio' or 'asyncio', not 'curio'"


_POSITIVE = pydantic.Field(gt=0)


def test_param_types_take_off_an_outer_annotated_and_keep_the_rest_as_declared() -> None:
    async def pick(
        ctx: ToolContext,
        ids: list[Annotated[int, _POSITIVE]],
        code: Annotated[str, pydantic.Field(description="the code")],
    ) -> str:
        return code

    assert tool(pick).param_types == {"ids": list[Annotated[int, _POSITIVE]], "code": str}


def test_effective_args_add_only_defaults_that_are_json() -> None:
    """A default the model could not have written (a date) is left to the function."""
    epoch = datetime.date(1970, 1, 1)

    async def stamp(
        ctx: ToolContext, note: str | None = None, since: datetime.date = epoch, n: int = 1
    ) -> str:
        return str(since)

    assert tool(stamp).effective_args({}) == {"note": None, "n": 1}


def test_definition_hashes_do_not_change_between_releases() -> None:
    """A call's log record holds its tool's definition hash, and recovery after a
    restart compares it with the tool registered then: the same declaration must hash
    the same after an upgrade, or its interrupted calls would be taken for calls of a
    changed tool. (A deliberate change of these values is a change of the log's
    meaning, for the CHANGELOG.)"""

    async def lookup(ctx: ToolContext, query: str, limit: int = 3) -> str:
        """Look something up."""
        return query

    async def book(ctx: ToolContext, when: datetime.date) -> str:
        return "booked"

    async def undo(ctx: ToolContext, result: str) -> None: ...

    assert tool(lookup).definition_hash == "02769e53e62e75e2"
    assert tool(requires_approval=lambda args: True)(lookup).definition_hash == "560afddda2808f2d"
    safe_v2 = tool(requires_approval=True, replay=ReplayPolicy.SAFE, version=2)(lookup)
    assert safe_v2.definition_hash == "7ed07397e45a8f7c"
    compensation = tool(compensate=undo)(book).compensation
    assert compensation is not None and compensation.definition_hash == "165afcf0eefb0ed2"


def test_a_plain_compensation_takes_any_arguments_and_says_what_it_undoes() -> None:
    async def undo(ctx: ToolContext, result: str, **args: Any) -> None: ...

    async def book(ctx: ToolContext, room: str) -> str:
        return room

    compensation = tool(compensate=undo)(book).compensation
    assert compensation is not None
    assert compensation.input_schema == {"type": "object"}
    assert compensation.description == "undo book"  # no docstring: what it undoes


# -- several versions side by side --------------------------------------------------------------


def test_registering_a_registrys_output_again_keeps_each_version_once() -> None:
    async def fetch(ctx: ToolContext) -> str:
        return "ok"

    v1, v2, v3 = (tool(version=v)(fetch) for v in ("1", "2", "3"))
    newest = registry([*registry([v1, v2]).values(), v3])["fetch"]
    assert newest.versions == ("1", "2", "3")
    assert [t.earlier for t in newest.earlier] == [(), ()]  # no version nested in another


def test_the_newest_version_finds_each_registered_version() -> None:
    async def fetch(ctx: ToolContext) -> str:
        return "ok"

    newest = registry([tool(version=v)(fetch) for v in ("2", "10", "1")])["fetch"]
    assert newest.version == "10"  # compared as numbers
    assert newest.at_version("10") is newest
    assert [newest.at_version(v).version for v in ("1", "2")] == ["1", "2"]  # type: ignore[union-attr]
    assert newest.at_version("3") is None


def test_versions_side_by_side_must_be_distinct_numbers() -> None:
    async def fetch(ctx: ToolContext) -> str:
        return "ok"

    with pytest.raises(ValueError, match="two tools") as twice:
        registry([tool(version="1")(fetch), tool(version="1")(fetch)])
    assert str(twice.value) == (
        "two tools are named 'fetch' with version '1': versions of one tool registered "
        "side by side need distinct version="
    )
    with pytest.raises(ToolDefinitionError) as word:
        registry([tool(version="1")(fetch), tool(version="beta")(fetch)])
    assert str(word.value) == (
        "tool 'fetch' is registered in several versions, and 'beta' is not a version "
        "number: versions registered side by side must be numbers such as 2 or 2.1, so "
        "that the newest is clear"
    )


def test_a_persons_answer_pydantic_cannot_serialize_keeps_its_letters() -> None:
    assert render_result({"name": "Zoë", "at": math}) == (
        '{"name": "Zoë", "at": "' + str(math) + '"}'
    )
