"""The lifecycles of docs/DESIGN.md §3 as literal tables, which the fold enforces.

A tool task and a model turn each move through phases, and every move is caused by
one committed record. The tables below say which record may move which phase to
which: ``(phase before, event) -> phase after``, ``None`` standing for "not there
yet". The fold (``state.py``) looks every move up and refuses one that is not
listed (``ImpossibleTransition``), so a decision that would write a record the
lifecycle does not allow fails in the core, where it is made, instead of folding
into a state no process should have; and a log that holds such a move is reported,
naming the session, the call and the two phases.

An event is the record's type name; two records carry a choice that leads to
different phases, and their event names the choice: ``ApprovalDecided(approved)``
or ``ApprovalDecided(denied)``, and ``ResolutionDecided(retry|skip|fail)``.

Nothing here performs I/O; it is a table and the lookup. A phase with no way out
other than those listed here is a bug of the table, not of the log: the golden logs
of every released format fold through it (``tests/golden``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, get_args

TaskPhase = Literal[
    "created",
    "awaiting_approval",
    "approved",
    "denied",
    "executing",
    "retry_pending",  # an attempt failed; the next one waits for its not_before
    "awaiting_human",  # an attempt raised NeedsHuman; a person decides (rt.resolve)
    "completed",
    "outcome_unknown",
    "cancelled",
]
GenerationPhase = Literal["started", "retry_pending", "completed"]

TASK_PHASES: Final[tuple[TaskPhase, ...]] = get_args(TaskPhase)
GENERATION_PHASES: Final[tuple[GenerationPhase, ...]] = get_args(GenerationPhase)

# Named sets of phases, so that every decision about "which tasks" reads the same.
TERMINAL_PHASES: frozenset[TaskPhase] = frozenset({"completed", "outcome_unknown", "cancelled"})
# Not started, and the next step is the dispatcher's (run it, or record its denial).
DISPATCHABLE_PHASES: frozenset[TaskPhase] = frozenset({"created", "approved", "denied"})
# Between two attempts of a call: the next one starts once its back-off is over.
BACKING_OFF_PHASES: frozenset[TaskPhase] = frozenset({"retry_pending"})
# Work a dead process may have left half done: to be decided by recovery.
IN_FLIGHT_PHASES: frozenset[TaskPhase] = DISPATCHABLE_PHASES | BACKING_OFF_PHASES | {"executing"}
# Nothing happens until a person answers (rt.approve, rt.resolve); a restart keeps waiting.
HUMAN_WAIT_PHASES: frozenset[TaskPhase] = frozenset({"awaiting_approval", "awaiting_human"})
# The call ran and its last attempt failed; it waits for the next one or for a person.
FAILED_ATTEMPT_PHASES: frozenset[TaskPhase] = BACKING_OFF_PHASES | {"awaiting_human"}

# A tool task (a call of the model, or a compensation). The results: ``ToolCompleted``
# also stands for a call that never ran (denied, an unknown tool, invalid arguments,
# a pending retry given up), ``ToolCancelled`` for one called off before it ran or
# stopped while it ran, ``ToolOutcomeUnknown`` only for one that was executing.
TASK_TRANSITIONS: Final[dict[tuple[TaskPhase | None, str], TaskPhase]] = {
    (None, "ToolTaskCreated"): "created",
    ("created", "ToolAwaitingApproval"): "awaiting_approval",
    ("created", "ToolExecuting"): "executing",
    ("created", "ToolCompleted"): "completed",
    ("created", "ToolCancelled"): "cancelled",
    ("awaiting_approval", "ApprovalDecided(approved)"): "approved",
    ("awaiting_approval", "ApprovalDecided(denied)"): "denied",
    ("awaiting_approval", "ToolCancelled"): "cancelled",
    ("approved", "ToolExecuting"): "executing",
    ("approved", "ToolCompleted"): "completed",
    ("approved", "ToolCancelled"): "cancelled",
    ("denied", "ToolCompleted"): "completed",
    ("denied", "ToolCancelled"): "cancelled",
    # A re-run (recovery, a reconcile that found nothing applied) is a new attempt
    # of the same executing call; its heartbeats and sub-agents leave it executing.
    ("executing", "ToolExecuting"): "executing",
    ("executing", "ToolHeartbeat"): "executing",
    ("executing", "AgentStarted"): "executing",  # it started a sub-agent
    ("executing", "ToolRetryPending"): "retry_pending",
    ("executing", "ToolAwaitingHuman"): "awaiting_human",
    ("executing", "ToolCompleted"): "completed",
    ("executing", "ToolOutcomeUnknown"): "outcome_unknown",
    ("executing", "ToolCancelled"): "cancelled",
    ("retry_pending", "ToolExecuting"): "executing",
    ("retry_pending", "ToolCompleted"): "completed",
    ("retry_pending", "ToolCancelled"): "cancelled",
    ("awaiting_human", "ResolutionDecided(retry)"): "retry_pending",
    # skip and fail: the result record follows in the same commit.
    ("awaiting_human", "ResolutionDecided(skip)"): "awaiting_human",
    ("awaiting_human", "ResolutionDecided(fail)"): "awaiting_human",
    ("awaiting_human", "ToolCompleted"): "completed",
    ("awaiting_human", "ToolCancelled"): "cancelled",
    # A call whose outcome is unknown, waiting for a person, when its run is called off
    # (cancelled, revised, given up): its outcome stays unknown, and the model is told.
    ("awaiting_human", "ToolOutcomeUnknown"): "outcome_unknown",
}

# A model turn: called, failed and waiting for its retry (any number of times),
# answered. A reply of an old revision is discarded before it is recorded.
GENERATION_TRANSITIONS: Final[dict[tuple[GenerationPhase | None, str], GenerationPhase]] = {
    (None, "GenerationStarted"): "started",
    ("started", "RetryPending"): "retry_pending",
    ("started", "GenerationCompleted"): "completed",
    ("retry_pending", "RetryPending"): "retry_pending",
    ("retry_pending", "GenerationCompleted"): "completed",
}


class ImpossibleTransition(Exception):
    """A record that the lifecycle does not allow in the phase its subject is in."""

    def __init__(self, session_id: str, subject: str, phase: str | None, event: str) -> None:
        self.session_id = session_id
        self.subject = subject
        self.phase = phase
        self.event = event
        where = "before it exists" if phase is None else f"in phase {phase!r}"
        super().__init__(
            f"session {session_id}: {event} for {subject} {where} is not a transition of "
            "its lifecycle (docs/DESIGN.md §3)"
        )


def task_moves(session_id: str, call_id: str, phase: TaskPhase | None, event: str) -> TaskPhase:
    """The phase a tool task enters on ``event``, or ``ImpossibleTransition``."""
    after = TASK_TRANSITIONS.get((phase, event))
    if after is None:
        raise ImpossibleTransition(session_id, f"tool call {call_id}", phase, event)
    return after


def generation_moves(
    session_id: str, generation_id: str, phase: GenerationPhase | None, event: str
) -> GenerationPhase:
    """The phase a model turn enters on ``event``, or ``ImpossibleTransition``."""
    after = GENERATION_TRANSITIONS.get((phase, event))
    if after is None:
        raise ImpossibleTransition(session_id, f"model turn {generation_id}", phase, event)
    return after


def _check_table(table: Mapping[tuple[Any, str], str], phases: tuple[str, ...]) -> None:
    """Every phase named is known and every phase is entered: a typo fails at import."""
    named = {before for before, _ in table} | set(table.values())
    unknown = sorted(str(phase) for phase in named - {None, *phases})
    unreached = sorted(set(phases) - set(table.values()))
    if unknown or unreached:
        raise ImportError(
            f"lifecycle table: unknown phases {unknown}, phases no transition enters {unreached}"
        )


_check_table(TASK_TRANSITIONS, TASK_PHASES)
_check_table(GENERATION_TRANSITIONS, GENERATION_PHASES)
