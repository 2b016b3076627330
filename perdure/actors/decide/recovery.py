"""``recover``: the recovery table (docs/DESIGN.md §4), for work a dead process left.

It runs once when a session actor starts, on the folded state, before any command
is taken. The run decides first (cancelled: finish cancelling; out of resume budget:
fail; nothing in flight: keep waiting or start the next turn; else close it
``interrupted`` and continue it under a new run), then every open tool call is a
row of ``RECOVER``, keyed by its phase; the same rows serve a run's calls and the
compensations beside it. A phase without a row is an error at import. Every choice
is written down as a ``RecoveryDecision`` in the same commit as what it does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attrs import frozen

from perdure.actors.decide.verbs import (
    ASK_A_PERSON,
    _called_off,
    _definition_change,
    _execute,
    _finish,
    _retry_blocker,
    _unknown,
    _unknown_or_ask,
    asks_a_person,
    every_phase_has_a_row,
    interrupted_text,
    registered_for,
    tool_for,
    version_words,
)
from perdure.actors.entities import Task
from perdure.actors.lifecycle import (
    IN_FLIGHT_PHASES,
    TaskPhase,
)
from perdure.actors.protocol import (
    NOTHING,
    Env,
    Reconcile,
    RestoreWorkspace,
    Step,
)
from perdure.actors.state import SessionState
from perdure.storage.records import (
    Record,
    RecoveryDecision,
    RunFinished,
    RunStarted,
    ToolCancelled,
)
from perdure.tools.contract import ReplayPolicy

Decide = Callable[[str, str, str, str], RecoveryDecision]  # (subject, found, action, reason)


def recover(s: SessionState, env: Env) -> Step:
    """Decide what to do with work a dead process left in flight. Called once at start.

    The repair, the close of the interrupted run and the start of its continuation
    are one commit, and every id is derived from the state, so a crash during
    recovery leaves either nothing or all of it, and a second recovery decides the
    same thing again.
    """
    if s.parked:
        return NOTHING
    return _recover_compaction(s, env) + _recover_work(s, env)


def _recover_compaction(s: SessionState, env: Env) -> Step:
    """A compaction started and not finished: its summary is made again (``advance``
    makes the call; a model call has no effects), after what is left of a back-off."""
    pending = s.compacting
    if pending is None:
        return NOTHING
    started = pending.started
    found = "summary call in flight" if not pending.failures else "summary retry pending"
    decision = RecoveryDecision(
        session_id=s.session_id,
        run_id=started.run_id,
        subject=started.compaction_id,
        found=found,
        action="make the summary again",
        reason=f"no summary of items [{started.start}, {started.end}) was committed",
        at=env.now,
    )
    return Step((decision,))


def _recover_work(s: SessionState, env: Env) -> Step:
    run = s.run

    def decision(subject: str, found: str, action: str, reason: str) -> RecoveryDecision:
        return RecoveryDecision(
            session_id=s.session_id,
            run_id=run.run_id if run else "",
            subject=subject,
            found=found,
            action=action,
            reason=reason,
            at=env.now,
        )

    as_compensation = _Recovering(decision, run_id="", compensation=True)
    compensating = _recover_tasks(s, env, s.open_compensations(), as_compensation)
    if s.restoring is not None:  # a rewind of the files was under way: finish it
        compensating = _recover_restore(s, decision) + compensating
    if run is None:
        if not s.queue:
            return compensating
        sub_id = s.queue[0]
        return compensating + Step(
            (decision(sub_id, "input accepted, no run", "start its run", "nothing ran yet"),)
        )

    gen = s.current_generation()
    open_tasks = s.open_tasks()
    in_flight = (gen is not None and gen.phase != "completed") or any(
        t.phase in IN_FLIGHT_PHASES for t in open_tasks
    )
    if run.cancel_requested:
        return compensating + _recover_cancelled(s, env, decision)
    if not in_flight:
        approvals = [t.call_id for t in open_tasks if t.phase == "awaiting_approval"]
        waiting = [t for t in open_tasks if t.phase == "awaiting_human"]
        people = [t.call_id for t in waiting if not t.unknown_outcome]
        unknown = [t.call_id for t in waiting if t.unknown_outcome]
        if approvals or waiting:
            found = "; ".join(
                [f"awaiting approval of {', '.join(approvals)}"] * bool(approvals)
                + [f"awaiting a person to resolve {', '.join(people)}"] * bool(people)
                + [f"awaiting a person to say whether {', '.join(unknown)} took effect"]
                * bool(unknown)
            )
            action = "keep waiting"
        elif s.paused:
            found, action = "session paused", "stay paused"
        else:
            found, action = "all tool results saved, next turn not started", "start the next turn"
        return compensating + Step((decision(run.run_id, found, action, "nothing was in flight"),))

    attempt = 1 if run.progressed else run.resume_attempt + 1
    if attempt > env.limits.resume_budget:
        return compensating + _recover_exhausted(s, env, decision)

    records: list[Record] = []
    sub = s.submissions[run.submission_id]
    new_run_id = f"{sub.submission_id}.r{len(sub.runs)}"
    records.append(
        decision(
            run.run_id,
            "run in progress",
            f"resume as {new_run_id}",
            f"resume {attempt} of at most {env.limits.resume_budget} in a row without progress"
            + ("; the interrupted run had made progress" if run.progressed else ""),
        )
    )
    records.append(
        RunFinished(
            session_id=s.session_id,
            run_id=run.run_id,
            submission_id=run.submission_id,
            status="interrupted",
            reason="the process stopped; continued by " + new_run_id,
            at=env.now,
        )
    )
    records.append(
        RunStarted(
            session_id=s.session_id,
            run_id=new_run_id,
            submission_id=run.submission_id,
            goal_rev=s.goal_rev,
            resumed_from=run.run_id,
            resume_attempt=attempt,
            at=env.now,
        )
    )
    if gen is not None and gen.phase != "completed":
        if gen.phase == "retry_pending":
            found, action = "retry back-off", "wait out the back-off, then call the model"
        else:
            found, action = "model request in flight", "call the model again"
        records.append(decision(gen.generation_id, found, action, "a model call has no effects"))
    # The resumed run owns the tasks from here on; _execute names it in new records.
    as_run_task = _Recovering(decision, run_id=new_run_id, compensation=False)
    return compensating + Step(tuple(records)) + _recover_tasks(s, env, open_tasks, as_run_task)


def _recover_tasks(s: SessionState, env: Env, tasks: Sequence[Task], r: _Recovering) -> Step:
    """One loop for every open call, a run's or a compensation: the row of its phase."""
    step = NOTHING
    for task in tasks:
        step += RECOVER[task.phase](s, env, task, r)
    return step


