"""The tool contract: what a tool declares, and what the runtime hands it.

A tool is a function wrapped by ``@tool``: an ``async def`` runs on the runtime's
loop, a plain ``def`` in a worker thread; its parameters, their JSON schema and the
check of a model's arguments come from pydantic (``perdure.tools.params``). It
declares whether it may be replayed after a crash (``ReplayPolicy``), whether a
human must approve each call, a timeout, and optionally a ``reconcile`` function
that tells recovery whether an interrupted call really took effect. The runtime
passes a ``ToolContext`` carrying an idempotency key that is stable across restarts
and re-runs of the same call.

When a call fails, the tool says how (see "When tools fail" in docs/TOOLS.md): a
transient failure (``RetryableError``, or an exception its ``RetryPolicy`` lists)
is retried with back-off, for SAFE and KEYED tools only; a failure that needs a
person (``NeedsHuman``) waits durably for ``rt.resolve``; a long tool reports
``ctx.heartbeat(details)`` so a re-run resumes from ``ctx.last_heartbeat``.

This module is a leaf: it imports nothing of perdure's runtime.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import json
import math
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import attrs
import trio
import trio.lowlevel
from attrs import field, frozen

from perdure.backoff import Backoff
from perdure.tools.params import JsonSchema, Parameters, check_name, describe, render
from perdure.tools.params import ResultNotSerializable as ResultNotSerializable
from perdure.tools.params import ToolDefinitionError as ToolDefinitionError


class ReplayPolicy(enum.Enum):
    """May the runtime run a call again when it cannot know whether it took effect?"""

    SAFE = "safe"  # read-only or naturally idempotent: re-run on restart
    KEYED = "keyed"  # idempotent through ctx.idempotency_key: re-run with the same key
    NEVER = "never"  # never re-run automatically; reconcile, or report the outcome unknown

    @property
    def replayable(self) -> bool:
        return self is not ReplayPolicy.NEVER


HostRunner = Callable[[Callable[[], Coroutine[Any, Any, Any]]], Awaitable[Any]]

Loop = Literal["trio", "asyncio"]
# Who hears of an outcome perdure cannot know: the model (the default), or a person.
UnknownOutcome = Literal["tell_model", "ask_person"]
UNKNOWN_OUTCOME_CHOICES: tuple[UnknownOutcome, ...] = ("tell_model", "ask_person")


class NeedsAsyncio(RuntimeError):
    """A tool awaited asyncio code while running on the runtime's trio loop.

    Not the tool's own failure: the runtime it was given to cannot run it.
    """

    def __init__(self, tool_name: str, cause: BaseException) -> None:
        super().__init__(
            f"tool {tool_name!r} needs a running asyncio loop ({cause}), and this runtime "
            "runs on trio: open it with perdure.embed.open_runtime inside your asyncio "
            "application, which runs such a tool's coroutine on the application's loop"
        )
        self.tool_name = tool_name


def _needs_asyncio(exc: BaseException) -> bool:
    """Whether ``exc`` is how asyncio code fails on a trio loop (no loop to find, or a
    Future yielded to trio)."""
    text = str(exc)
    return (isinstance(exc, RuntimeError) and "no running event loop" in text) or (
        isinstance(exc, TypeError) and "unrecognized yield message" in text
    )


@frozen(kw_only=True)
class ToolContext:
    """What a running tool knows about its call."""

    idempotency_key: str  # same for every attempt of this call, across restarts
    call_id: str
    session_id: str
    attempt: int  # 1 for the first execution, higher for retries and re-runs after recovery
    workspace: Path | None
    # The details of the last heartbeat committed for this call by an earlier attempt
    # (None if there was none): where a re-run or a retry may resume.
    last_heartbeat: Any = None
    _emit: Callable[[str, dict[str, Any]], None] = field(
        default=lambda kind, data: None, alias="emit", repr=False
    )
    _beat: Callable[[Any], None] = field(default=lambda details: None, alias="beat", repr=False)
    # Runs a sub-agent (a child session) for this call; given by the runtime.
    _agents: Callable[[str, str | None, list[str] | None], Awaitable[str]] | None = field(
        default=None, alias="agents", repr=False
    )
    # The runtime's bound on the worker threads of plain ``def`` tools (None: trio's default).
    _threads: trio.CapacityLimiter | None = field(default=None, alias="threads", repr=False)
    # Under perdure.embed: awaits a coroutine function on the host's asyncio loop.
    _host: HostRunner | None = field(default=None, alias="host", repr=False)

    async def run_agent(
        self, task: str, *, system: str | None = None, tools: Iterable[str] | None = None
    ) -> str:
        """Run a sub-agent on ``task`` and return its final answer.

        The sub-agent is a durable child session (system prompt ``system``, the
        runtime's tools or only those named in ``tools``) whose id derives from this
        call's idempotency key and the order of ``run_agent`` calls within it: a re-run
        of the call (after a crash, a retry) finds the same child, never a second one,
        and waits for its result. Declare the calling tool KEYED (``agent_tool`` does)
        so that recovery re-runs it. Cancelling the call (a cancel, a revision) cancels
        the child; pausing the parent pauses it. The parent's log links this call to
        the child (``AgentStarted``), so the parent's stream references it.
        A child that does not complete raises ``RuntimeError`` (the tool's error).
        """
        if self._agents is None:
            raise RuntimeError("run_agent needs a tool run by a perdure runtime")
        return await self._agents(task, system, None if tools is None else list(tools))

    def progress(self, message: str, **data: Any) -> None:
        """Publish an ephemeral progress event on the session's stream (never stored)."""
        self._emit("tool_progress", {"call_id": self.call_id, "message": message, **data})

    def heartbeat(self, details: Any = None) -> None:
        """Say the tool is alive, and how far it got (``details``: any JSON value).

        Cheap enough to call for every item: the runtime commits the latest details
        about once a second (and the last ones before the call's result), so a re-run
        after a crash or a retry receives them as ``ctx.last_heartbeat``. A tool with
        ``heartbeat_timeout=`` that stays silent that long is treated as hung. May be
        called from a worker thread started by the tool (``trio.to_thread``).
        """
        try:
            json.dumps(details, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"ctx.heartbeat(details) of call {self.call_id} needs a JSON value "
                f"(dict, list, str, number, bool or None): {exc}"
            ) from None
        self._beat(details)


@frozen
class Reconciled:
    """What a tool's ``reconcile`` found out about an interrupted call."""

    status: Literal["applied", "not_applied", "unknown"]
    result: Any = None
    reason: str = ""

    @classmethod
    def applied(cls, result: Any) -> Reconciled:
        """The effect happened; ``result`` is what the call would have returned.

        A ``ToolResult`` flags the recovered result as an error or as ending the run,
        exactly as the tool's own return value would have.
        """
        return cls("applied", result)

    @classmethod
    def not_applied(cls) -> Reconciled:
        """The effect did not happen; recovery runs the call once, with the same key."""
        return cls("not_applied")

    @classmethod
    def unknown(cls, reason: str = "") -> Reconciled:
        """Cannot tell; the model is told the outcome is unknown."""
        return cls("unknown", reason=reason)


class OutcomeUnknown(Exception):
    """Raised by a tool that cannot know whether its effect happened.

    For example the connection to the service broke after the request was sent and
    before its answer came back. The runtime records ``ToolOutcomeUnknown`` with
    ``reason`` and tells the model, whatever the tool's replay policy (a tool declared
    ``unknown_outcome="ask_person"`` waits for a person to say what happened instead):
    it is never reported as a plain error, which would tell the model that nothing
    happened.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryableError(Exception):
    """Raised by a tool whose call failed for a reason that may pass (a 503, a blip).

    A SAFE or KEYED tool with ``retry=RetryPolicy(...)`` is run again after a back-off,
    with the same idempotency key, never sooner than ``retry_after`` seconds (e.g. a
    server's Retry-After). Without a retry policy, or once its attempts run out, the
    model reads the error. Raise it only when the failed attempt left no effect behind
    that its retry could double (or the key makes the retry harmless).
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        if retry_after is not None and not (
            isinstance(retry_after, int | float)
            and not isinstance(retry_after, bool)  # True is an int, not a number of seconds
            and math.isfinite(retry_after)
            and retry_after >= 0
        ):
            raise ValueError(
                f"retry_after must be a number of seconds >= 0 or None, not {retry_after!r}"
            )
        super().__init__(message)
        self.message = message
        self.retry_after = None if retry_after is None else float(retry_after)


class NeedsHuman(Exception):
    """Raised by a tool whose call needs a person to decide (a declined card, a 2FA prompt).

    The call waits, durably and across restarts, for ``rt.resolve(session_id, call_id,
    action=...)``: ``"retry"`` runs it again with the same key (a person decided, so
    this is allowed for a NEVER tool too), ``"skip"`` records the result they give,
    ``"fail"`` hands the error to the model. ``reason`` is what they are shown.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _exception_types(name: str) -> Callable[[Any, Any, Any], None]:
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if not isinstance(value, tuple) or not all(
            isinstance(t, type) and issubclass(t, Exception) for t in value
        ):
            raise TypeError(f"{name} must be a tuple of exception classes, not {value!r}")

    return check


def _positive(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"RetryPolicy.{attribute.name} must be a number > 0, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"RetryPolicy.{attribute.name} must be finite, not {value!r}")


@frozen(kw_only=True)
class RetryPolicy:
    """How a SAFE or KEYED tool's transient failures are retried, without the model.

    Attempt ``n`` (counting every execution of the call, a re-run after a crash
    included) that fails with ``RetryableError``, an exception of ``retry_on`` or, if
    ``retry_timeouts``, a timeout (its ``timeout=`` or ``heartbeat_timeout=``), is
    retried after ``min(max_interval, initial * multiplier ** (n - 1))`` seconds, with
    jitter (between half and all of it), while ``n < max_attempts``. Each retry is a
    durable record first, so a crash during the back-off resumes the wait.
    """

    max_attempts: int = field(default=3)
    initial: float = field(default=1.0, validator=_positive)
    multiplier: float = field(default=2.0)
    max_interval: float = field(default=60.0, validator=_positive)
    retry_on: tuple[type[Exception], ...] = field(
        default=(), validator=_exception_types("RetryPolicy.retry_on")
    )
    retry_timeouts: bool = True

    @max_attempts.validator
    def _check_attempts(self, attribute: Any, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be an integer >= 1, not {value!r}")

    @multiplier.validator
    def _check_multiplier(self, attribute: Any, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
            raise ValueError(f"RetryPolicy.multiplier must be a number >= 1, not {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"RetryPolicy.multiplier must be finite, not {value!r}")

    def delay(self, attempt: int, jitter: float, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt``; ``jitter`` is a sample of U(0, 1)
        (the one back-off formula, ``perdure.backoff``)."""
        policy = Backoff(initial=self.initial, multiplier=self.multiplier, cap=self.max_interval)
        return policy.delay(attempt, jitter, retry_after)

    def retries(self, failure: type[BaseException]) -> bool:
        """Whether an exception of this type is a transient failure under this policy."""
        return issubclass(failure, RetryableError) or issubclass(failure, self.retry_on)


@frozen
class ToolResult:
    """A tool may return this instead of a plain value to flag an error or end the run."""

    content: Any
    is_error: bool = False
    terminate: bool = False  # the run finishes with this result; nothing more is dispatched


ToolFn = Callable[..., Awaitable[Any]] | Callable[..., Any]
ReconcileFn = Callable[..., Awaitable[Reconciled]]
ForgetFn = Callable[..., Awaitable[None]]
F = TypeVar("F", bound=ToolFn)


@frozen(kw_only=True, eq=False)
class Tool:
    """A registered tool: the function and everything the runtime must know about it."""

    name: str
    description: str
    input_schema: JsonSchema
    replay: ReplayPolicy
    requires_approval: bool | Callable[[dict[str, Any]], bool]
    timeout: float | None
    fn: ToolFn
    reconcile: ReconcileFn | None = None
    # Called once a call is settled (terminal, durable, not running): drop what was
    # kept for its reconcile. Best effort: a crash just before it leaves the state.
    forget: ForgetFn | None = None
    compensation: Tool | None = None  # the tool that undoes a completed call
    compensate_automatically: bool = False
    terminates: bool = False  # every result of this tool ends the run (a "finish" tool)
    cancellable: bool = False  # may a revision or cancel stop it mid-run (trio cancellation)?
    retry: RetryPolicy | None = None  # transient failures retried (SAFE and KEYED only)
    heartbeat_timeout: float | None = None  # silent this long: hung, cancelled
    needs_human_on: tuple[type[Exception], ...] = ()  # exceptions that wait for a person
    # An unknown outcome (interrupted, timed out, a reconcile that cannot tell): told to
    # the model ("tell_model"), or the call waits for a person to say what happened.
    unknown_outcome: UnknownOutcome = "tell_model"
    # A SAFE read whose result depends on the request: run again under a revision.
    depends_on_goal: bool = False
    version: str = "1"
    # Workspace history: the tool may change the workspace's files, so each attempt is
    # checkpointed (a snapshot before and after), and an interrupted call is diffed
    # from its before-snapshot at recovery. ``workspace_only``: the files are its only
    # effect, so an interrupted call that changed none did not happen and runs again.
    changes_workspace: bool = False
    workspace_only: bool = False
    # The other versions of this tool registered beside it (oldest first), when this one
    # is the newest: calls that started on one of them finish on it (``at_version``).
    earlier: tuple[Tool, ...] = ()
    takes_context: bool = True
    param_types: dict[str, Any] = field(factory=dict)
    definition_hash: str = ""
    # A validator of the tool's own (e.g. full JSON Schema for an MCP tool): problems, or [].
    check_args: Callable[[dict[str, Any]], list[str]] | None = None
    # Why the tool has its replay policy (recorded in every ToolExecuting of its calls).
    policy_reason: str = ""
    # The pydantic description of the parameters (None for a tool that brings its own
    # schema and check_args, e.g. an MCP tool: its arguments are passed as they are).
    parameters: Parameters | None = None
    # Which loop an ``async def`` tool's coroutine needs: under perdure.embed an
    # "asyncio" tool is awaited on the host application's loop; on a plain trio
    # runtime every tool runs on trio (one that then needs asyncio fails clearly).
    runs_on: Loop = "trio"

    @property
    def secret_params(self) -> frozenset[str]:
        """The parameters declared secret (``Annotated[..., perdure.Secret]``)."""
        return self.parameters.secret if self.parameters is not None else frozenset()

    def __attrs_post_init__(self) -> None:
        # Here rather than in @tool, so that attrs.evolve(a_tool, retry=...) is held to it too.
        _check_failure_options(
            self.name, self.replay, self.retry, self.heartbeat_timeout, self.needs_human_on
        )
        _check_outcome_options(self.name, self.replay, self.unknown_outcome, self.depends_on_goal)

    def at_version(self, version: str) -> Tool | None:
        """This tool as registered in ``version`` (itself or one of ``earlier``), or None
        if that version is not registered."""
        if version == self.version:
            return self
        return next((t for t in self.earlier if t.version == version), None)

    @property
    def versions(self) -> tuple[str, ...]:
        """Every registered version of this tool, oldest first (the newest is its own)."""
        return (*(t.version for t in self.earlier), self.version)

    def validate(self, args: Any) -> list[str]:
        """Problems with arguments from the model (empty when they are valid)."""
        if not isinstance(args, dict):
            return [f"the arguments must be a JSON object, got {type(args).__name__}"]
        if self.check_args is not None:
            return self.check_args(args)
        if self.parameters is not None:
            return self.parameters.problems(args)
        return []

    def needs_approval(self, args: dict[str, Any]) -> bool:
        """Whether this call waits for a human. A callable policy decides per call.

        The policy sees the effective arguments (the model's plus the defaults), so a
        default the model left out cannot slip past it.
        """
        if callable(self.requires_approval):
            try:
                return bool(self.requires_approval(self.effective_args(args)))
            except Exception:
                return True  # a broken policy must fail closed: ask the human
        return self.requires_approval

    def effective_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments the call will actually run with: the model's, plus JSON defaults."""
        out = dict(args)
        for name, default in _json_defaults(self.fn):
            if name not in out and name in self.param_types:
                out[name] = default
        return out

    def structure_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The values the function receives: converted by pydantic (a model instance for
        a model parameter, a datetime for a datetime...), or as they are for a tool
        without ``parameters``."""
        if self.parameters is None:
            return dict(args)
        return self.parameters.convert(args)

    async def invoke(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        """Run the function once: an ``async def`` on this loop, a plain ``def`` in a
        worker thread of the runtime's limiter.

        A cancelled wait (a timeout, a cancel) leaves the thread to finish on its own:
        a thread cannot be stopped, and it is never started again for the same attempt.
        """
        kwargs = self.structure_args(args)
        if not inspect.iscoroutinefunction(self.fn):
            in_thread = _for_the_host_loop(ctx) if self.takes_context else None
            call = functools.partial(self.fn, in_thread, **kwargs) if in_thread else None
            call = call or functools.partial(self.fn, **kwargs)
            return await trio.to_thread.run_sync(call, limiter=ctx._threads, abandon_on_cancel=True)
        if self.runs_on == "asyncio" and ctx._host is not None:
            on_host = _for_the_host_loop(ctx) if self.takes_context else None
            call = functools.partial(self.fn, on_host, **kwargs) if on_host else None
            return await ctx._host(call or functools.partial(self.fn, **kwargs))
        call = functools.partial(self.fn, ctx, **kwargs) if self.takes_context else None
        try:
            return await (call or functools.partial(self.fn, **kwargs))()
        except (RuntimeError, TypeError) as exc:
            if _needs_asyncio(exc):
                raise NeedsAsyncio(self.name, exc) from exc
            raise

    def render(self, value: Any) -> str:
        """What the model reads of a value this tool returned (``params.render``).

        Raises ``ResultNotSerializable`` (naming the tool and the type) for a value
        pydantic cannot serialize.
        """
        return render(self.name, value)

    async def run_reconcile(self, ctx: ToolContext, args: dict[str, Any]) -> Reconciled:
        assert self.reconcile is not None
        result = await self.reconcile(ctx, **self.structure_args(args))
        if not isinstance(result, Reconciled):
            raise TypeError(f"reconcile of {self.name} returned {result!r}, not a Reconciled")
        return result

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests)."""
        result = self.fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result


@functools.lru_cache(maxsize=4096)
def _json_defaults(fn: ToolFn) -> tuple[tuple[str, Any], ...]:
    """The parameters of ``fn`` with a JSON default (a function's signature is fixed)."""
    return tuple(
        (name, param.default)
        for name, param in inspect.signature(fn).parameters.items()
        if param.default is not inspect.Parameter.empty and _is_json(param.default)
    )


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _first_line_and_rest(doc: str | None) -> str:
    return inspect.cleandoc(doc or "").strip()


def _build(
    fn: ToolFn,
    *,
    name: str | None,
    description: str | None,
    replay: ReplayPolicy,
    requires_approval: bool | Callable[[dict[str, Any]], bool],
    timeout: float | None,
    reconcile: ReconcileFn | None,
    forget: ForgetFn | None,
    compensate: Tool | Callable[..., Awaitable[Any]] | None,
    compensate_automatically: bool,
    cancellable: bool | None,
    terminates: bool,
    retry: RetryPolicy | None,
    heartbeat_timeout: float | None,
    needs_human_on: tuple[type[Exception], ...],
    version: str | int,
    runs_on: Loop | None = None,
    changes_workspace: bool = False,
    workspace_only: bool = False,
    unknown_outcome: UnknownOutcome = "tell_model",
    depends_on_goal: bool = False,
) -> Tool:
    if not callable(fn) or isinstance(fn, Tool):
        raise TypeError(f"@tool needs a function, not {fn!r}")
    tool_name = name if name is not None else fn.__name__
    check_name(tool_name)
    version = _check_version(tool_name, version)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise ToolDefinitionError(
            f"tool {tool_name!r}: a generator cannot be a tool; return the whole result"
        )
    if not isinstance(replay, ReplayPolicy):
        raise TypeError(f"tool {tool_name!r}: replay must be a ReplayPolicy, not {replay!r}")
    if forget is not None and not inspect.iscoroutinefunction(forget):
        raise TypeError(f"tool {tool_name!r}: forget must be an async function")
    first = next(iter(inspect.signature(fn).parameters.values()), None)
    takes_context = first is not None and _hint_of(fn, first.name) is ToolContext
    # Checked before the timeout is made a float below (float("5") or float(True) would
    # let a wrong value through); the Tool checks again, for attrs.evolve.
    _check_failure_options(tool_name, replay, retry, heartbeat_timeout, needs_human_on)
    _check_outcome_options(tool_name, replay, unknown_outcome, depends_on_goal)
    summary, parameters = describe(tool_name, fn, skip_first=takes_context)
    schema = parameters.schema
    hints = typing.get_type_hints(fn, include_extras=True)
    param_types = {p: _strip_annotated(hints[p]) for p in parameters.names}
    desc = description if description is not None else summary
    definition = {
        "name": tool_name,
        "description": desc,
        "schema": schema,
        "replay": replay.value,
        "approval": requires_approval if isinstance(requires_approval, bool) else "policy",
        "version": version,
    }
    digest = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]
    return Tool(
        compensation=_compensation_tool(tool_name, compensate, timeout),
        terminates=terminates,
        name=tool_name,
        description=desc or tool_name,
        input_schema=schema,
        replay=replay,
        requires_approval=requires_approval,
        timeout=timeout,
        fn=fn,
        reconcile=reconcile,
        forget=forget,
        compensate_automatically=compensate_automatically,
        cancellable=replay is ReplayPolicy.SAFE if cancellable is None else cancellable,
        retry=retry,
        heartbeat_timeout=None if heartbeat_timeout is None else float(heartbeat_timeout),
        needs_human_on=needs_human_on,
        unknown_outcome=unknown_outcome,
        depends_on_goal=depends_on_goal,
        version=version,
        takes_context=takes_context,
        param_types=param_types,
        definition_hash=digest,
        parameters=parameters,
        runs_on=_loop_of(fn, runs_on) if inspect.iscoroutinefunction(fn) else "trio",
        changes_workspace=changes_workspace or workspace_only,
        workspace_only=workspace_only,
    )


def _check_version(name: str, version: object) -> str:
    """A tool's version as it is recorded: a non-empty string (an integer is written as
    one), so that ``version=2`` and ``version="2"`` are the same version."""
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str) or not version.strip():
        raise ToolDefinitionError(
            f"tool {name!r}: version must be a non-empty string or an integer, not {version!r}"
        )
    return version


def version_order(name: str, version: str) -> tuple[int, ...]:
    """Where ``version`` stands among the versions of tool ``name`` registered side by
    side: dot-separated numbers, compared as numbers ("10" is newer than "9", "2.1"
    newer than "2"). Anything else cannot say which version is the newest, and is
    refused with ``ToolDefinitionError``."""
    parts = version.split(".")
    if not all(part.isdigit() and part.isascii() for part in parts):
        raise ToolDefinitionError(
            f"tool {name!r} is registered in several versions, and {version!r} is not a "
            "version number: versions registered side by side must be numbers such as "
            "2 or 2.1, so that the newest is clear"
        )
    return tuple(int(part) for part in parts)


def _for_the_host_loop(ctx: ToolContext) -> ToolContext:
    """``ctx`` for code outside trio's context (a coroutine on the host's asyncio loop,
    a plain ``def`` in a worker thread): its heartbeats and progress events are handed
    to the trio loop without waiting; sub-agents, trio code, are refused."""
    token = trio.lowlevel.current_trio_token()
    beat, emit = ctx._beat, ctx._emit

    def beat_soon(details: Any) -> None:
        token.run_sync_soon(beat, details)

    def emit_soon(kind: str, data: dict[str, Any]) -> None:
        token.run_sync_soon(emit, kind, data)

    async def no_agents(task: str, system: str | None, tools: list[str] | None) -> str:
        raise RuntimeError(
            "ctx.run_agent is trio code: declare the tool runs_on='trio' to start sub-agents"
        )

    return attrs.evolve(ctx, beat=beat_soon, emit=emit_soon, agents=no_agents, host=None)


def _loop_of(fn: Callable[..., Any], runs_on: Loop | None) -> Loop:
    """Which loop a coroutine function needs: as declared, else trio if its module
    imports trio (trio code), else asyncio (an asyncio application's code)."""
    if runs_on is not None:
        if runs_on not in ("trio", "asyncio"):
            raise ValueError(f"runs_on must be 'trio' or 'asyncio', not {runs_on!r}")
        return runs_on
    for value in getattr(fn, "__globals__", {}).values():
        module = getattr(value, "__name__", None) if inspect.ismodule(value) else None
        owner = getattr(value, "__module__", None) if not inspect.ismodule(value) else None
        for name in (module, owner):
            if isinstance(name, str) and (name == "trio" or name.startswith("trio.")):
                return "trio"
    return "asyncio"


def _hint_of(fn: Callable[..., Any], name: str) -> Any:
    try:
        hint = typing.get_type_hints(fn).get(name)
    except Exception:  # reported, naming the parameter, by describe()
        return None
    return hint


def _check_failure_options(
    name: str,
    replay: ReplayPolicy,
    retry: RetryPolicy | None,
    heartbeat_timeout: float | None,
    needs_human_on: tuple[type[Exception], ...],
) -> None:
    """Refuse, at definition time, failure options that could not be honoured safely."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"tool {name}: retry must be a perdure.RetryPolicy, not {retry!r}")
    if retry is not None and not replay.replayable:
        raise ValueError(
            f"tool {name}: retry= needs replay=SAFE or KEYED. A NEVER tool is never run "
            "again automatically: a failed attempt may still have had its effect. Make the "
            "tool idempotent through ctx.idempotency_key and declare replay=KEYED, or keep "
            "NEVER and raise perdure.NeedsHuman so that a person decides whether to retry "
            "(a reconcile= answering not_applied also lets recovery run it once more)."
        )
    if heartbeat_timeout is not None and (
        isinstance(heartbeat_timeout, bool)
        or not isinstance(heartbeat_timeout, int | float)
        or not 0 < heartbeat_timeout < math.inf
    ):
        raise ValueError(
            f"tool {name}: heartbeat_timeout must be a number of seconds > 0, "
            f"not {heartbeat_timeout!r}"
        )
    _exception_types(f"tool {name}: needs_human_on")(None, None, needs_human_on)


def _check_outcome_options(
    name: str, replay: ReplayPolicy, unknown_outcome: str, depends_on_goal: bool
) -> None:
    """Refuse, at definition time, an unknown-outcome choice or goal dependency that
    could not be honoured."""
    if unknown_outcome not in UNKNOWN_OUTCOME_CHOICES:
        raise ValueError(
            f"tool {name}: unknown_outcome must be one of "
            f"{', '.join(UNKNOWN_OUTCOME_CHOICES)}, not {unknown_outcome!r}"
        )
    if not isinstance(depends_on_goal, bool):
        raise TypeError(f"tool {name}: depends_on_goal must be True or False")
    if depends_on_goal and replay is not ReplayPolicy.SAFE:
        raise ValueError(
            f"tool {name}: depends_on_goal=True needs replay=SAFE: the call is run again "
            "under a revised request, which only a call without side effects may be"
        )


def _compensation_tool(
    name: str, compensate: Tool | Callable[..., Awaitable[Any]] | None, timeout: float | None
) -> Tool | None:
    """The compensation as a tool of its own: its policy, key and approval apply.

    A ``Tool`` is used as is (declare its replay policy and approval with ``@tool``);
    a plain ``async def undo(ctx, result, **args)`` becomes a NEVER tool that accepts
    the original call's arguments plus ``result``.
    """
    if compensate is None or isinstance(compensate, Tool):
        return compensate
    if not inspect.iscoroutinefunction(compensate):
        raise TypeError(f"the compensation of {name} must be an async function or a @tool")
    comp_name = f"{name}.compensate"
    digest = hashlib.sha256(comp_name.encode()).hexdigest()[:16]
    return Tool(
        name=comp_name,
        description=_first_line_and_rest(compensate.__doc__) or f"undo {name}",
        input_schema={"type": "object"},
        replay=ReplayPolicy.NEVER,
        requires_approval=False,
        timeout=timeout,
        fn=compensate,
        definition_hash=digest,
    )


def _strip_annotated(hint: Any) -> Any:
    if typing.get_origin(hint) is typing.Annotated:
        return typing.get_args(hint)[0]
    return hint


@overload
def tool(fn: ToolFn, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = ReplayPolicy.NEVER,
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
    timeout: float | None = None,
    reconcile: ReconcileFn | None = None,
    forget: ForgetFn | None = None,
    compensate: Tool | Callable[..., Awaitable[Any]] | None = None,
    compensate_automatically: bool = False,
    cancellable: bool | None = None,
    terminates: bool = False,
    retry: RetryPolicy | None = None,
    heartbeat_timeout: float | None = None,
    needs_human_on: tuple[type[Exception], ...] = (),
    version: str | int = "1",
    runs_on: Loop | None = None,
    changes_workspace: bool = False,
    workspace_only: bool = False,
    unknown_outcome: UnknownOutcome = "tell_model",
    depends_on_goal: bool = False,
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = ReplayPolicy.NEVER,
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
    timeout: float | None = None,
    reconcile: ReconcileFn | None = None,
    forget: ForgetFn | None = None,
    compensate: Tool | Callable[..., Awaitable[Any]] | None = None,
    compensate_automatically: bool = False,
    cancellable: bool | None = None,
    terminates: bool = False,
    retry: RetryPolicy | None = None,
    heartbeat_timeout: float | None = None,
    needs_human_on: tuple[type[Exception], ...] = (),
    version: str | int = "1",
    runs_on: Loop | None = None,
    changes_workspace: bool = False,
    workspace_only: bool = False,
    unknown_outcome: UnknownOutcome = "tell_model",
    depends_on_goal: bool = False,
) -> Tool | Callable[[ToolFn], Tool]:
    """Declare an async function as a tool.

    ``replay`` defaults to NEVER: a tool must opt in to being re-run after a crash.
    The input schema is derived from the signature; the description from the
    docstring. A first parameter annotated ``ToolContext`` receives the context.
    ``requires_approval`` may be a function of the call's arguments (a per-call
    policy). ``cancellable`` (default: only SAFE tools) says whether a cancellation or a goal
    revision may stop the tool while it runs; other tools are left to finish.
    ``compensate`` undoes a completed call on request (``rt.compensate``), or
    automatically after a revision or cancellation if ``compensate_automatically``.
    ``terminates`` makes every result of the tool end the run. ``forget(ctx)``
    is awaited once a call is settled (its result durable, nothing running), so
    state kept only for ``reconcile`` (keyed by ``ctx.idempotency_key``) can go.

    When a call fails: ``retry=RetryPolicy(...)`` (SAFE and KEYED tools only; refused
    for NEVER) retries transient failures with back-off and the same key;
    ``heartbeat_timeout`` (seconds) cancels a call that stops calling
    ``ctx.heartbeat`` for that long, then treats it as a timeout (retried by the
    policy, or an unknown outcome for a NEVER tool); ``needs_human_on`` lists
    exceptions that, like ``perdure.NeedsHuman``, make the call wait for a person.
    ``unknown_outcome="ask_person"`` sends an outcome perdure cannot know (a NEVER
    call interrupted or timed out, a reconcile answering unknown) to a person instead
    of the model: the call waits for ``rt.resolve`` (applied: ``skip`` with the
    result; not applied: ``retry``, same key; failed: ``fail``).

    ``depends_on_goal=True`` (SAFE tools only) says the result depends on the request:
    when the request is revised, a completed call is run once more under the new
    revision before the model continues, and the model reads both results.

    A plain ``def`` runs in a worker thread. An ``async def`` runs on the runtime's
    trio loop, except under ``perdure.embed``, where a tool written for asyncio is
    awaited on the application's asyncio loop: ``runs_on="asyncio"`` or ``"trio"``
    says which, and by default a tool whose module imports trio is trio code, any
    other asyncio code.

    ``changes_workspace=True`` declares that the tool may change the runtime's
    workspace: each attempt is checkpointed (``perdure.tools.history``), its diff and a
    rewind to before it are offered, and an interrupted call is reconciled from the
    diff (the model is told which files changed; any other effect stays unknown).
    ``workspace_only=True`` says the files are its only effect: an interrupted call
    that changed no file is run once more.
    """

    def wrap(f: ToolFn) -> Tool:
        return _build(
            f,
            name=name,
            description=description,
            replay=replay,
            requires_approval=requires_approval,
            timeout=timeout,
            reconcile=reconcile,
            forget=forget,
            compensate=compensate,
            compensate_automatically=compensate_automatically,
            cancellable=cancellable,
            terminates=terminates,
            retry=retry,
            heartbeat_timeout=heartbeat_timeout,
            needs_human_on=needs_human_on,
            version=version,
            runs_on=runs_on,
            changes_workspace=changes_workspace,
            workspace_only=workspace_only,
            unknown_outcome=unknown_outcome,
            depends_on_goal=depends_on_goal,
        )

    return wrap(fn) if fn is not None else wrap


def render_result(value: Any) -> str:
    """The text the model reads for a result a person gave (``rt.resolve`` with
    ``action="skip"``): the rule of tools' results (``params.render``), except that a
    value pydantic cannot serialize is shown as its ``str`` rather than refused (a
    person's answer must reach the model)."""
    try:
        return render("", value)
    except ResultNotSerializable:
        import pydantic_core  # imported with the first result, not with perdure

        return json.dumps(pydantic_core.to_jsonable_python(value, fallback=str), ensure_ascii=False)


def registry(tools: typing.Iterable[Tool]) -> dict[str, Tool]:
    """Index tools by name, refusing non-tools and duplicates with a clear error.

    Several versions of one tool (``@tool(version=...)``, one name) may be registered
    side by side: the newest is the tool of that name, the one the model sees and new
    calls run on, and it carries the others (``Tool.earlier``), on which the calls
    that started on them finish. Two tools of one name and one version are refused.
    """
    by_name: dict[str, list[Tool]] = {}
    for t in tools:
        if not isinstance(t, Tool):
            raise TypeError(f"{t!r} is not a tool; decorate it with @perdure.tool")
        same = by_name.setdefault(t.name, [])
        # A tool that already carries its earlier versions (a registry's output) brings them.
        for each in (*t.earlier, t):
            if any(other.version == each.version for other in same):
                raise ValueError(
                    f"two tools are named {t.name!r} with version {each.version!r}: "
                    "versions of one tool registered side by side need distinct version="
                )
            same.append(attrs.evolve(each, earlier=()) if each.earlier else each)
    out: dict[str, Tool] = {}
    for name, versions in by_name.items():
        if len(versions) == 1:
            out[name] = versions[0]
            continue
        ordered = sorted(versions, key=lambda t: version_order(name, t.version))
        out[name] = attrs.evolve(ordered[-1], earlier=tuple(ordered[:-1]))
    return out
