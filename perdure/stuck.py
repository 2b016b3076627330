"""Stuck runs: which sessions have work unfinished and no committed progress for a while.

*Progress* is a record committed for the session: every step of a run (a model turn
started, retried or answered, a tool call created, approved, started, heartbeating or
finished, a person's decision) commits one, so the time of a session's latest record
is when it last moved. A session whose work is unfinished (an input waiting or running,
a compensation open) and whose latest record is older than the threshold is *stuck*,
and ``waiting_for`` says on what: the model, a tool (by name), an approval, a person,
a back-off, a sub-agent, a paused or parked session, or a run not started yet.

Everything here is a pure function of a session's state and a time: nothing is kept
per turn, the answer is computed when someone asks (``perdure sessions --stuck``,
``Runtime.stuck_runs``, the metrics scrape, the page's list).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from attrs import frozen

from perdure.storage.records import Committed

if TYPE_CHECKING:
    from perdure.actors.entities import Task
    from perdure.actors.state import SessionState

__all__ = [
    "DEFAULT_STUCK_AFTER",
    "WAITING_KINDS",
    "StuckRun",
    "Waiting",
    "WaitingKind",
    "last_progress_at",
    "stuck_run",
    "waiting_for",
]

# Ten minutes: longer than a slow model turn with its retries, shorter than anyone
# would wait for a run without looking at it.
DEFAULT_STUCK_AFTER = 600.0

WaitingKind = Literal[
    "model_call",  # a model turn is in flight (or about to be asked)
    "model_backoff",  # a model turn failed and waits for its next attempt
    "tool_call",  # a tool call runs (or is about to)
    "tool_backoff",  # a tool call failed and waits for its next attempt
    "sub_agent",  # a tool call waits for the sub-agent session it started
    "approval",  # a tool call waits for a person to approve or deny it
    "person",  # a tool call waits for a person to resolve it
    "paused",  # the session is paused with work unfinished
    "parked",  # the session's actor was parked (see its reason)
    "run_start",  # an input is accepted and no run has started for it yet
]
WAITING_KINDS: tuple[WaitingKind, ...] = (
    "model_call",
    "model_backoff",
    "tool_call",
    "tool_backoff",
    "sub_agent",
    "approval",
    "person",
    "paused",
    "parked",
    "run_start",
)


@frozen
class Waiting:
    """What a session's unfinished work waits for."""

    kind: WaitingKind
    detail: str = ""  # the tool's name, the model, the parked reason...
    call_id: str | None = None  # the tool call waited on, if any

    def describe(self) -> str:
        """One line for a person: ``tool_call search (call c1)``."""
        text = self.kind if not self.detail else f"{self.kind} {self.detail}"
        return text if self.call_id is None else f"{text} (call {self.call_id})"


@frozen
class StuckRun:
    """A session with unfinished work and no committed progress for ``idle_for`` seconds."""

    session_id: str
    run_id: str | None  # None: no run is in progress (paused, parked, not started)
    waiting: Waiting
    last_progress_at: float  # the ``at`` of the session's latest record
    idle_for: float


# The order in which a turn's open calls are named: a person's wait first (nothing
# moves without them), then back-offs and calls in flight.
_TASK_ORDER: dict[str, int] = {
    "awaiting_human": 0,
    "awaiting_approval": 1,
    "retry_pending": 2,
    "executing": 3,
}


def waiting_for(state: SessionState) -> Waiting | None:
    """What the session's unfinished work waits for; ``None`` if it has none (idle)."""
    if state.idle:
        return None
    if state.parked is not None:
        return Waiting("parked", state.parked)
    if state.paused:
        return Waiting("paused")
    open_tasks = state.open_tasks() if state.run is not None else state.open_compensations()
    if open_tasks:
        task = min(open_tasks, key=lambda t: _TASK_ORDER.get(t.phase, len(_TASK_ORDER)))
        return _task_waiting(task)
    if state.run is None:
        return Waiting("run_start")
    gen = state.current_generation()
    if gen is not None and gen.phase == "retry_pending":
        return Waiting("model_backoff", gen.model)
    model = gen.model if gen is not None else ""
    return Waiting("model_call", model)


def _task_waiting(task: Task) -> Waiting:
    if task.phase == "awaiting_human":
        return Waiting("person", task.tool_name, task.call_id)
    if task.phase == "awaiting_approval":
        return Waiting("approval", task.tool_name, task.call_id)
    if task.phase == "retry_pending":
        return Waiting("tool_backoff", task.tool_name, task.call_id)
    if task.children:
        return Waiting("sub_agent", task.children[-1], task.call_id)
    return Waiting("tool_call", task.tool_name, task.call_id)


def last_progress_at(latest: Sequence[Committed]) -> float | None:
    """The time of the latest of the session's records (``None``: no timed record)."""
    for c in reversed(latest):
        at = getattr(c.record, "at", None)
        if isinstance(at, int | float):
            return float(at)
    return None


def stuck_run(
    state: SessionState, last_progress: float, *, now: float, after: float
) -> StuckRun | None:
    """The session as a stuck run if it has unfinished work and its latest record is
    more than ``after`` seconds older than ``now``; otherwise ``None``."""
    if after < 0:
        raise ValueError(f"the stuck threshold must be 0 seconds or more, not {after}")
    idle_for = now - last_progress
    if idle_for < after:
        return None
    waiting = waiting_for(state)
    if waiting is None:
        return None
    run_id = state.run.run_id if state.run is not None else None
    return StuckRun(state.session_id, run_id, waiting, last_progress, idle_for)
