"""``advance``: what happens next when nothing new has arrived.

Start a run, call the model, dispatch the calls of a reply, start the next turn,
finish the run; wind a cancelled run down; apply a revision. What happens to one
tool call is a row of ``ADVANCE``, keyed by its phase, and the same rows serve the
calls of a run and the compensations beside it (``_advance_tasks``): a compensation
is an ordinary task of its own. A phase without a row is an error at import.

``settle`` (``settling.py``) calls ``advance`` until it answers nothing, folding each
step in between, so one commit carries a whole burst of transitions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from perdure.actors.decide import compacting
from perdure.actors.decide.verbs import (
    _budget_stop,
    _call_off,
    _continue_turn,
    _execute,
    _finish,
    _holding,
    _next_generation,
    _retry_blocker,
    _run_id,
    _unknown,
    every_phase_has_a_row,
    not_granted,
    tool_for,
)
from perdure.actors.entities import Generation, Task
from perdure.actors.lifecycle import (
    TaskPhase,
)
from perdure.actors.protocol import (
    NOTHING,
    BackOff,
    CallModel,
    CancelModel,
    Env,
    Reconcile,
    Step,
    View,
)
from perdure.actors.state import SessionState
from perdure.storage.records import (
    CompensationFinished,
    Record,
    RunStarted,
    ToolAwaitingApproval,
    ToolCompleted,
    ToolResultKind,
    ToolTaskCreated,
)
from perdure.tools.contract import ReplayPolicy


def advance(s: SessionState, env: Env, view: View) -> Step:
    """The next transition of the session when nothing new has arrived."""
    if s.parked:
        return NOTHING
    compensating = _advance_compensations(s, env, view)
    if compensating:
        return compensating
    summarizing = compacting.summarize(s, env, view)
    if summarizing:
        return summarizing
    run = s.run
    if run is None:
        # No run starts while a rewind puts the files back: its calls would race it.
        if s.queue and not _holding(s, view) and s.restoring is None:
            return _start_run(s, env)
        return NOTHING
    if run.cancel_requested:
        return _wind_down(s, env, view, "the run was cancelled")
    gen = s.current_generation()
    if gen is None:  # a new run: its first model turn
        if _holding(s, view):
            return NOTHING
        held = compacting.before_turn(s, env)
        if held is not None:
            return held
        return _budget_stop(s, env) or _next_generation(s, env, run.run_id, run.submission_id)
    if gen.goal_rev < s.goal_rev:
        return _apply_revision(s, env, view, gen)
    if gen.phase != "completed":  # a call to (re)make: a retry, or one a restart lost
        if gen.generation_id in view.models or _holding(s, view):
            return NOTHING
        return _budget_stop(s, env) or Step(
            (), (CallModel(gen.generation_id, gen.attempt, gen.not_before),)
        )
    tasks = s.tasks_of(gen)
    if not (s.paused or view.draining):
        dispatched = _advance_tasks(s, env, view, tasks)
        if dispatched:
            return dispatched
    if not all(t.terminal for t in tasks):
        return NOTHING
    assert gen.reply is not None
    if not tasks:
        stop = gen.reply.stop_reason
        if stop == "pause_turn":  # the model is not done: its turn goes on, never "completed"
            if _holding(s, view):
                return NOTHING
            return _next_turn(s, env, run.run_id, run.submission_id)
        note = {
            "max_tokens": "the reply was cut off at the model's output limit (max_tokens)",
            "refusal": "the model declined to continue (refusal)",
        }.get(stop, "")
        return _finish(s, env, "completed", text=gen.reply.text, reason=note)
    for task in tasks:
        result = task.result
        if isinstance(result, ToolCompleted) and result.terminate:
            return _finish(s, env, "completed", text=result.output)
    if _holding(s, view):
        return NOTHING
    return _next_turn(s, env, run.run_id, run.submission_id)


def _next_turn(s: SessionState, env: Env, run_id: str, submission_id: str) -> Step:
    """The run's next model turn, after the summary of a compaction that is due."""
    held = compacting.before_turn(s, env)
    return held if held is not None else _continue_turn(s, env, run_id, submission_id)


