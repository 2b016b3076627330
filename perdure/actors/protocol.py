"""The vocabulary of a session's decisions: what goes in, what comes out.

``decide`` is a pure function of a session's state and ONE input; this module names
those inputs and outputs, as h11 keeps its events apart from its state machine:

* inputs — ``Env`` (tools, time, limits) and ``View`` (what this process is doing
  now), a caller's ``Command``, or a ``Result`` reported by a generation or tool actor;
* outputs — a ``Step``: the records to commit and the ``Effect``s to perform once
  they are durable (``decide.overlaps_commit`` names the few that may start while
  that commit is in flight); and for a command, an ``Answer`` for the caller.

Every effect carries what the shell needs to perform it, so the shell never reads
back into the state to act. Every command owns its kind and the hash of its body,
which request-id deduplication compares (the fold computes the same hash from the
record the command produced, through the same function).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from attrs import field, frozen

from perdure.answers import IF_BUSY as IF_BUSY
from perdure.answers import Accepted as Accepted
from perdure.answers import Done as Done
from perdure.answers import Forked as Forked
from perdure.answers import IfBusy as IfBusy
from perdure.answers import check_if_busy as check_if_busy
from perdure.providers.base import ModelReply
from perdure.settings import Limits
from perdure.storage.records import Budget, Record, ResolutionAction, ToolExecuting, Usage
from perdure.tools.contract import Tool

# -- the environment ----------------------------------------------------------------------


@frozen(kw_only=True)
class Env:
    """What decisions may consult besides the state: the tools, the time, the limits."""

    tools: Mapping[str, Tool]
    now: float
    # The runtime's settings for decisions, as ``open_runtime`` checked them (the
    # budget there is the runtime's default; a session may have its own).
    limits: Limits = field(factory=Limits)


@frozen(kw_only=True)
class View:
    """What this process is doing right now. Not durable: empty after a restart."""

    models: frozenset[str] = frozenset()  # generation ids with a model call in flight
    tools: frozenset[str] = frozenset()  # call ids with a tool or a reconcile in flight
    cancelling: frozenset[str] = frozenset()  # call ids already told to stop
    waiting: frozenset[str] = frozenset()  # call ids whose retry back-off is being waited out
    draining: bool = False  # the process is shutting down: dispatch nothing new
    # The session is being handed to another node: its current step's tool calls still
    # run here, but no model call, retry or run starts (the next owner starts them).
    handing_over: bool = False


# -- commands: what callers ask -------------------------------------------------------------


def text_body_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_budget_hash(text: str, budget: Budget | None) -> str:
    """The body hash of a text that may come with a budget (without one: as before)."""
    if budget is None:
        return text_body_hash(text)
    limits = (budget.run_tokens, budget.session_tokens, budget.run_cost, budget.session_cost)
    return text_body_hash(f"{text}\x00budget\x00{limits!r}")


@frozen
class Submit:
    """User input. ``if_busy`` says what it does while a run is busy (None: the session's
    default, else ``queue``): wait its turn, ``interrupt`` the run (cancelled, then this
    input runs), be refused (``reject``, nothing recorded), or ``steer`` the running
    request (a revision). It is not part of the body: a retry is the same request."""

    kind: ClassVar[str] = "submit"
    request_id: str
    text: str
    budget: Budget | None = None  # replaces the session's budget from this input on
    if_busy: IfBusy | None = None
    # The caller's W3C trace context; not part of the body (a retry from another span
    # is the same request).
    traceparent: str = ""

    @property
    def body_hash(self) -> str:
        return with_budget_hash(self.text, self.budget)


@frozen
class Cancel:
    kind: ClassVar[str] = "cancel"
    request_id: str

    @property
    def body_hash(self) -> str:
        return Cancel.hash_of()

    @staticmethod
    def hash_of() -> str:
        return text_body_hash("\x00cancel")


@frozen
class Approve:
    kind: ClassVar[str] = "approve"
    call_id: str
    approved: bool
    request_id: str
    note: str = ""

    @property
    def body_hash(self) -> str:
        return Approve.hash_of(self.call_id, self.approved)

    @staticmethod
    def hash_of(call_id: str, approved: bool) -> str:
        return text_body_hash(f"\x00approve\x00{call_id}\x00{approved}")


@frozen
class Revise:
    kind: ClassVar[str] = "revise"
    request_id: str
    text: str
    budget: Budget | None = None  # replaces the session's budget from this revision on

    @property
    def body_hash(self) -> str:
        return with_budget_hash(self.text, self.budget)


@frozen
class Pause:
    kind: ClassVar[str] = "pause"
    request_id: str

    @property
    def body_hash(self) -> str:
        return Pause.hash_of()

    @staticmethod
    def hash_of() -> str:
        return text_body_hash("\x00pause")


@frozen
class Resume:
    kind: ClassVar[str] = "resume"
    request_id: str

    @property
    def body_hash(self) -> str:
        return Resume.hash_of()

    @staticmethod
    def hash_of() -> str:
        return text_body_hash("\x00resume")


@frozen
class Compensate:
    kind: ClassVar[str] = "compensate"
    call_id: str
    request_id: str

    @property
    def body_hash(self) -> str:
        return Compensate.hash_of(self.call_id)

    @staticmethod
    def hash_of(call_id: str) -> str:
        return text_body_hash(f"\x00compensate\x00{call_id}")


@frozen
class Resolve:
    """A person's answer to a call that raised ``NeedsHuman``: retry, skip or fail it."""

    kind: ClassVar[str] = "resolve"
    call_id: str
    action: ResolutionAction
    request_id: str
    result: Any = None  # skip: the call's result; fail: what the model reads (optional)

    @property
    def body_hash(self) -> str:
        return Resolve.hash_of(self.call_id, self.action, self.result)

    @staticmethod
    def hash_of(call_id: str, action: str, result: Any) -> str:
        canonical = json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text_body_hash(f"\x00resolve\x00{call_id}\x00{action}\x00{canonical}")


