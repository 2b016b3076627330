"""The records of perdure's log: every durable state transition, one small frozen class each.

A record is a fact that has happened and been made durable. Actors never mutate
state directly; they decide which records to append, the Journal makes them
durable, and the state of every actor is a fold over its records. The names
follow the lifecycles of docs/DESIGN.md:

* run:        InputAccepted -> RunStarted -> ... -> RunFinished
* generation: GenerationStarted -> (RetryPending ...) -> GenerationCompleted
* tool task:  ToolTaskCreated -> (ToolAwaitingApproval -> ApprovalDecided)
              -> ToolExecuting (ToolHeartbeat ..., AgentStarted ...)
              -> ToolCompleted | ToolOutcomeUnknown | ToolCancelled
              or, when an attempt fails: ToolRetryPending -> ToolExecuting (attempt + 1)
              or ToolAwaitingHuman -> ResolutionDecided -> (a retry, or a result)
* course:     CancelRequested, GoalRevised, SessionPaused, SessionResumed,
              CompensationRequested -> (a tool task) -> CompensationFinished
* lineage:    SessionForked (a session made from a settled prefix of another)
* workspace:  WorkspaceCheckpointed (with a workspace call's result),
              WorkspaceRestoreStarted -> WorkspaceRestored (a rewind of the files)
* context:    CompactionStarted -> (CompactionRetryPending ...)
              -> ContextCompacted | CompactionAbandoned
* recovery:   RecoveryDecision (one per decision a restart takes), SessionParked
* ownership:  LogOpened (system record, no session)
* retention:  SessionDeleted (system record: a session removed from the log)

Adding a field with a default is a compatible change (old records decode with the
default). Anything else bumps the record's version in ``RECORD_VERSIONS`` and
registers the step from the old version in ``codec.MIGRATIONS`` (``@migration``);
docs/DESIGN.md, "Record format and migrations".
"""

from __future__ import annotations

import math
from typing import Any, Literal

from attrs import field, frozen

RunStatus = Literal["completed", "cancelled", "failed", "stopped", "interrupted"]
# "stopped": a budget was spent (the session goes on with a new input or a revision).
FINAL_RUN_STATUSES: frozenset[str] = frozenset({"completed", "cancelled", "failed", "stopped"})

ReplayName = Literal["safe", "keyed", "never"]

ToolResultKind = Literal[
    "ok",  # the tool returned
    "error",  # the tool raised
    "invalid_args",  # arguments failed the tool's schema; the tool never ran
    "unknown_tool",  # no tool of that name is registered; nothing ran
    "not_granted",  # the tool is outside the session's grant; nothing ran
    "timeout",  # the tool exceeded its timeout and was cancelled
    "denied",  # a human refused the approval; nothing ran
    "reconciled",  # recovery asked the tool's reconcile(): the effect was applied
    "resolved",  # a person resolved a call that needed one (skip: their result; fail)
]
ResolutionAction = Literal["retry", "skip", "fail"]


# -- value types embedded in records -------------------------------------------------


@frozen(kw_only=True)
class ToolCall:
    """One tool call requested by the model, as the model wrote it."""

    call_id: str
    name: str
    input: dict[str, Any]
    # The input's parameters declared secret by the tool: redacted in every view.
    secret: list[str] = field(factory=list)