def _advance_compensations(s: SessionState, env: Env, view: View) -> Step:
    """Compensations live beside runs: close the terminal ones, advance the others by
    the same rows as a run's calls (unless the session holds: paused, draining, or
    being handed over)."""
    step = NOTHING
    for task in s.open_compensations():
        if task.terminal:
            done = CompensationFinished(
                session_id=s.session_id, compensation_id=task.call_id, at=env.now
            )
            step += Step((done,))
        elif not _holding(s, view):
            step += _advance_tasks(s, env, view, [task])
    return step


def _advance_tasks(s: SessionState, env: Env, view: View, tasks: Sequence[Task]) -> Step:
    """One loop for every open call, a run's or a compensation: the row of its phase."""
    step = NOTHING
    for task in tasks:
        step += ADVANCE[task.phase](s, env, view, task)
    return step


# -- the rows of ADVANCE: one tool call, by its phase --------------------------------------

AdvanceRow = Callable[[SessionState, Env, View, Task], Step]


def _advance_dispatchable(s: SessionState, env: Env, view: View, task: Task) -> Step:
    """created, approved, denied: the dispatcher's turn (``_dispatch``)."""
    return _dispatch(s, env, task)


def _advance_executing(s: SessionState, env: Env, view: View, task: Task) -> Step:
    """Running here: nothing to do. Running nowhere: a reconcile found it not applied
    while the session was paused; ask again (``_recheck``)."""
    if task.call_id in view.tools:
        return NOTHING
    return _recheck(s, env, task)


def _advance_backing_off(s: SessionState, env: Env, view: View, task: Task) -> Step:
    """Between two attempts: wait out the back-off, then the next attempt (``_retry``).
    Not while a timer already waits for it, nor while the session is handed over
    (the next owner waits out the back-off's rest: its end is in the log)."""
    if task.call_id in view.waiting or view.handing_over:
        return NOTHING
    return _retry(s, env, task)


def _advance_nothing(s: SessionState, env: Env, view: View, task: Task) -> Step:
    """Waiting for a person (approval, resolution), or terminal: nothing to do here."""
    return NOTHING


ADVANCE: dict[TaskPhase, AdvanceRow] = {
    "created": _advance_dispatchable,
    "approved": _advance_dispatchable,
    "denied": _advance_dispatchable,
    "executing": _advance_executing,
    "retry_pending": _advance_backing_off,
    "awaiting_approval": _advance_nothing,
    "awaiting_human": _advance_nothing,
    "completed": _advance_nothing,
    "outcome_unknown": _advance_nothing,
    "cancelled": _advance_nothing,
}
every_phase_has_a_row(ADVANCE, "advancing.ADVANCE")


# -- changes of course: a revision, a cancel ---------------------------------------------------


def _apply_revision(s: SessionState, env: Env, view: View, gen: Generation) -> Step:
    """The request was revised while ``gen`` (of an older revision) was current.

    Its model call is abandoned; its tasks that have not started are cancelled
    before dispatch; executing ones are stopped where the tool allows it, or left
    to finish. Once all are terminal, the completed calls of goal-dependent tools
    are run again under the new revision (``_rerun_for_revision``); once those are
    terminal too the next turn starts under the new revision, and the model reads
    the revision with the fate of every earlier action and the revision each earlier
    result came under.
    """
    assert s.run is not None
    in_flight = gen.phase != "completed" and gen.generation_id in view.models
    stop = Step((), (CancelModel(gen.generation_id),)) if in_flight else NOTHING
    # The re-runs of this revision hang on ``gen`` too; they are not called off.
    old = [t for t in s.tasks_of(gen) if t.goal_rev < s.goal_rev]
    records, effects, _ = _call_off(s, env, view, old, "the request was revised before it ran")
    if records or effects:
        return stop + Step(tuple(records), tuple(effects))
    if not all(t.terminal for t in old) or _holding(s, view):
        return stop
    rerunning = _rerun_for_revision(s, env, view, gen)
    if rerunning is not None:
        return stop + rerunning
    return stop + _next_turn(s, env, s.run.run_id, s.run.submission_id)


