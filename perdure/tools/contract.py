"""The tool contract: what a tool declares, and what the runtime hands it.

A tool is an async function wrapped by ``@tool``. It declares whether it may be
replayed after a crash (``ReplayPolicy``), whether a human must approve each call,
a timeout, and optionally a ``reconcile`` function that tells recovery whether an
interrupted call really took effect. The runtime passes a ``ToolContext`` carrying
an idempotency key that is stable across restarts and re-runs of the same call.

This module is a leaf: it imports nothing of perdure's runtime.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import json
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import attrs
import cattrs
from attrs import field, frozen

from perdure.tools.schema import JsonSchema, object_schema, validate


class ReplayPolicy(enum.Enum):
    """May the runtime run a call again when it cannot know whether it took effect?"""

    SAFE = "safe"  # read-only or naturally idempotent: re-run on restart
    KEYED = "keyed"  # idempotent through ctx.idempotency_key: re-run with the same key
    NEVER = "never"  # never re-run automatically; reconcile, or report the outcome unknown

    @property
    def replayable(self) -> bool:
        return self is not ReplayPolicy.NEVER


@frozen(kw_only=True)
class ToolContext:
    """What a running tool knows about its call."""

    idempotency_key: str  # same for every attempt of this call, across restarts
    call_id: str
    session_id: str
    attempt: int  # 1 for the first execution, higher for re-runs after recovery
    workspace: Path | None
    _emit: Callable[[str, dict[str, Any]], None] = field(
        default=lambda kind, data: None, alias="emit", repr=False
    )

    def progress(self, message: str, **data: Any) -> None:
        """Publish an ephemeral progress event on the session's stream (never stored)."""
        self._emit("tool_progress", {"call_id": self.call_id, "message": message, **data})


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
    ``reason`` and tells the model, whatever the tool's replay policy: it is never
    reported as a plain error, which would tell the model that nothing happened.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@frozen
class ToolResult:
    """A tool may return this instead of a plain value to flag an error or end the run."""

    content: Any
    is_error: bool = False
    terminate: bool = False  # the run finishes with this result; nothing more is dispatched


ToolFn = Callable[..., Awaitable[Any]]
ReconcileFn = Callable[..., Awaitable[Reconciled]]
ForgetFn = Callable[..., Awaitable[None]]
F = TypeVar("F", bound=ToolFn)

_args_converter = cattrs.Converter()


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
    version: str = "1"
    takes_context: bool = True
    param_types: dict[str, Any] = field(factory=dict)
    definition_hash: str = ""

    def validate(self, args: Any) -> list[str]:
        """Problems with arguments from the model (empty when they are valid)."""
        if not isinstance(args, dict):
            return [f"the arguments must be a JSON object, got {type(args).__name__}"]
        return validate(self.input_schema, args)

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
        return {
            name: _args_converter.structure(value, self.param_types[name])
            if name in self.param_types
            else value
            for name, value in args.items()
        }

    async def invoke(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        kwargs = self.structure_args(args)
        if self.takes_context:
            return await self.fn(ctx, **kwargs)
        return await self.fn(**kwargs)

    async def run_reconcile(self, ctx: ToolContext, args: dict[str, Any]) -> Reconciled:
        assert self.reconcile is not None
        result = await self.reconcile(ctx, **self.structure_args(args))
        if not isinstance(result, Reconciled):
            raise TypeError(f"reconcile of {self.name} returned {result!r}, not a Reconciled")
        return result

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests)."""
        return await self.fn(*args, **kwargs)


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
    version: str,
) -> Tool:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@tool needs an async function; {fn.__qualname__} is not")
    if not isinstance(replay, ReplayPolicy):
        raise TypeError(f"replay must be a ReplayPolicy, not {replay!r}")
    if forget is not None and not inspect.iscoroutinefunction(forget):
        raise TypeError(f"tool {fn.__qualname__}: forget must be an async function")
    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and hints.get(params[0].name) is ToolContext
    if takes_context:
        params = params[1:]
    fields: dict[str, tuple[Any, bool]] = {}
    param_types: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__qualname__}: *args/**kwargs cannot be described")
        if p.name not in hints:
            raise TypeError(f"tool {fn.__qualname__}: parameter {p.name!r} needs a type hint")
        fields[p.name] = (hints[p.name], p.default is inspect.Parameter.empty)
        param_types[p.name] = _strip_annotated(hints[p.name])
    tool_name = name or fn.__name__
    schema = object_schema(fields)
    desc = description if description is not None else _first_line_and_rest(fn.__doc__)
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
        version=version,
        takes_context=takes_context,
        param_types=param_types,
        definition_hash=digest,
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
    version: str = "1",
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
    version: str = "1",
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
            version=version,
        )

    return wrap(fn) if fn is not None else wrap


def render_result(value: Any) -> str:
    """The text the model sees for a tool's return value."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if attrs.has(type(value)):
        value = attrs.asdict(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def registry(tools: typing.Iterable[Tool]) -> dict[str, Tool]:
    """Index tools by name, refusing duplicates and non-tools with a clear error."""
    out: dict[str, Tool] = {}
    for t in tools:
        if not isinstance(t, Tool):
            raise TypeError(f"{t!r} is not a tool; decorate it with @perdure.tool")
        if t.name in out:
            raise ValueError(f"two tools are named {t.name!r}")
        out[t.name] = t
    return out