@frozen(kw_only=True)
class Usage:
    """Token counts of one model call (or a sum of them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
        )


def _token_limit(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a token limit must be a non-negative integer, got {value!r}")
    return value


def _cost_limit(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"a cost limit must be a non-negative number of dollars, got {value!r}")
    return float(value)


@frozen(kw_only=True)
class Budget:
    """Limits on what a run and a session may spend. ``None`` means no limit."""

    run_tokens: int | None = field(default=None, converter=_token_limit)
    session_tokens: int | None = field(default=None, converter=_token_limit)
    run_cost: float | None = field(default=None, converter=_cost_limit)  # US dollars
    session_cost: float | None = field(default=None, converter=_cost_limit)

    @property
    def limits_cost(self) -> bool:
        return self.run_cost is not None or self.session_cost is not None


@frozen
class ThinkingBlock:
    """The model's reasoning before its answer, as the provider returned it.

    ``signature`` is opaque: the provider signs the reasoning so that it can be handed
    back unchanged in later requests (the Anthropic API requires this while a tool-use
    loop continues with extended thinking on). Never edited, never re-built.
    """

    thinking: str
    signature: str


@frozen
class RedactedThinkingBlock:
    """Reasoning the provider returned encrypted (``data``, opaque); handed back verbatim."""

    data: str


# One reasoning block of a reply; the log tags each with ``type`` ("thinking" or
# "redacted_thinking", the API's own names) so the two shapes never need guessing.
Thinking = ThinkingBlock | RedactedThinkingBlock


@frozen(kw_only=True)
class CompactionPolicy:
    """When a session's context is compacted, and how much of it stays verbatim.

    ``threshold``: compact once the input tokens the last reply reported reach this
    share of the model's context window (``window``, or the runtime's table of windows
    by model). ``keep_recent``: how many of the latest conversation items (a user turn,
    a model turn with its tool results, a note) stay verbatim after the summary.
    ``auto=False`` compacts only on demand.
    """

    threshold: float = 0.8
    keep_recent: int = 6
    window: int | None = None
    auto: bool = True


@frozen(kw_only=True)
class SessionCreated:
    session_id: str
    system: str | None = None
    request_id: str | None = None
    budget: Budget | None = None  # the session's own budget (perdure.budget)
    # What a submit does while a run is busy, unless the submit says otherwise
    # ("queue", "interrupt", "reject", "steer"); None: queue.
    if_busy: str | None = None
    # A sub-agent's session: the parent session and the call that runs it
    # ("session/call_id"), and the only tools it may use (None: all the runtime's).
    parent: str | None = None
    tools: list[str] | None = None
    # The session's own compaction policy (None: the runtime's).
    compaction: CompactionPolicy | None = None
    at: float


@frozen(kw_only=True)
class SessionForked:
    """This session was made from the history of ``source`` up to ``position`` (a seq).

    Committed in the same transaction as the fork's ``SessionCreated`` and the copies of
    the source's records up to that settled point (the end of a run or of a turn); the
    source is untouched. ``request_id`` makes a fork idempotent.
    """

    session_id: str
    source: str
    position: int  # the source's sequence number the fork was taken at
    request_id: str
    records: int = 0  # how many of the source's records were copied
    at: float


@frozen(kw_only=True)
class InputAccepted:
    """User input, durable before the caller is answered. ``body_hash`` backs request_id dedup."""

    session_id: str
    submission_id: str
    request_id: str
    text: str
    body_hash: str
    budget: Budget | None = None  # replaces the session's budget from this input on
    # The run this input interrupted (if_busy="interrupt"): its CancelRequested is in the
    # same commit. None for an input that waited its turn.
    interrupts: str | None = None
    # The caller's W3C trace context (a ``traceparent``), if it gave one: the runs of
    # this input are children of the caller's span (perdure.observability).
    traceparent: str = ""
    at: float


@frozen(kw_only=True)
class RunStarted:
    """A run processes one submission. A resumed run names the run it continues."""

    session_id: str
    run_id: str
    submission_id: str
    goal_rev: int
    resumed_from: str | None = None
    resume_attempt: int = 0
    # The W3C trace context of this run's span, stamped by the shell's tracing when
    # the run starts ("" without tracing), so that a process resuming the run after a
    # crash continues the same trace and links to this span.
    traceparent: str = ""
    at: float


@frozen(kw_only=True)
class RunFinished:
    session_id: str
    run_id: str
    submission_id: str
    status: RunStatus
    final_text: str = ""
    reason: str = ""
    usage: Usage = field(factory=Usage)  # of a final failed model attempt, if any
    at: float


# -- generation (one model turn) ------------------------------------------------------


@frozen(kw_only=True)
class GenerationStarted:
    session_id: str
    run_id: str
    generation_id: str
    goal_rev: int
    submission_id: str = ""  # the input this turn answers ("" in logs before it was kept)
    at: float


@frozen(kw_only=True)
class RetryPending:
    """A retryable model error; persisted before the back-off sleep starts."""

    session_id: str
    generation_id: str
    attempt: int  # the attempt that failed; the next one is attempt + 1
    not_before: float  # wall-clock time
    error: str
    usage: Usage = field(factory=Usage)
    model: str = ""  # the model asked (its usage is priced at that model's price)
    provider: str = ""  # who failed ("" in older logs)
    fallback: bool = False  # the next attempt goes to the next provider (FallbackProvider)
    at: float


@frozen(kw_only=True)
class GenerationCompleted:
    """The assistant reply. Committed together with one ToolTaskCreated per call.

    ``thinking`` holds the reply's reasoning blocks in the order the model produced
    them (empty without extended thinking, and in logs written before it existed).
    They precede the reply's text and tool calls when the conversation is sent again.
    """

    session_id: str
    run_id: str
    generation_id: str
    text: str
    submission_id: str = ""  # the input this turn answers ("" in older logs)
    thinking: list[Thinking] = field(factory=list)
    tool_calls: list[ToolCall] = field(factory=list)
    stop_reason: str = "end_turn"
    usage: Usage = field(factory=Usage)
    attempt: int = 1
    provider: str = ""  # which provider answered ("" in older logs)
    model: str = ""  # the model that answered, as the vendor reported it
    response_id: str = ""  # the vendor's id of the response
    at: float


# -- tool task ------------------------------------------------------------------------


@frozen(kw_only=True)
class ToolTaskCreated:
    session_id: str
    generation_id: str  # "" for a compensation, which no model turn asked for
    call_id: str
    tool_name: str
    input: dict[str, Any]
    goal_rev: int
    compensates: str | None = None  # the call id this task undoes (a compensation)
    secret: list[str] = field(factory=list)  # the input's secret parameters (redacted)
    # A goal-dependent call run again under a newer revision (``goal_rev``): the call
    # whose earlier result it replaces for the model. None for a call of the model.
    rerun_of: str | None = None
    at: float


@frozen(kw_only=True)
class ToolAwaitingApproval:
    session_id: str
    call_id: str
    reason: str = ""
    at: float


@frozen(kw_only=True)
class ApprovalDecided:
    session_id: str
    call_id: str
    approved: bool
    request_id: str
    note: str = ""
    at: float


@frozen(kw_only=True)
class ToolExecuting:
    """Committed BEFORE the side effect: what will run, under which policy and key."""

    session_id: str
    call_id: str
    run_id: str
    tool_name: str
    args: dict[str, Any]  # the effective, validated arguments
    replay: ReplayName
    idempotency_key: str
    fingerprint: str  # canonical hash of (tool, definition, args)
    tool_hash: str  # hash of the tool's definition when dispatched
    attempt: int = 1
    at: float
    policy_reason: str = ""  # why the tool has this policy (e.g. an MCP tool's annotations)
    secret: list[str] = field(factory=list)  # the args' secret parameters (redacted)
    # The version of the tool (``@tool(version=...)``) the call runs on, for a
    # compensation the version of the tool whose compensation it is; the call finishes
    # on it while it is registered. None in logs written before versions were recorded.
    tool_version: str | None = None


@frozen(kw_only=True)
class ToolHeartbeat:
    """The latest progress a running call reported (``ctx.heartbeat``), committed throttled.

    A later attempt of the call (a retry, or a re-run after a crash) receives
    ``details`` as ``ctx.last_heartbeat``.
    """

    session_id: str
    call_id: str
    attempt: int  # the attempt that reported it
    details: Any = None  # a JSON value chosen by the tool
    at: float


@frozen(kw_only=True)
class AgentStarted:
    """A running call started a sub-agent: the parent's end of the parent -> child link.

    The child session ``child`` was created (with its task) for this call's attempt
    ``attempt``; its ``SessionCreated.parent`` names this call, the other end. The
    runtime pauses, resumes and watches a call's children through these. (Logs written
    before this record named a call's children in a heartbeat, ``{"agents": [...]}``,
    which the fold still reads.)
    """

    session_id: str
    call_id: str
    attempt: int
    child: str
    at: float


@frozen(kw_only=True)
class ToolRetryPending:
    """A SAFE or KEYED call failed transiently; persisted BEFORE the back-off starts.

    The next attempt (``attempt + 1``, same arguments and idempotency key) gets its
    own ``ToolExecuting`` record once ``not_before`` (wall clock) has passed; a
    restart meanwhile waits out the remainder.
    """

    session_id: str
    call_id: str
    attempt: int  # the attempt that failed
    not_before: float  # wall-clock time
    error: str
    at: float


@frozen(kw_only=True)
class ToolAwaitingHuman:
    """The call waits for ``rt.resolve``: an attempt ended with ``NeedsHuman``, or (with
    ``unknown_outcome``) its outcome is unknown and its tool asks a person to say it.

    For an unknown outcome the person's three answers are the usual actions: the call
    was *applied* (``skip``, with the result they state), *not applied* (``retry``: run
    once more with the same key), or *failed* (``fail``).
    """

    session_id: str
    call_id: str
    attempt: int  # the attempt that asked (or whose outcome is unknown)
    reason: str
    # Interrupted, timed out, or a reconcile that could not tell, under a tool declared
    # ``unknown_outcome="ask_person"``. False in logs written before it existed.
    unknown_outcome: bool = False
    at: float


@frozen(kw_only=True)
class ResolutionDecided:
    """A person's answer to a call awaiting one: run it again, record a result, or fail it.

    ``retry`` is followed by the call's next ``ToolExecuting``; ``skip`` and ``fail`` by
    its ``ToolCompleted`` in the same commit.
    """

    session_id: str
    call_id: str
    action: ResolutionAction
    request_id: str
    result: Any = None  # skip: the call's result; fail: what the model is told, if given
    at: float


@frozen(kw_only=True)
class ToolCompleted:
    session_id: str
    call_id: str
    output: str
    is_error: bool = False
    kind: ToolResultKind = "ok"
    attempt: int = 1
    duration: float = 0.0
    terminate: bool = False  # the tool ended the run with this result
    # The goal revision the result answers (its call's). None in logs written before it
    # was recorded: the call's ToolTaskCreated says the same.
    goal_rev: int | None = None
    at: float


@frozen(kw_only=True)
class ToolOutcomeUnknown:
    """Recovery (or a timeout) could not learn whether the effect happened; said to the model."""

    session_id: str
    call_id: str
    output: str
    reason: str
    at: float


@frozen(kw_only=True)
class ToolCancelled:
    session_id: str
    call_id: str
    output: str
    reason: str
    while_executing: bool = False
    at: float


# -- changes of course ----------------------------------------------------------------


@frozen(kw_only=True)
class WorkspaceCheckpointed:
    """A workspace call's snapshots: the workspace before its attempt and after it.

    Committed with the call's result (or with what recovery decided for an interrupted
    call). ``before`` and ``after`` are trees of the workspace history store
    (``perdure.tools.history``), taken by the tool actor around the tool's function;
    the ``before`` tree is kept in the store, durably, before the tool starts, so a
    recovery finds it by the call's key and attempt. ``changed`` names the files
    that differ; ``skipped`` the files left out of a snapshot for their size.
    """

    session_id: str
    call_id: str
    attempt: int
    before: str
    after: str
    changed: list[str] = field(factory=list)
    skipped: list[str] = field(factory=list)
    # Files that changed between this session's previous checkpoint and ``before``:
    # the workspace is shared (another session or runtime) or was edited by hand.
    outside: list[str] = field(factory=list)
    at: float


@frozen(kw_only=True)
class WorkspaceRestoreStarted:
    """A rewind of the workspace's files to ``tree`` (the state at log position
    ``position``) was accepted; committed before any file is touched, so a crash
    halfway through the restore finishes it after the restart."""

    session_id: str
    tree: str
    position: int
    request_id: str
    at: float


@frozen(kw_only=True)
class WorkspaceRestored:
    """The restore begun by ``request_id`` is over: the files match ``tree``, or it was
    refused (``error``, e.g. a damaged store) and nothing was written."""

    session_id: str
    request_id: str
    tree: str
    before: str = ""  # the workspace just before the restore (a rewind can be undone)
    error: str = ""
    at: float


@frozen(kw_only=True)
class CancelRequested:
    session_id: str
    run_id: str
    request_id: str
    compensable: list[str] = field(factory=list)  # completed calls that can be undone
    at: float


@frozen(kw_only=True)
class GoalRevised:
    session_id: str
    goal_rev: int
    text: str
    request_id: str
    compensable: list[str] = field(factory=list)  # completed calls of the old goal
    budget: Budget | None = None  # replaces the session's budget from this revision on
    steered: bool = False  # a submit with if_busy="steer" made it (dedup as a submit)
    at: float


@frozen(kw_only=True)
class CompensationRequested:
    """Undo a completed call: committed with the compensation's own tool task."""

    session_id: str
    call_id: str  # the completed call to undo
    compensation_id: str  # the call id of the compensation task
    request_id: str
    automatic: bool = False  # the tool declared its compensation safe to run unasked
    at: float