def rerun_id(call_id: str, goal_rev: int) -> str:
    """The id of ``call_id`` run again under revision ``goal_rev`` (derived: a restart
    decides the same)."""
    return f"{call_id}@rev{goal_rev}"


def _rerun_for_revision(s: SessionState, env: Env, view: View, gen: Generation) -> Step | None:
    """Run again, under the revision in force, each completed call of the request whose
    tool declares ``depends_on_goal`` (SAFE, as recorded and as registered).

    The re-run is a task of its own (``ToolTaskCreated{rerun_of}``) beside the calls of
    ``gen``, so the turn waits for it and recovery finds it. None once every re-run is
    terminal (the next turn may start); else the step that creates or advances them
    (NOTHING while they run).
    """
    assert s.run is not None
    created: list[Record] = []
    for task in _goal_dependent_results(s, env):
        created.append(
            ToolTaskCreated(
                session_id=s.session_id,
                generation_id=gen.generation_id,
                call_id=rerun_id(task.call_id, s.goal_rev),
                tool_name=task.tool_name,
                input=task.input,
                goal_rev=s.goal_rev,
                secret=task.secret,
                rerun_of=task.call_id,
                at=env.now,
            )
        )
    if created:
        return Step(tuple(created))
    open_reruns = [
        t
        for t in s.tasks_of(gen)
        if t.rerun_of is not None and t.goal_rev == s.goal_rev and not t.terminal
    ]
    if not open_reruns:
        return None
    return _advance_tasks(s, env, view, open_reruns)


def _goal_dependent_results(s: SessionState, env: Env) -> list[Task]:
    """The request's completed calls, made under an older revision, that ran a
    goal-dependent SAFE tool and were not run again since (the latest re-run stands
    for its call, unless a newer revision stopped it before it had a result)."""
    assert s.run is not None
    found: list[Task] = []
    for generation_id in s.submissions[s.run.submission_id].generations:
        for call_id in s.generations[generation_id].call_ids:
            task = s.tasks[call_id]
            if task.phase != "completed" or task.executing is None:
                continue
            if task.reruns and not _rerun_stopped(s, task):
                continue
            if task.goal_rev >= s.goal_rev:
                continue
            tool = tool_for(env.tools, task)
            recorded_safe = task.executing.replay == ReplayPolicy.SAFE.value
            if tool is not None and tool.depends_on_goal and recorded_safe:
                found.append(task)
    return found


def _rerun_stopped(s: SessionState, task: Task) -> bool:
    """The latest re-run of ``task`` was cancelled under an older revision than the one
    in force: it stands for nothing, so ``task`` is the result to run again."""
    latest = s.tasks[task.reruns[max(task.reruns)]]
    return latest.phase == "cancelled" and latest.goal_rev < s.goal_rev


def _wind_down(s: SessionState, env: Env, view: View, reason: str) -> Step:
    """Cancel what has not started, stop what runs, finish the run when all is terminal."""
    records, effects, executing = _call_off(s, env, view, s.open_tasks(), reason)
    gen = s.current_generation()
    if gen is not None and gen.phase != "completed" and gen.generation_id in view.models:
        effects.append(CancelModel(gen.generation_id))
    if records or effects:
        return Step(tuple(records), tuple(effects))
    if executing:
        return NOTHING  # wait for the executing tools to report
    return _finish(s, env, "cancelled", reason="cancelled by request")


