"""The read model: what the edges may know of a session, as frozen records.

The fold (``perdure.actors.state``) keeps a session's state in mutable dicts shaped for
the core's decisions; they change with every commit and their shape is the core's to
change. The edges (observability, the daemon's frontends, the embedding faces) read
this module's records instead, which ``perdure.actors.readmodel`` builds from the fold's
state on demand:

* ``SessionLookup`` is what a commit observer and a function given to
  ``Runtime.state`` may ask of a session: one submission, run, model turn or tool call
  by its id (or every run and every call, in order), each a small frozen record made
  when asked. Nothing is built for a turn nobody asks about, so a runtime without
  observers pays nothing per turn for this model.
* ``SessionView`` is a snapshot of the session's headline facts (``Runtime.view``):
  made once per call, safe to keep, and never changed by later commits.

Every record here is frozen; collections are tuples; the log's own records (which are
frozen too) are handed out as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from attrs import frozen

from perdure.storage.records import (
    GenerationCompleted,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    Usage,
)

__all__ = [
    "GenerationView",
    "RunView",
    "SessionLookup",
    "SessionView",
    "SubmissionView",
    "TaskView",
]


@frozen
class SubmissionView:
    """One accepted input and what became of it."""

    submission_id: str
    request_id: str
    text: str
    at: float
    seq: int  # the seq of its InputAccepted record (0 until committed)
    runs: tuple[str, ...]  # the runs that served it, in order
    generations: tuple[str, ...]  # its model turns, in order
    outcome: RunFinished | None  # None: not answered yet
    traceparent: str  # the caller's trace context, if it gave one


@frozen
class RunView:
    """One run of a submission."""

    run_id: str
    submission_id: str
    goal_rev: int
    resume_attempt: int
    resumed_from: str | None
    started_at: float
    cancel_requested: bool
    finished: RunFinished | None  # None: still running (or interrupted by a crash)
    usage: Usage
    traceparent: str  # the trace context of the run's span (perdure.observability)


@frozen
class GenerationView:
    """One model turn: its attempts so far and its reply."""

    generation_id: str
    run_id: str
    submission_id: str
    phase: str
    attempt: int  # the attempt to make next (or the one that succeeded)
    model: str  # the model asked (from a retry record) or that answered
    usage: Usage
    failures: tuple[RetryPending, ...]  # the failed attempts, in order
    reply: GenerationCompleted | None
    call_ids: tuple[str, ...]  # the tool calls of its reply


@frozen
class TaskView:
    """One tool call of the model (or a compensation), through its phases."""

    call_id: str
    generation_id: str
    tool_name: str
    # The model's input to the call, its secret parameters masked; read-only (a view of
    # the fold's own mapping, not a copy).
    input: Mapping[str, Any]
    goal_rev: int  # the goal revision in force when the call was made
    phase: str
    terminal: bool
    attempt: int  # 0: never executed
    executing: ToolExecuting | None  # the latest attempt's record (policy, args, start)
    result: ToolCompleted | ToolOutcomeUnknown | ToolCancelled | None
    last_error: str
    not_before: float | None  # a pending retry's earliest start
    last_heartbeat: ToolHeartbeat | None
    compensates: str | None  # for a compensation: the call it undoes
    children: tuple[str, ...]  # the sub-agent sessions it started, in order


class SessionLookup(Protocol):
    """What may be asked of a session's state, one item at a time, by its id.

    Commit observers receive one (the state as of the commit they observe), and so
    does a function given to ``Runtime.state``. Each answer is made when asked and is
    frozen; ``None`` says no such item is in the session.
    """

    @property
    def session_id(self) -> str: ...

    def submission_view(self, submission_id: str) -> SubmissionView | None: ...

    def run_view(self, run_id: str) -> RunView | None: ...

    def generation_view(self, generation_id: str) -> GenerationView | None: ...

    def task_view(self, call_id: str) -> TaskView | None: ...

    def run_views(self) -> tuple[RunView, ...]:
        """Every run of the session, in the order they started."""
        ...

    def task_views(self) -> tuple[TaskView, ...]:
        """Every tool call of the session (compensations too), in the order made."""
        ...

    def recovery_decisions(self) -> tuple[RecoveryDecision, ...]:
        """What each recovery of the session found and did, in order (the log's records)."""
        ...

    def tool_attempt(self, call_id: str) -> ToolExecuting | None:
        """The ``ToolExecuting`` record of a call's latest attempt (None: never ran).

        The log's own frozen record, handed out as it is: an observer that counts or
        traces every tool result needs no more, and nothing is made for it.
        """
        ...

    def model_failures(self, generation_id: str) -> tuple[RetryPending, ...]:
        """The failed attempts of a model turn, in order (the fold's own tuple)."""
        ...

    def open_submission(self) -> SubmissionView | None:
        """The earliest unanswered input (the one that runs, or runs next)."""
        ...

    def view(self) -> SessionView: ...


@frozen
class SessionView:
    """A snapshot of a session's headline facts (``Runtime.view``)."""

    session_id: str
    created: bool  # False: no such session (nothing committed for it)
    parent: str | None  # a sub-agent's parent call ("session/call_id")
    forked_from: str | None  # the source session of a fork
    goal_rev: int
    paused: bool
    parked: str | None  # why its actor was parked, or None
    idle: bool  # no run in progress, no input waiting, no compensation unfinished
    current_run: str | None
    queued: tuple[str, ...]  # submission ids waiting for a run, in order
    awaiting_approval: tuple[str, ...]  # call ids of the current turn waiting for a person
    awaiting_human: tuple[str, ...]  # call ids of the current turn waiting for a resolution
    usage: Usage
    # Usage by the model that answered ("" when unknown), in the order each was first
    # used: what the session's cost is reckoned from (``perdure.budget.spent_cost``).
    spend: tuple[tuple[str, Usage], ...]
    last_outcome: RunFinished | None
    last_seq: int  # the seq of the session's latest record