# -- the rows of RECOVER: one open tool call, by its phase ------------------------------------


@frozen
class _Recovering:
    """What a row needs besides the call: how to write a decision down, the run that
    owns a re-run ("" for a compensation), and whether the call is a compensation."""

    decide: Decide
    run_id: str
    compensation: bool


RecoverRow = Callable[[SessionState, Env, Task, _Recovering], Step]

_DISPATCH_ACTION: dict[str, str] = {
    "created": "run it",
    "approved": "run it",
    "denied": "report the denial to the model",
}


def _recover_dispatchable(s: SessionState, env: Env, task: Task, r: _Recovering) -> Step:
    """Not started, so nothing happened: ``advance`` runs it (or reports its denial)."""
    action = _DISPATCH_ACTION[task.phase]
    if r.compensation:
        found, why = "compensation " + task.phase, "not started"
    else:
        found, why = task.phase, "it had not started: nothing happened"
    return Step((r.decide(task.call_id, found, action, why),))


def _recover_awaiting_approval(s: SessionState, env: Env, task: Task, r: _Recovering) -> Step:
    """Keep waiting for the approval. (A compensation awaiting one has never had a
    decision written for it; kept so, for a log to recover as it always did.)"""
    if r.compensation:
        return NOTHING
    return Step((r.decide(task.call_id, task.phase, "keep waiting", "no decision yet"),))