@frozen(kw_only=True)
class CompensationFinished:
    """The compensation task is terminal (its result record is in the same commit)."""

    session_id: str
    compensation_id: str
    at: float


@frozen(kw_only=True)
class SessionPaused:
    """Nothing new is dispatched (no model call, no tool) until SessionResumed."""

    session_id: str
    request_id: str
    at: float


@frozen(kw_only=True)
class SessionResumed:
    session_id: str
    request_id: str
    at: float


# -- context compaction ---------------------------------------------------------------
#
# Conversation items are counted as the fold counts them (``SessionState.conversation``):
# a compaction covers the items ``[0, end)``, summarising the previous summary (which
# covered ``[0, start)``) and the items ``[start, end)``. The log keeps every record; only
# what the model is sent changes.


@frozen(kw_only=True)
class CompactionStarted:
    """A summary of the conversation items ``[start, end)`` is to be made.

    Committed before the summary's model call; a restart that finds it without a result
    makes the call again (a model call has no effects).
    """

    session_id: str
    compaction_id: str
    run_id: str = ""  # the run it happens in ("" when asked for while idle)
    start: int
    end: int
    tokens_before: int  # the input tokens the last reply reported (0: not known)
    window: int = 0  # the context window it was measured against (0: not known)
    reason: str = ""  # "auto" or "requested"
    request_id: str | None = None  # of an on-demand compaction
    at: float