@frozen
class CompactContext:
    """Summarise the session's conversation now (what the model is sent; the log keeps
    everything), instead of waiting for its context to fill."""

    kind: ClassVar[str] = "compact_context"
    request_id: str

    @property
    def body_hash(self) -> str:
        return CompactContext.hash_of()

    @staticmethod
    def hash_of() -> str:
        return text_body_hash("\x00compact_context")


@frozen
class Rewind:
    """Restore the workspace's files to ``tree``, the workspace as it was at the
    session's log position ``position`` (the runtime finds the tree in the log)."""

    kind: ClassVar[str] = "rewind"
    request_id: str
    position: int
    tree: str

    @property
    def body_hash(self) -> str:
        return Rewind.hash_of(self.position, self.tree)

    @staticmethod
    def hash_of(position: int, tree: str) -> str:
        return text_body_hash(f"\x00rewind\x00{position}\x00{tree}")


Command = (
    Submit
    | Cancel
    | Approve
    | Revise
    | Pause
    | Resume
    | Compensate
    | Resolve
    | Rewind
    | CompactContext
)

# -- results: what the actors report ----------------------------------------------------------


@frozen
class ModelReplied:
    generation_id: str
    attempt: int
    reply: ModelReply


@frozen(kw_only=True)
class ModelFailed:
    generation_id: str
    attempt: int
    error: str
    retryable: bool
    retry_after: float | None = None
    usage: Usage = field(factory=Usage)
    jitter: float = 0.5  # a sample of U(0, 1), drawn by the shell
    model: str = ""  # the model asked
    provider: str = ""  # who failed
    fallback: bool = False  # the next attempt goes to another provider: no back-off


ToolOutcome = Literal[
    "ok",
    "error",  # the tool raised
    "timeout",  # its timeout, or its heartbeat_timeout (silent too long: hung)
    "cancelled",
    "unknown",  # it raised OutcomeUnknown
    "retryable",  # it raised RetryableError or an exception its RetryPolicy lists
    "needs_human",  # it raised NeedsHuman or an exception of needs_human_on
]


@frozen(kw_only=True)
class WorkspaceSeen:
    """The workspace around one attempt of a workspace call, as the shell found it:
    trees of the workspace history store (``perdure.tools.history``)."""

    before: str  # "": no before-snapshot exists, so the attempt never reached its tool
    after: str
    changed: tuple[str, ...] = ()  # the files that differ between the two
    skipped: tuple[str, ...] = ()  # files left out of a snapshot for their size
    # Files changed since the session's previous checkpoint by something other than
    # its calls (another session or runtime on the same workspace, a person).
    outside: tuple[str, ...] = ()


@frozen(kw_only=True)
class ToolFinished:
    call_id: str
    attempt: int
    outcome: ToolOutcome
    output: str  # the result, or the error (for needs_human: the reason)
    is_error: bool = False
    terminate: bool = False
    duration: float = 0.0
    retry_after: float | None = None  # of a RetryableError
    jitter: float = 0.5  # a sample of U(0, 1) for the back-off, drawn by the shell
    workspace: WorkspaceSeen | None = None  # a workspace call's checkpoints


@frozen(kw_only=True)
class HeartbeatReported:
    """The latest ``ctx.heartbeat`` of a running attempt (the shell throttles these)."""

    call_id: str
    attempt: int
    details: Any = None


@frozen(kw_only=True)
class AgentLinked:
    """A running attempt started the sub-agent session ``child`` (``ctx.run_agent``)."""

    call_id: str
    attempt: int
    child: str


