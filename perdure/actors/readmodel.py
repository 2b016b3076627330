"""The read model out of the fold: a session's state answered as ``perdure.view`` records.

The fold (``perdure.actors.state``) keeps a session in mutable dicts shaped for the
core's decisions. The edges (commit observers, a function given to ``Runtime.state``,
``Runtime.view``) are shown a ``StateLookup`` instead: a thin handle on the state that
answers ``perdure.SessionLookup``'s questions with frozen records, each built when asked
and never changed by later commits. It copies nothing up front, so handing one to every
commit costs nothing for the turns nobody asks about.

A lookup reads the live state it was made for: it is valid while the function or the
observer it was handed to runs (inside the session's actor); the records it answers
may be kept.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from attrs import frozen

from perdure.storage.redact import masked
from perdure.view import (
    GenerationView,
    RunView,
    SessionView,
    SubmissionView,
    TaskView,
)

if TYPE_CHECKING:
    from perdure.actors.entities import Run, Task
    from perdure.actors.state import SessionState
    from perdure.storage.records import RecoveryDecision, RetryPending, ToolExecuting

__all__ = ["StateLookup", "session_view"]


@frozen
class StateLookup:
    """A ``perdure.SessionLookup`` over one session's folded state."""

    state: SessionState

    @property
    def session_id(self) -> str:
        return self.state.session_id

    def submission_view(self, submission_id: str) -> SubmissionView | None:
        sub = self.state.submissions.get(submission_id)
        if sub is None:
            return None
        return SubmissionView(
            submission_id=sub.submission_id,
            request_id=sub.request_id,
            text=sub.text,
            at=sub.at,
            seq=sub.seq,
            runs=tuple(sub.runs),
            generations=tuple(sub.generations),
            outcome=sub.outcome,
            traceparent=sub.traceparent,
        )

    def run_view(self, run_id: str) -> RunView | None:
        run = self.state.runs.get(run_id)
        return _run_view(run) if run is not None else None

    def run_views(self) -> tuple[RunView, ...]:
        return tuple(_run_view(run) for run in self.state.runs.values())

    def generation_view(self, generation_id: str) -> GenerationView | None:
        gen = self.state.generations.get(generation_id)
        if gen is None:
            return None
        return GenerationView(
            generation_id=gen.generation_id,
            run_id=gen.run_id,
            submission_id=gen.submission_id,
            phase=gen.phase,
            attempt=gen.attempt,
            model=gen.model,
            usage=gen.usage,
            failures=gen.failures,
            reply=gen.reply,
            call_ids=gen.call_ids,
        )

    def task_view(self, call_id: str) -> TaskView | None:
        task = self.state.tasks.get(call_id)
        return _task_view(task) if task is not None else None

    def task_views(self) -> tuple[TaskView, ...]:
        return tuple(_task_view(task) for task in self.state.tasks.values())

    def recovery_decisions(self) -> tuple[RecoveryDecision, ...]:
        return tuple(self.state.decisions)

    def tool_attempt(self, call_id: str) -> ToolExecuting | None:
        task = self.state.tasks.get(call_id)
        return task.executing if task is not None else None

    def model_failures(self, generation_id: str) -> tuple[RetryPending, ...]:
        gen = self.state.generations.get(generation_id)
        return gen.failures if gen is not None else ()

    def open_submission(self) -> SubmissionView | None:
        """The earliest unanswered input (the one that runs, or runs next)."""
        open_subs = [s for s in self.state.submissions.values() if s.outcome is None]
        if not open_subs:
            return None
        return self.submission_view(min(open_subs, key=lambda s: s.seq).submission_id)

    def view(self) -> SessionView:
        """A frozen snapshot of the session's headline facts (``Runtime.view``)."""
        state = self.state
        waiting = state.open_tasks()
        return SessionView(
            session_id=state.session_id,
            created=state.created,
            parent=state.parent,
            forked_from=state.forked.source if state.forked is not None else None,
            goal_rev=state.goal_rev,
            paused=state.paused,
            parked=state.parked,
            idle=state.idle,
            current_run=state.run.run_id if state.run is not None else None,
            queued=tuple(state.queue),
            awaiting_approval=tuple(t.call_id for t in waiting if t.phase == "awaiting_approval"),
            awaiting_human=tuple(t.call_id for t in waiting if t.phase == "awaiting_human"),
            usage=state.usage,
            spend=tuple(state.spend.items()),
            last_outcome=state.last_outcome,
            last_seq=state.last_seq,
        )


def session_view(state: SessionState) -> SessionView:
    """``StateLookup(state).view()``: what ``Runtime.view`` reads inside the actor."""
    return StateLookup(state).view()


def _run_view(run: Run) -> RunView:
    return RunView(
        run_id=run.run_id,
        submission_id=run.submission_id,
        goal_rev=run.goal_rev,
        resume_attempt=run.resume_attempt,
        resumed_from=run.resumed_from,
        started_at=run.started_at,
        cancel_requested=run.cancel_requested,
        finished=run.finished,
        usage=run.usage,
        traceparent=run.traceparent,
    )


def _task_view(task: Task) -> TaskView:
    return TaskView(
        call_id=task.call_id,
        generation_id=task.generation_id,
        tool_name=task.tool_name,
        input=MappingProxyType(masked(task.input, task.secret)),
        goal_rev=task.goal_rev,
        phase=task.phase,
        terminal=task.terminal,
        attempt=task.attempt,
        executing=task.executing,
        result=task.result,
        last_error=task.last_error,
        not_before=task.not_before,
        last_heartbeat=task.last_heartbeat,
        compensates=task.compensates,
        children=task.children,
    )