def _recover_terminal(s: SessionState, env: Env, task: Task, r: _Recovering) -> Step:
    """History only (an unfinished compensation's task may already be terminal)."""
    return NOTHING


def _recover_retry(s: SessionState, env: Env, task: Task, r: _Recovering) -> Step:
    """A call between two attempts: its retry was decided and recorded before the crash.

    The back-off resumes where it was (``not_before`` is wall-clock time, so the time
    the process was down counts as waited); ``advance`` then dispatches the attempt.
    """
    assert task.not_before is not None
    nxt = task.attempt + 1
    if task.retry_by_human:
        found = f"a person chose to retry (attempt {task.attempt} asked for one)"
    else:
        found = f"retry back-off after attempt {task.attempt}"
    blocker = _retry_blocker(env, task)
    if blocker:
        action, why = "record the last error; do not retry", blocker
    elif task.not_before > env.now:
        wait = task.not_before - env.now
        action = f"wait out the back-off ({wait:.1f}s left), then run attempt {nxt}"
        why = f"the same arguments and idempotency key; attempt {task.attempt}: {task.last_error}"
    else:
        action = f"run attempt {nxt} now (its back-off is over)"
        why = f"the same arguments and idempotency key; attempt {task.attempt}: {task.last_error}"
    why += version_words(env.tools, task)
    return Step((r.decide(task.call_id, found, action, why),))


def _recover_human(s: SessionState, env: Env, task: Task, r: _Recovering) -> Step:
    """Waiting for a person's resolution (``NeedsHuman``, or an unknown outcome its
    tool sends to a person): keep waiting."""
    if task.unknown_outcome:
        found = "awaiting a person (outcome unknown)"
        action = "keep waiting to " + ASK_A_PERSON
    else:
        found = "awaiting a person (NeedsHuman)"
        action = "keep waiting for rt.resolve: retry, skip or fail"
    decided = r.decide(task.call_id, found, action, task.last_error or "no resolution yet")
    return Step((decided,))


def _recover_executing(s: SessionState, env: Env, task: Task, r: _Recovering) -> Step:
    """The heart of recovery: a call that may or may not have taken effect.

    The call finishes on the tool version it started on (recorded in its ``executing``
    record) while that version is registered, whatever newer versions sit beside it.
    A blind re-run needs both the policy recorded with the call and the policy of the
    tool registered now to allow it, and the call to still be the same call: if the
    tool's definition changed since dispatch (its fingerprint differs: the version it
    started on is gone, or a log older than versions meets a changed tool), it is
    re-run only if the recorded arguments still fit the new definition, and the
    decision says so. Anything else is asked of the tool's ``reconcile`` or reported
    unknown. When versions are in play, the decision names the one it acts on.
    """
    assert task.executing is not None
    recorded = ReplayPolicy(task.executing.replay)
    tool = tool_for(env.tools, task)
    versions = version_words(env.tools, task)
    if task.goal_rev < s.goal_rev and recorded.replayable:
        why = f"the request was revised (revision {s.goal_rev}) since it was dispatched"
        cancelled = ToolCancelled(
            session_id=s.session_id,
            call_id=task.call_id,
            output=f"perdure: this call was interrupted and not re-run: {why}.",
            reason="interrupted; superseded by a revision",
            while_executing=True,
            at=env.now,
        )
        return Step((r.decide(task.call_id, "executing", "do not re-run", why), cancelled))
    if tool is None:
        why = "its tool is no longer registered"
        return Step(
            (
                r.decide(task.call_id, "executing", "report outcome unknown", why),
                _unknown(s, env, task, "interrupted; " + why),
            )
        )
    policy = f"recorded policy {recorded.value}, registered policy {tool.replay.value}"
    change, still_fits = _definition_change(task.executing, tool)
    change = versions + change
    # The version acted on, named in the action when several are (or were) in play.
    on = f" on version {_version_of(env, task)}" if versions else ""
    if recorded.replayable and tool.replay.replayable and still_fits:
        action = f"re-run with the same idempotency key (policy {tool.replay.value}){on}"
        rerun = _execute(s, env, task, tool, attempt=task.attempt + 1, run_id=r.run_id)
        return Step((r.decide(task.call_id, "executing", action, policy + change),)) + rerun
    if recorded.replayable and tool.replay.replayable:
        why = f"{policy}{change}"
    else:
        why = f"{policy}: no blind re-run{change}"
    if tool.reconcile is not None or tool.changes_workspace:
        # A workspace call is also diffed from its before-snapshot (by the shell).
        asked = "ask the tool's reconcile()" if tool.reconcile is not None else ""
        diffed = "diff the workspace from its before-snapshot" if tool.changes_workspace else ""
        action = " and ".join(a for a in (asked, diffed) if a) + on
        return Step(
            (r.decide(task.call_id, "executing", action, why),),
            (Reconcile(task.executing, tool),),
        )
    action = ASK_A_PERSON if asks_a_person(s, env, task) else "report outcome unknown"
    outcome = _unknown_or_ask(
        s,
        env,
        task,
        reason="interrupted before its result was saved; not re-run",
        output=interrupted_text(task.tool_name),
    )
    return Step((r.decide(task.call_id, "executing", action, why + "; no reconcile"), outcome))


