"""The things a session's fold keeps track of: its runs, model turns, tool calls,
inputs and the entries of its conversation.

``perdure.actors.state`` folds records into these; the core's decisions read them.
They are mutable (``attrs.define``) because the fold moves them through their phases
in place, one record at a time; nothing outside the core holds them (the edges read
the frozen records of ``perdure.view``). No I/O, no clock, no trio.
"""

from __future__ import annotations

from typing import Any

from attrs import define, field

from perdure.actors.lifecycle import TERMINAL_PHASES, GenerationPhase, TaskPhase
from perdure.storage.records import (
    CompactionRetryPending,
    CompactionStarted,
    GenerationCompleted,
    RetryPending,
    RunFinished,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    Usage,
)

ToolResultRecord = ToolCompleted | ToolOutcomeUnknown | ToolCancelled
NO_USAGE = Usage()  # frozen: one shared zero


@define
class Task:
    """One tool call of the model, through its phases."""

    call_id: str
    generation_id: str
    tool_name: str
    input: dict[str, Any]
    goal_rev: int
    phase: TaskPhase = "created"
    executing: ToolExecuting | None = None
    result: ToolResultRecord | None = None
    stale: bool = False  # became terminal after a newer goal revision was in force
    lineage: str = ""  # the submission whose run created it ("compensation" otherwise)
    compensates: str | None = None  # for a compensation: the call it undoes
    compensated_by: str | None = None  # the compensation requested for this call
    secret: list[str] = field(factory=list)  # the input's secret parameters (masked in views)
    # When an attempt failed (retry_pending, awaiting_human): what went wrong, and when
    # the next attempt may start (a person's retry may start at once).
    last_error: str = ""
    not_before: float | None = None
    retry_by_human: bool = False  # the pending retry was a person's choice
    # awaiting_human because its outcome is unknown (not because it raised NeedsHuman)
    unknown_outcome: bool = False
    rerun_of: str | None = None  # a goal-dependent call run again under a newer revision
    reruns: dict[int, str] = field(factory=dict)  # revision -> the call run again under it
    last_heartbeat: ToolHeartbeat | None = None  # the latest committed, of any attempt
    children: tuple[str, ...] = ()  # the sub-agent sessions it started, in order
    # The tool version the call is pinned to: its executing record's, or for a
    # compensation not yet run, that of the call it undoes (None: not started, or a
    # log older than versions). It finishes on that version while it is registered.
    pinned_version: str | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def attempt(self) -> int:
        return self.executing.attempt if self.executing else 0

    @property
    def result_rev(self) -> int:
        """The goal revision the call's result answers (its call's, in older logs)."""
        recorded = getattr(self.result, "goal_rev", None)
        return recorded if isinstance(recorded, int) else self.goal_rev


@define
class Generation:
    """One model turn."""

    generation_id: str
    run_id: str
    submission_id: str
    goal_rev: int
    phase: GenerationPhase = "started"
    attempt: int = 1  # the attempt to make next (or the one that succeeded)
    not_before: float | None = None
    last_error: str = ""
    reply: GenerationCompleted | None = None
    # Tuples, not lists: set once (call_ids) or rarely grown (failures); an empty tuple
    # costs nothing, and the garbage collector stops tracking tuples of strings.
    call_ids: tuple[str, ...] = ()
    usage: Usage = NO_USAGE
    model: str = ""  # the model asked (from a retry record) or that answered
    failures: tuple[RetryPending, ...] = ()  # the failed attempts, in order


@define
class Run:
    run_id: str
    submission_id: str
    goal_rev: int
    resume_attempt: int
    resumed_from: str | None
    started_at: float
    cancel_requested: bool = False
    progressed: bool = False  # a reply or a tool result was committed during this run
    finished: RunFinished | None = None
    usage: Usage = NO_USAGE  # frozen: one shared zero
    spend: dict[str, Usage] = field(factory=dict)  # usage by model, for budgets
    traceparent: str = ""  # the trace context of the run's span (perdure.observability)


@define
class Submission:
    submission_id: str
    request_id: str
    text: str
    body_hash: str
    at: float
    seq: int = 0
    runs: list[str] = field(factory=list)
    generations: list[str] = field(factory=list)
    outcome: RunFinished | None = None
    traceparent: str = ""  # the caller's trace context, if it gave one


@define
class RequestSeen:
    """A request id already used in this session: for idempotent retries of commands."""

    kind: str
    body_hash: str
    ref: str  # what it produced (a submission id, a call id, a run id, a revision)
    seq: int = 0
    disposition: str = "queued"  # of a submit: queued, interrupted or steered


# One entry of the conversation, in order. The model's view is built from these.
@define
class UserTurn:
    submission_id: str


@define
class AssistantTurn:
    generation_id: str


@define
class Note:
    """Text the runtime tells the model (a revision, a cancelled request)."""

    text: str


@define
class Revision:
    """The user revised the request; ``call_ids`` were unfinished at that moment, and
    ``earlier`` had their results already (under the revision each call names)."""

    goal_rev: int
    text: str
    call_ids: list[str]
    earlier: list[str] = field(factory=list)


ConversationItem = UserTurn | AssistantTurn | Note | Revision


@define
class Compensation:
    call_id: str
    compensation_id: str
    automatic: bool


@define
class Compacting:
    """A compaction started and not finished: its summary's model call, by attempt."""

    started: CompactionStarted
    attempt: int = 1  # the attempt to make next
    not_before: float | None = None
    last_error: str = ""
    failures: tuple[CompactionRetryPending, ...] = ()  # the failed attempts, in order