@frozen(kw_only=True)
class CompactionRetryPending:
    """The summary's model call failed and will be made again after ``not_before``."""

    session_id: str
    compaction_id: str
    attempt: int  # the attempt that failed
    not_before: float
    error: str
    usage: Usage = field(factory=Usage)
    model: str = ""
    provider: str = ""
    fallback: bool = False
    at: float


@frozen(kw_only=True)
class ContextCompacted:
    """The summary of the conversation items ``[0, end)``: the model sees it in their place.

    ``tokens_after`` is an estimate (the share of characters the summary leaves, applied
    to ``tokens_before``); the next reply reports the real count.
    """

    session_id: str
    compaction_id: str
    start: int
    end: int
    summary: str
    tokens_before: int = 0
    tokens_after: int = 0
    model: str = ""
    provider: str = ""
    usage: Usage = field(factory=Usage)
    attempt: int = 1
    at: float


@frozen(kw_only=True)
class CompactionAbandoned:
    """No summary could be made (the provider failed past its retries, the budget was
    spent, the summary was empty): nothing was cut, the history stays whole."""

    session_id: str
    compaction_id: str
    reason: str
    usage: Usage = field(factory=Usage)  # of the last failed attempt
    model: str = ""
    at: float


# -- recovery and supervision ---------------------------------------------------------


