"""``command``: what a caller's command changes (``COMMANDS``).

Submit, cancel, approve, resolve, revise, pause, resume, compensate, rewind (the
workspace's files, while the session is idle), compact the context (``compacting``).
A request id
already seen answers as it did the first time; a command that cannot be done raises
``Refused`` and records nothing. What a submit does while a run is busy is a row of
``IF_BUSY`` (queue, interrupt, reject, steer). A compensation is an ordinary tool
task of its own; a cancel or a revision may start some automatically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from perdure.actors.decide import compacting
from perdure.actors.decide.verbs import registered_for
from perdure.actors.entities import Task
from perdure.actors.protocol import (
    NOTHING,
    Accepted,
    Answer,
    Approve,
    Cancel,
    Command,
    CompactContext,
    Compensate,
    Done,
    Env,
    Pause,
    Resolve,
    RestoreWorkspace,
    Resume,
    Revise,
    Rewind,
    Step,
    Submit,
)
from perdure.actors.state import SessionState
from perdure.errors import Refused, SessionParkedError
from perdure.storage.records import (
    ApprovalDecided,
    Budget,
    CancelRequested,
    CompensationRequested,
    GoalRevised,
    InputAccepted,
    ResolutionDecided,
    SessionPaused,
    SessionResumed,
    ToolCompleted,
    ToolTaskCreated,
    WorkspaceRestoreStarted,
)
from perdure.tools.contract import render_result


def command(s: SessionState, env: Env, cmd: Command) -> tuple[Step, Answer]:
    """Decide a caller's command. Raises ``Refused`` (nothing recorded) when it cannot be done.

    A request id already seen answers as it did the first time if the command is the
    same (kind and body), and is a conflict otherwise; the handlers in ``COMMANDS``
    decide new commands.
    """
    body = cmd.body_hash
    seen = s.requests.get(cmd.request_id)
    if seen is not None:
        if seen.kind == cmd.kind and seen.body_hash == body:
            if isinstance(cmd, Submit):
                answer = Accepted(seen.ref, seen.seq, duplicate=True, disposition=seen.disposition)
                return NOTHING, answer
            return NOTHING, Done(seen.ref, seen.seq, duplicate=True)
        raise Refused(
            "conflict",
            f"request id {cmd.request_id!r} was already used for a different {seen.kind} request",
        )
    if s.parked:
        raise SessionParkedError(s.session_id, s.parked)
    handler: Callable[[SessionState, Env, Any], tuple[Step, Answer]] = COMMANDS[type(cmd)]
    return handler(s, env, cmd)


def _submit(s: SessionState, env: Env, cmd: Submit) -> tuple[Step, Answer]:
    """User input; what it does while the session is busy is the ``IF_BUSY`` row of its
    policy (the submit's own, else the session's default, else ``queue``)."""
    policy = cmd.if_busy or s.if_busy or "queue"
    # The run still working on its request (one being cancelled is winding down already).
    live = s.run if s.run is not None and not s.run.cancel_requested else None
    busy = s.run is not None or bool(s.queue)
    return IF_BUSY[policy if busy else "queue"](s, env, cmd, live)


def _accept(s: SessionState, env: Env, cmd: Submit, interrupts: str | None = None) -> InputAccepted:
    return InputAccepted(
        session_id=s.session_id,
        submission_id=f"in{len(s.submissions) + 1}",
        request_id=cmd.request_id,
        text=cmd.text,
        body_hash=cmd.body_hash,
        budget=cmd.budget,
        interrupts=interrupts,
        traceparent=cmd.traceparent,
        at=env.now,
    )


def _busy_queue(s: SessionState, env: Env, cmd: Submit, live: Any) -> tuple[Step, Answer]:
    """Wait its turn (or run at once when the session is not busy)."""
    record = _accept(s, env, cmd)
    return Step((record,)), Accepted(record.submission_id, 0)


def _busy_interrupt(s: SessionState, env: Env, cmd: Submit, live: Any) -> tuple[Step, Answer]:
    """Cancel the busy run now (the usual wind-down: what has not started is cancelled,
    a cancellable tool is stopped, any other is left to finish and its fate reported),
    and run this input next, ahead of any other waiting input. One commit."""
    if live is None:  # nothing runs (inputs wait, or the run is being cancelled already)
        return _busy_queue(s, env, cmd, live)
    record = _accept(s, env, cmd, interrupts=live.run_id)
    cancelling = _cancel_run(s, env, f"{cmd.request_id}/interrupt")
    answer = Accepted(record.submission_id, 0, disposition="interrupted")
    return Step((record,)) + cancelling, answer


def _busy_reject(s: SessionState, env: Env, cmd: Submit, live: Any) -> tuple[Step, Answer]:
    """Refuse: nothing is recorded, so the same request may be sent again later."""
    doing = f"run {s.run.run_id} is in progress" if s.run is not None else ""
    waiting = f"{len(s.queue)} input(s) wait their turn" if s.queue else ""
    raise Refused(
        "busy",
        f"session {s.session_id} is busy ({'; '.join(filter(None, (doing, waiting)))}); "
        "the input was not recorded (if_busy='reject')",
    )


def _busy_steer(s: SessionState, env: Env, cmd: Submit, live: Any) -> tuple[Step, Answer]:
    """Make the input a revision of the running request (as ``rt.revise`` would)."""
    if live is None:
        return _busy_queue(s, env, cmd, live)
    step = _revision(s, env, cmd.text, cmd.request_id, cmd.budget, steered=True)
    return step, Accepted(live.submission_id, 0, disposition="steered")


IF_BUSY: dict[str, Callable[[SessionState, Env, Submit, Any], tuple[Step, Answer]]] = {
    "queue": _busy_queue,
    "interrupt": _busy_interrupt,
    "reject": _busy_reject,
    "steer": _busy_steer,
}


def _cancel(s: SessionState, env: Env, cmd: Cancel) -> tuple[Step, Answer]:
    if s.run is None:
        return NOTHING, Done("")  # nothing to cancel; no record needed
    if s.run.cancel_requested:
        return NOTHING, Done(s.run.run_id)
    return _cancel_run(s, env, cmd.request_id), Done(s.run.run_id)


def _cancel_run(s: SessionState, env: Env, request_id: str) -> Step:
    """``CancelRequested`` for the current run (and the compensations it triggers)."""
    assert s.run is not None
    done = [
        s.tasks[c]
        for g in s.submissions[s.run.submission_id].generations
        for c in s.generations[g].call_ids
    ]
    compensable = _compensable(env, done)
    record = CancelRequested(
        session_id=s.session_id,
        run_id=s.run.run_id,
        request_id=request_id,
        compensable=compensable,
        at=env.now,
    )
    return Step((record,)) + _automatic_compensations(s, env, compensable, request_id, s.goal_rev)


def _approve(s: SessionState, env: Env, cmd: Approve) -> tuple[Step, Answer]:
    task = s.tasks.get(cmd.call_id)
    if task is None:
        raise Refused("not_found", f"no tool call {cmd.call_id!r} in session {s.session_id}")
    if task.phase != "awaiting_approval":
        raise Refused(
            "invalid_state", f"tool call {cmd.call_id} is {task.phase}, not awaiting approval"
        )
    record = ApprovalDecided(
        session_id=s.session_id,
        call_id=cmd.call_id,
        approved=cmd.approved,
        request_id=cmd.request_id,
        note=cmd.note,
        at=env.now,
    )
    return Step((record,)), Done(cmd.call_id)


def _resolve(s: SessionState, env: Env, cmd: Resolve) -> tuple[Step, Answer]:
    """A person answers a call awaiting one: retry it (same key), skip it, or fail it.

    For a call whose outcome was unknown the same three answers say what happened: not
    applied (retry: run once more, same key), applied (skip: record the result they
    state), or failed."""
    task = s.tasks.get(cmd.call_id)
    if task is None:
        raise Refused("not_found", f"no tool call {cmd.call_id!r} in session {s.session_id}")
    if task.phase != "awaiting_human":
        raise Refused(
            "invalid_state", f"tool call {cmd.call_id} is {task.phase}, not waiting for a person"
        )
    common: dict[str, Any] = {"session_id": s.session_id, "call_id": task.call_id, "at": env.now}
    decided = ResolutionDecided(
        action=cmd.action, request_id=cmd.request_id, result=cmd.result, **common
    )
    if cmd.action == "retry":  # advance runs attempt + 1 with the same key (_retry)
        return Step((decided,)), Done(cmd.call_id)
    if cmd.action == "skip":
        output, is_error = render_result(cmd.result), False
    else:
        told = f" They said: {render_result(cmd.result)}" if cmd.result is not None else ""
        if task.unknown_outcome:  # the person says what happened: it failed
            output = (
                f"perdure: this call's outcome was unknown ({task.last_error}); a person "
                f"checked and said it failed.{told}"
            )
        else:
            output = (
                f"perdure: this call needed a person ({task.last_error}); they chose to fail "
                f"it.{told}"
            )
        is_error = True
    done = ToolCompleted(
        output=output,
        is_error=is_error,
        kind="resolved",
        attempt=task.attempt,
        goal_rev=task.goal_rev,
        **common,
    )
    return Step((decided, done)), Done(cmd.call_id)


def _revise(s: SessionState, env: Env, cmd: Revise) -> tuple[Step, Answer]:
    if s.run is None:
        raise Refused(
            "invalid_state", "no run is in progress to revise; submit a new message instead"
        )
    step = _revision(s, env, cmd.text, cmd.request_id, cmd.budget)
    return step, Done(str(s.goal_rev + 1))


def _revision(
    s: SessionState,
    env: Env,
    text: str,
    request_id: str,
    budget: Budget | None,
    *,
    steered: bool = False,
) -> Step:
    """``GoalRevised`` for the current run (and the compensations it triggers)."""
    rev = s.goal_rev + 1
    old_goal = [t for t in s.tasks.values() if t.goal_rev < rev and t.compensates is None]
    compensable = _compensable(env, old_goal)
    record = GoalRevised(
        session_id=s.session_id,
        goal_rev=rev,
        text=text,
        request_id=request_id,
        compensable=compensable,
        budget=budget,
        steered=steered,
        at=env.now,
    )
    return Step((record,)) + _automatic_compensations(s, env, compensable, request_id, rev)


def _compensate_command(s: SessionState, env: Env, cmd: Compensate) -> tuple[Step, Answer]:
    step = _compensate(s, env, cmd.call_id, cmd.request_id, automatic=False)
    return step, Done(compensation_id(cmd.call_id))


def _pause(s: SessionState, env: Env, cmd: Pause) -> tuple[Step, Answer]:
    if s.paused:
        return NOTHING, Done("")
    record = SessionPaused(session_id=s.session_id, request_id=cmd.request_id, at=env.now)
    return Step((record,)), Done("")


def _resume(s: SessionState, env: Env, cmd: Resume) -> tuple[Step, Answer]:
    if not s.paused:
        return NOTHING, Done("")
    record = SessionResumed(session_id=s.session_id, request_id=cmd.request_id, at=env.now)
    return Step((record,)), Done("")


def _compact_context(s: SessionState, env: Env, cmd: CompactContext) -> tuple[Step, Answer]:
    """Start a compaction now (answered with its id); the one in progress, if any."""
    if s.compacting is not None:
        return NOTHING, Done(s.compacting.started.compaction_id)
    started = compacting.start(s, env, "requested", cmd.request_id)
    if started is None:
        keep = compacting.policy_of(s, env).keep_recent
        raise Refused(
            "invalid_state",
            f"nothing to compact in session {s.session_id}: the conversation has "
            f"{len(s.conversation)} items, {s.compacted_end} already summarised, the last "
            f"{keep} kept verbatim (and any unsettled turn with them)",
        )
    return Step((started,)), Done(started.compaction_id)


def _rewind(s: SessionState, env: Env, cmd: Rewind) -> tuple[Step, Answer]:
    """Restore the workspace's files; only while nothing of the session runs, so that
    no call of its own writes the files while they are put back."""
    busy = []
    if s.run is not None:
        busy.append(f"run {s.run.run_id} is in progress")
    if s.queue:
        busy.append(f"{len(s.queue)} input(s) wait their turn")
    if s.compensations:
        busy.append(f"{len(s.compensations)} compensation(s) are unfinished")
    if s.restoring is not None:
        busy.append(f"the rewind {s.restoring.request_id!r} is still restoring the files")
    if busy:
        raise Refused(
            "invalid_state",
            f"session {s.session_id} cannot rewind its workspace now: {'; '.join(busy)}. "
            "Cancel the run (or wait until the session is idle), then rewind.",
        )
    started = WorkspaceRestoreStarted(
        session_id=s.session_id,
        tree=cmd.tree,
        position=cmd.position,
        request_id=cmd.request_id,
        at=env.now,
    )
    return Step((started,), (RestoreWorkspace(cmd.request_id, cmd.tree),)), Done(cmd.tree)


def compensation_id(call_id: str) -> str:
    return f"comp-{call_id}"


def _compensable(env: Env, tasks: Iterable[Task]) -> list[str]:
    """Completed calls among ``tasks`` that could be undone and were not yet."""
    return [
        t.call_id
        for t in tasks
        if t.phase == "completed"
        and t.compensates is None
        and t.compensated_by is None
        and _has_compensation(env, t)
    ]


def _has_compensation(env: Env, task: Task) -> bool:
    """Whether the version of the tool ``task`` ran on (or the newest, once that
    version is gone) declares a compensation."""
    tool = registered_for(env.tools, task)
    return tool is not None and tool.compensation is not None


def _compensate(
    s: SessionState,
    env: Env,
    call_id: str,
    request_id: str,
    *,
    automatic: bool,
    goal_rev: int | None = None,
) -> Step:
    """A compensation is an ordinary tool task of its own (policy, key, approval)."""
    task = s.tasks.get(call_id)
    if task is None:
        raise Refused("not_found", f"no tool call {call_id!r} in session {s.session_id}")
    if task.compensated_by is not None:
        raise Refused("invalid_state", f"{call_id} is already compensated by {task.compensated_by}")
    if task.phase != "completed" or task.compensates is not None:
        raise Refused(
            "invalid_state", f"{call_id} is {task.phase}; only a completed call can be undone"
        )
    if not _has_compensation(env, task):
        raise Refused("invalid_state", f"the tool {task.tool_name!r} declares no compensation")
    assert task.executing is not None and task.result is not None
    comp_id = compensation_id(call_id)
    requested = CompensationRequested(
        session_id=s.session_id,
        call_id=call_id,
        compensation_id=comp_id,
        request_id=request_id,
        automatic=automatic,
        at=env.now,
    )
    created = ToolTaskCreated(
        session_id=s.session_id,
        generation_id="",
        call_id=comp_id,
        tool_name=task.tool_name,
        input={**task.executing.args, "result": task.result.output},
        goal_rev=s.goal_rev if goal_rev is None else goal_rev,
        compensates=call_id,
        at=env.now,
    )
    return Step((requested, created))


def _automatic_compensations(
    s: SessionState, env: Env, call_ids: list[str], request_id: str, goal_rev: int
) -> Step:
    """Compensations the tools declared safe to run unasked, under ``goal_rev``."""
    step = NOTHING
    for call_id in call_ids:
        tool = registered_for(env.tools, s.tasks[call_id])
        if tool is not None and tool.compensate_automatically:
            auto_id = f"{request_id}/auto/{call_id}"
            step += _compensate(s, env, call_id, auto_id, automatic=True, goal_rev=goal_rev)
    return step


COMMANDS: dict[type, Callable[[SessionState, Env, Any], tuple[Step, Answer]]] = {
    Submit: _submit,
    Cancel: _cancel,
    Approve: _approve,
    Revise: _revise,
    Pause: _pause,
    Resume: _resume,
    Compensate: _compensate_command,
    Resolve: _resolve,
    CompactContext: _compact_context,
    Rewind: _rewind,
}