def _recover_restore(s: SessionState, decision: Decide) -> Step:
    """A restore is idempotent (the files are made to match one tree): do it again."""
    started = s.restoring
    assert started is not None
    found = f"the rewind {started.request_id!r} to position {started.position} unfinished"
    why = "a restore makes the files match its tree, however far it got"
    return Step(
        (decision(started.request_id, found, "restore the files again", why),),
        (RestoreWorkspace(started.request_id, started.tree),),
    )


def _version_of(env: Env, task: Task) -> str:
    """The version of the registered tool a recovered call goes on with."""
    registered = registered_for(env.tools, task)
    return registered.version if registered is not None else ""


RECOVER: dict[TaskPhase, RecoverRow] = {
    "created": _recover_dispatchable,
    "approved": _recover_dispatchable,
    "denied": _recover_dispatchable,
    "awaiting_approval": _recover_awaiting_approval,
    "executing": _recover_executing,
    "retry_pending": _recover_retry,
    "awaiting_human": _recover_human,
    "completed": _recover_terminal,
    "outcome_unknown": _recover_terminal,
    "cancelled": _recover_terminal,
}
every_phase_has_a_row(RECOVER, "recovery.RECOVER")


# -- the run's own rows: a cancellation crossed by a crash, a resume budget spent ----------------


def _recover_cancelled(s: SessionState, env: Env, decision: Decide) -> Step:
    """A cancellation was winding down when the process died: finish it, never resume."""
    assert s.run is not None
    records: list[Record] = [
        decision(s.run.run_id, "cancellation in progress", "finish cancelling", "never resumed")
    ]
    records += _close_open_tasks(
        s,
        env,
        unknown="interrupted while the run was being cancelled",
        cancelled="the run was cancelled",
    )
    return Step(tuple(records)) + _finish(s, env, "cancelled", reason="cancelled by request")


def _recover_exhausted(s: SessionState, env: Env, decision: Decide) -> Step:
    assert s.run is not None
    run = s.run
    reason = (
        f"the run was interrupted {run.resume_attempt + 1} times in a row without progress "
        f"(resume budget {env.limits.resume_budget}); giving up instead of looping"
    )
    records: list[Record] = [decision(run.run_id, "run in progress", "fail the run", reason)]
    records += _close_open_tasks(
        s, env, unknown="interrupted; the run was given up", cancelled="the run was given up"
    )
    return Step(tuple(records)) + _finish(s, env, "failed", reason=reason)


def _close_open_tasks(s: SessionState, env: Env, *, unknown: str, cancelled: str) -> list[Record]:
    """The run ends during recovery: a call that was executing may have acted (its
    outcome is unknown), any other never ran (cancelled)."""
    return [
        _unknown(s, env, task, unknown)
        if task.phase == "executing"
        else _called_off(s, env, task, cancelled)
        for task in s.open_tasks()
    ]