@frozen(kw_only=True)
class RecoveryDecision:
    """What a restart found for one piece of pending work, and what it decided."""

    session_id: str
    run_id: str
    subject: str  # a call id, generation id, run id or submission id
    found: str  # e.g. "executing", "retry_pending", "model request in flight"
    action: str  # e.g. "re-run", "reconcile", "outcome unknown", "resume run"
    reason: str
    at: float


@frozen(kw_only=True)
class SessionParked:
    """The supervisor gave up on a session whose actor kept crashing."""

    session_id: str
    reason: str
    at: float


@frozen(kw_only=True)
class LogOpened:
    """A process took ownership of the log. A system record: it belongs to no session."""

    epoch: int
    pid: int
    host: str
    at: float
    session_id: str = ""


@frozen(kw_only=True)
class SessionDeleted:
    """A system record: the session ``deleted`` and its records were removed from the log.

    Written in the same transaction as the removal, which the log refuses for a session
    with unfinished work. ``records`` is how many records went (the sequence numbers
    they leave unused are accounted for by ``perdure check``).
    """

    deleted: str
    records: int = 0
    reason: str = ""
    at: float
    session_id: str = ""


Record = (
    SessionCreated
    | SessionForked
    | InputAccepted
    | RunStarted
    | RunFinished
    | GenerationStarted
    | RetryPending
    | GenerationCompleted
    | ToolTaskCreated
    | ToolAwaitingApproval
    | ApprovalDecided
    | ToolExecuting
    | ToolHeartbeat
    | AgentStarted
    | ToolRetryPending
    | ToolAwaitingHuman
    | ResolutionDecided
    | ToolCompleted
    | ToolOutcomeUnknown
    | ToolCancelled
    | WorkspaceCheckpointed
    | WorkspaceRestoreStarted
    | WorkspaceRestored
    | CancelRequested
    | GoalRevised
    | CompensationRequested
    | CompensationFinished
    | SessionPaused
    | SessionResumed
    | CompactionStarted
    | CompactionRetryPending
    | ContextCompacted
    | CompactionAbandoned
    | RecoveryDecision
    | SessionParked
    | LogOpened
    | SessionDeleted
)