@frozen(kw_only=True)
class BackOffOver:
    """The shell waited out a call's back-off (``BackOff``); ``advance`` decides the rest."""

    call_id: str
    attempt: int


@frozen(kw_only=True)
class ReconcileFinished:
    call_id: str
    status: Literal["applied", "not_applied", "unknown"]
    output: str = ""
    reason: str = ""
    is_error: bool = False  # of an applied result
    terminate: bool = False  # an applied result ends the run
    # A workspace call: the workspace since its before-snapshot (after = now).
    workspace: WorkspaceSeen | None = None


@frozen(kw_only=True)
class RestoreFinished:
    """The shell performed (or could not perform) a ``RestoreWorkspace``."""

    request_id: str
    tree: str
    before: str = ""  # the workspace just before the restore
    error: str = ""  # why nothing was restored

    @property
    def call_id(self) -> str:
        return restore_key(self.request_id)


def restore_key(request_id: str) -> str:
    """How the shell tracks a restore in flight among its calls."""
    return f"restore:{request_id}"


Result = (
    ModelReplied
    | ModelFailed
    | ToolFinished
    | ReconcileFinished
    | HeartbeatReported
    | AgentLinked
    | BackOffOver
    | RestoreFinished
)

# -- effects: what the shell performs once the step is durable ----------------------------------


@frozen
class CallModel:
    generation_id: str
    attempt: int
    not_before: float | None = None


@frozen
class Summarize:
    """Make the summary of the compaction in progress (its ``CompactionStarted`` is
    durable): a model call, reported as ``ModelReplied``/``ModelFailed`` under the
    compaction's id."""

    compaction_id: str
    attempt: int
    not_before: float | None = None


@frozen
class RunTool:
    """Run one attempt of a call, exactly as its durable ``executing`` record says.

    ``last_heartbeat`` is the last heartbeat committed by an earlier attempt (None if
    none): the tool reads it as ``ctx.last_heartbeat`` to resume where it was.
    """

    executing: ToolExecuting
    tool: Tool
    last_heartbeat: Any = None
    # A workspace call: the tree of the session's last checkpoint ("" if none).
    workspace_since: str = ""

    @property
    def call_id(self) -> str:
        return self.executing.call_id


@frozen
class Reconcile:
    """Ask the tool whether the call recorded by ``executing`` took effect."""

    executing: ToolExecuting
    tool: Tool

    @property
    def call_id(self) -> str:
        return self.executing.call_id


@frozen
class BackOff:
    """Wait until ``not_before`` (wall clock), then report ``BackOffOver`` for the call."""

    call_id: str
    attempt: int  # the attempt that failed
    not_before: float


@frozen
class StopBackOff:
    """The call no longer waits for a retry (cancelled, revised): drop its timer."""

    call_id: str


@frozen
class CancelTool:
    call_id: str


@frozen
class CancelModel:
    generation_id: str


@frozen
class Forget:
    """The call is settled (its terminal record is durable, nothing runs for it): the
    tool may drop the state it kept for ``reconcile``."""

    executing: ToolExecuting
    tool: Tool


@frozen
class RestoreWorkspace:
    """Make the workspace's files match ``tree`` (its ``WorkspaceRestoreStarted`` is
    durable), then report ``RestoreFinished``."""

    request_id: str
    tree: str

    @property
    def call_id(self) -> str:
        return restore_key(self.request_id)


Effect = (
    CallModel
    | Summarize
    | RunTool
    | Reconcile
    | CancelTool
    | CancelModel
    | Forget
    | BackOff
    | StopBackOff
    | RestoreWorkspace
)


@frozen(kw_only=True)
class Overlap:
    """Which effects may start while the commit of the step that asks for them is in
    flight (docs/DESIGN.md, "What must be durable before what")."""

    # A model call: it touches nothing outside the process, and its reply is acted on
    # only once that commit is durable (the session handles one message at a time).
    model_calls: bool = True
    # A SAFE tool's attempt (read-only or naturally idempotent): running it once more,
    # or once without a record of it, is harmless by the tool's own declaration.
    safe_tools: bool = False


@frozen
class Step:
    """What one decision produced: records to commit, then effects to perform."""

    records: tuple[Record, ...] = ()
    effects: tuple[Effect, ...] = ()

    def __add__(self, other: Step) -> Step:
        # Steps are immutable: adding nothing can hand back the other one as it is.
        if not (other.records or other.effects):
            return self
        if not (self.records or self.effects):
            return other
        return Step(self.records + other.records, self.effects + other.effects)

    def __bool__(self) -> bool:
        return bool(self.records or self.effects)


NOTHING = Step()

# -- answers: what a caller hears ---------------------------------------------------------------


Answer = Accepted | Done