def _recheck(s: SessionState, env: Env, task: Task) -> Step:
    """An executing call nobody runs: reconcile found it not applied while paused.

    (After a restart, ``recover`` has already decided every executing call, so in a
    running process this is the only way to meet one.) Ask again before running it.
    """
    assert task.executing is not None
    tool = tool_for(env.tools, task)
    if tool is None or (tool.reconcile is None and not tool.changes_workspace):
        why = "its tool is no longer registered" if tool is None else "it cannot reconcile"
        return Step((_unknown(s, env, task, f"not re-run: {why}"),))
    return Step((), (Reconcile(task.executing, tool),))


def _start_run(s: SessionState, env: Env) -> Step:
    sub = s.submissions[s.queue[0]]
    run_id = f"{sub.submission_id}.r{len(sub.runs)}"
    started = RunStarted(
        session_id=s.session_id,
        run_id=run_id,
        submission_id=sub.submission_id,
        goal_rev=s.goal_rev,
        at=env.now,
    )
    return Step((started,))  # advance starts its first model turn next


def _dispatch(s: SessionState, env: Env, task: Task) -> Step:
    """created/approved/denied -> executing, awaiting approval, or an immediate result."""
    tool = tool_for(env.tools, task)

    def done(output: str, kind: ToolResultKind) -> Step:
        record = ToolCompleted(
            session_id=s.session_id,
            call_id=task.call_id,
            output=output,
            is_error=True,
            kind=kind,
            goal_rev=task.goal_rev,
            at=env.now,
        )
        return Step((record,))

    if task.phase == "denied":
        return done("perdure: the user denied this call; it was not run.", "denied")
    if not_granted(s, task.tool_name):
        granted = ", ".join(sorted(env.tools)) or "none"
        return done(
            f"perdure: tool '{task.tool_name}' is not granted to this session (granted: "
            f"{granted}). Nothing was run.",
            "not_granted",
        )
    if tool is None:
        known = ", ".join(sorted(env.tools)) or "none"
        return done(
            f"perdure: there is no tool named '{task.tool_name}' (available: {known}). "
            "Nothing was run.",
            "unknown_tool",
        )
    problems = tool.validate(task.input)
    if problems:
        listed = "; ".join(problems)
        return done(
            f"perdure: invalid arguments for '{tool.name}': {listed}. Nothing was run; "
            "fix the arguments and call it again.",
            "invalid_args",
        )
    if task.phase == "created" and tool.needs_approval(task.input):
        record = ToolAwaitingApproval(
            session_id=s.session_id,
            call_id=task.call_id,
            reason=f"'{tool.name}' requires approval",
            at=env.now,
        )
        return Step((record,))
    return _execute(s, env, task, tool, attempt=1, run_id=_run_id(s))


def _retry(s: SessionState, env: Env, task: Task) -> Step:
    """retry_pending -> wait out the back-off (``BackOff``), then attempt + 1, same key.

    The attempt's ``executing`` record is committed once the back-off is over, so a
    task waiting is never mistaken for one running. A retry decided by policy needs
    both the recorded and the registered policy to allow re-running (a NEVER call is
    never retried automatically); a retry a person chose is run whatever the policy.
    """
    assert task.executing is not None and task.not_before is not None
    if env.now < task.not_before:
        return Step((), (BackOff(task.call_id, task.attempt, task.not_before),))
    tool = tool_for(env.tools, task)
    blocker = _retry_blocker(env, task)
    if tool is None or blocker:
        return Step((_not_retried(s, env, task, blocker or "its tool is no longer registered"),))
    return _execute(s, env, task, tool, attempt=task.attempt + 1, run_id=_run_id(s))


def _not_retried(s: SessionState, env: Env, task: Task, why: str) -> ToolCompleted:
    """The failed attempt's error becomes the call's result: its retry will not happen."""
    return ToolCompleted(
        session_id=s.session_id,
        call_id=task.call_id,
        output=f"{task.last_error}\n(perdure: attempt {task.attempt} failed and was not "
        f"retried: {why}.)",
        is_error=True,
        kind="error",
        attempt=task.attempt,
        goal_rev=task.goal_rev,
        at=env.now,
    )