RECORD_TYPES: tuple[type[Record], ...] = (
    SessionCreated,
    SessionForked,
    InputAccepted,
    RunStarted,
    RunFinished,
    GenerationStarted,
    RetryPending,
    GenerationCompleted,
    ToolTaskCreated,
    ToolAwaitingApproval,
    ApprovalDecided,
    ToolExecuting,
    ToolHeartbeat,
    AgentStarted,
    ToolRetryPending,
    ToolAwaitingHuman,
    ResolutionDecided,
    ToolCompleted,
    ToolOutcomeUnknown,
    ToolCancelled,
    WorkspaceCheckpointed,
    WorkspaceRestoreStarted,
    WorkspaceRestored,
    CancelRequested,
    GoalRevised,
    CompensationRequested,
    CompensationFinished,
    SessionPaused,
    SessionResumed,
    CompactionStarted,
    CompactionRetryPending,
    ContextCompacted,
    CompactionAbandoned,
    RecoveryDecision,
    SessionParked,
    LogOpened,
    SessionDeleted,
)

# The current format version of each record type (see the module docstring).
RECORD_VERSIONS: dict[str, int] = {cls.__name__: 1 for cls in RECORD_TYPES}

TOOL_TERMINAL_RECORDS = (ToolCompleted, ToolOutcomeUnknown, ToolCancelled)


@frozen
class Committed:
    """A record as it stands in the log, with its global sequence number."""

    seq: int
    record: Record


def active_delta(record: Record) -> int | None:
    """How a record changes its session's count of unfinished work (inputs, compensations,
    context compactions).

    The log keeps this count in its ``active`` index in the same transaction as the
    record, so start-up reads only sessions with unfinished work. ``None`` means
    "the session is no longer active, whatever the count" (a parked session).
    """
    if isinstance(
        record,
        InputAccepted | CompensationRequested | WorkspaceRestoreStarted | CompactionStarted,
    ):
        return 1  # a compaction is unfinished work: a restart makes its summary
    if isinstance(record, RunFinished) and record.status in FINAL_RUN_STATUSES:
        return -1
    if isinstance(
        record, CompensationFinished | WorkspaceRestored | ContextCompacted | CompactionAbandoned
    ):
        return -1
    if isinstance(record, SessionParked):
        return None
    return 0
