"""A session's decisions: pure functions from (state, input) to records and effects.

This is the whole protocol of perdure, written without I/O (in the spirit of
h11): the trio shell in ``session.py`` feeds it commands from callers and results
from its generation and tool actors, commits the records it returns, and only then
performs the effects. Recovery is the same code: ``recover`` on the folded state of
a restarted process, followed by the usual ``advance``. The inputs and outputs are
named in ``protocol``.

Read it as tables:

* ``advance`` — what happens next when nothing is in flight (start a run, call the
  model, dispatch tool tasks, start the next turn, finish the run);
* ``recover`` — the recovery table (docs/DESIGN.md), for a process that finds work
  that a dead process left in flight;
* ``on_result`` — what a model reply, a model error, a tool result, a heartbeat,
  the end of a back-off or a reconciliation changes (``RESULTS``);
* ``command`` — what a caller's submit, cancel, approve, revise, pause, resume,
  compensate or resolve changes (``COMMANDS``); what a submit does while a run is
  busy is a row of ``IF_BUSY`` (queue, interrupt, reject, steer);
* ``fork_points`` / ``fork_position`` / ``fork_records`` — where a session's history
  may be forked (the end of a run or of a turn) and the records of the fork.

When a tool call fails (``_tool_finished``), its tool's policy decides: a transient
failure of a SAFE or KEYED tool with a ``RetryPolicy`` becomes ``ToolRetryPending``
(committed before the back-off; ``advance`` dispatches attempt + 1 once it is over,
``_retry``), ``NeedsHuman`` becomes ``ToolAwaitingHuman`` (``_resolve`` answers it),
anything else a result for the model. A NEVER call is never retried by these rows:
only a reconcile answering ``not_applied`` or a person's ``retry`` runs it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from attrs import evolve

from perdure.actors.protocol import (
    NOTHING,
    Accepted,
    Answer,
    Approve,
    BackOff,
    BackOffOver,
    CallModel,
    Cancel,
    CancelModel,
    CancelTool,
    Command,
    Compensate,
    Done,
    Effect,
    Env,
    Forget,
    HeartbeatReported,
    ModelFailed,
    ModelReplied,
    Pause,
    Reconcile,
    ReconcileFinished,
    Resolve,
    Result,
    Resume,
    Revise,
    RunTool,
    Step,
    StopBackOff,
    Submit,
    ToolFinished,
    View,
)
from perdure.actors.state import (
    BACKING_OFF_PHASES,
    DISPATCHABLE_PHASES,
    FAILED_ATTEMPT_PHASES,
    HUMAN_WAIT_PHASES,
    IN_FLIGHT_PHASES,
    Generation,
    SessionState,
    Task,
)
from perdure.budget import over_budget
from perdure.errors import Refused, SessionParkedError
from perdure.storage.records import (
    FINAL_RUN_STATUSES,
    ApprovalDecided,
    Budget,
    CancelRequested,
    Committed,
    CompensationFinished,
    CompensationRequested,
    GenerationCompleted,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    Record,
    RecoveryDecision,
    ResolutionDecided,
    RetryPending,
    RunFinished,
    RunStarted,
    RunStatus,
    SessionCreated,
    SessionForked,
    SessionParked,
    SessionPaused,
    SessionResumed,
    ToolAwaitingApproval,
    ToolAwaitingHuman,
    ToolCall,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolResultKind,
    ToolRetryPending,
    ToolTaskCreated,
)
from perdure.tools.contract import ReplayPolicy, Tool, render_result

# -- words the model reads --------------------------------------------------------------


def unknown_outcome_text(tool_name: str, why: str) -> str:
    return (
        f"perdure: the call to '{tool_name}' {why}. Its external effect is UNKNOWN: it may "
        "or may not have happened. It was not re-run automatically. Check the current "
        "state before deciding whether to call it again."
    )


def interrupted_text(tool_name: str) -> str:
    return unknown_outcome_text(
        tool_name, "was interrupted (the process stopped) before its result was saved"
    )


# -- helpers ------------------------------------------------------------------------------


def idempotency_key(session_id: str, submission_id: str, call_id: str) -> str:
    """Stable for one call across restarts and re-runs: session, run lineage, call id."""
    raw = f"{session_id}\x00{submission_id}\x00{call_id}".encode()
    return "pdk_" + hashlib.sha256(raw).hexdigest()[:32]


def fingerprint(tool: Tool, args: dict[str, Any]) -> str:
    """The identity of one call: which tool, which definition of it, which arguments.

    Recorded with every ``executing`` record; recovery compares it with the fingerprint
    the same arguments get from the tool registered NOW, so a call whose tool changed
    since it was dispatched is never taken for the same call (see ``_recover_executing``).
    """
    canonical = _CANONICAL.encode(
        {"tool": tool.name, "definition": tool.definition_hash, "args": args}
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


# Built once: ``json.dumps`` with options builds an encoder per call (same output).
_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def retry_delay(env: Env, attempt: int, retry_after: float | None, jitter: float) -> float:
    """Exponential back-off with jitter, never shorter than the server's retry-after."""
    ceiling: float = min(env.retry_cap, env.retry_base * 2.0 ** (attempt - 1))
    delay = ceiling * (0.5 + jitter / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, env.retry_cap * 10))
    return delay


def tool_for(tools: Mapping[str, Tool], task: Task) -> Tool | None:
    """The tool that runs ``task``: its registered tool, or that tool's compensation."""
    tool = tools.get(task.tool_name)
    if task.compensates is not None:
        return tool.compensation if tool is not None else None
    return tool


def _next_generation(s: SessionState, env: Env, run_id: str, submission_id: str) -> Step:
    sub = s.submissions[submission_id]
    gen_id = f"{submission_id}.g{len(sub.generations) + 1}"
    started = GenerationStarted(
        session_id=s.session_id,
        run_id=run_id,
        generation_id=gen_id,
        goal_rev=s.goal_rev,
        submission_id=submission_id,
        at=env.now,
    )
    return Step((started,), (CallModel(gen_id, 1),))


def _finish(s: SessionState, env: Env, status: RunStatus, text: str = "", reason: str = "") -> Step:
    assert s.run is not None
    return Step(
        (
            RunFinished(
                session_id=s.session_id,
                run_id=s.run.run_id,
                submission_id=s.run.submission_id,
                status=status,
                final_text=text,
                reason=reason,
                at=env.now,
            ),
        )
    )


def _task_result_cancelled(s: SessionState, env: Env, task: Task, reason: str) -> ToolCancelled:
    if task.phase in FAILED_ATTEMPT_PHASES:
        output = (
            f"perdure: this call failed (attempt {task.attempt}: {task.last_error}) and was "
            f"not tried again: {reason}."
        )
    else:
        output = f"perdure: this call was not run: {reason}."
    return ToolCancelled(
        session_id=s.session_id, call_id=task.call_id, output=output, reason=reason, at=env.now
    )


# -- advance: what happens next ----------------------------------------------------------


def advance(s: SessionState, env: Env, view: View) -> Step:
    """The next transition of the session when nothing new has arrived."""
    if s.parked:
        return NOTHING
    compensating = _advance_compensations(s, env, view)
    if compensating:
        return compensating
    run = s.run
    if run is None:
        if s.queue and not _holding(s, view):
            return _start_run(s, env)
        return NOTHING
    if run.cancel_requested:
        return _wind_down(s, env, view, "the run was cancelled")
    gen = s.current_generation()
    if gen is None:  # a new run: its first model turn
        if _holding(s, view):
            return NOTHING
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
        dispatched = NOTHING
        for task in tasks:
            if task.phase in DISPATCHABLE_PHASES:
                dispatched += _dispatch(s, env, task)
            elif task.phase == "executing" and task.call_id not in view.tools:
                dispatched += _recheck(s, env, task)
            elif (
                task.phase in BACKING_OFF_PHASES
                and task.call_id not in view.waiting
                and not view.handing_over  # the next owner waits out the back-off's rest
            ):
                dispatched += _retry(s, env, task)
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
            return _continue_turn(s, env, run.run_id, run.submission_id)
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
    return _continue_turn(s, env, run.run_id, run.submission_id)


def _holding(s: SessionState, view: View) -> bool:
    """Start no model call and no run: the session is paused, the process drains, or
    the session is being handed to another node (its current tool calls still run)."""
    return s.paused or view.draining or view.handing_over


def _advance_compensations(s: SessionState, env: Env, view: View) -> Step:
    """Compensations live beside runs: dispatch them, and close them when terminal."""
    for task in s.open_compensations():
        if task.terminal:
            done = CompensationFinished(
                session_id=s.session_id, compensation_id=task.call_id, at=env.now
            )
            return Step((done,))
        if _holding(s, view):
            continue
        if task.phase in DISPATCHABLE_PHASES:
            return _dispatch(s, env, task)
        if task.phase == "executing" and task.call_id not in view.tools:
            return _recheck(s, env, task)
        if task.phase in BACKING_OFF_PHASES and task.call_id not in view.waiting:
            return _retry(s, env, task)
    return NOTHING


def _recheck(s: SessionState, env: Env, task: Task) -> Step:
    """An executing call nobody runs: reconcile found it not applied while paused.

    (After a restart, ``recover`` has already decided every executing call, so in a
    running process this is the only way to meet one.) Ask again before running it.
    """
    assert task.executing is not None
    tool = tool_for(env.tools, task)
    if tool is None or tool.reconcile is None:  # unregistered since: nobody can tell
        why = "its tool is no longer registered" if tool is None else "it cannot reconcile"
        return Step((_unknown(s, env, task, f"not re-run: {why}"),))
    return Step((), (Reconcile(task.executing, tool),))


def _apply_revision(s: SessionState, env: Env, view: View, gen: Generation) -> Step:
    """The request was revised while ``gen`` (of an older revision) was current.

    Its model call is abandoned; its tasks that have not started are cancelled
    before dispatch; executing ones are stopped where the tool allows it, or left
    to finish. Once all are terminal the next turn starts under the new revision,
    and the model reads the revision with the fate of every earlier action.
    """
    assert s.run is not None
    if gen.phase != "completed":
        stop = (CancelModel(gen.generation_id),) if gen.generation_id in view.models else ()
        if _holding(s, view):
            return Step((), stop)
        return Step((), stop) + _continue_turn(s, env, s.run.run_id, s.run.submission_id)
    records: list[Record] = []
    effects: list[Effect] = []
    for task in s.tasks_of(gen):
        if task.terminal:
            continue
        if task.phase != "executing":
            records.append(
                _task_result_cancelled(s, env, task, "the request was revised before it ran")
            )
            if task.call_id in view.waiting:
                effects.append(StopBackOff(task.call_id))
            continue
        tool = env.tools.get(task.tool_name)
        stoppable = tool is not None and tool.cancellable
        if stoppable and task.call_id in view.tools and task.call_id not in view.cancelling:
            effects.append(CancelTool(task.call_id))
    if records or effects:
        return Step(tuple(records), tuple(effects))
    if not all(t.terminal for t in s.tasks_of(gen)) or _holding(s, view):
        return NOTHING
    return _continue_turn(s, env, s.run.run_id, s.run.submission_id)


def _continue_turn(s: SessionState, env: Env, run_id: str, submission_id: str) -> Step:
    turns = len(s.submissions[submission_id].generations)
    if turns >= env.max_turns:
        return _finish(
            s, env, "failed", reason=f"the run reached its limit of {env.max_turns} model turns"
        )
    return _budget_stop(s, env) or _next_generation(s, env, run_id, submission_id)


def _budget_stop(s: SessionState, env: Env) -> Step:
    """Before a model call: the run finishes ``stopped`` if a budget in force is spent.

    The spend is the usage folded from the log (every reply, every failed attempt), so
    a restart counts what was spent before it. The session's own budget, if it was
    given one, replaces the runtime's default.
    """
    budget = s.budget if s.budget is not None else env.budget
    if budget is None or s.run is None:
        return NOTHING
    why = over_budget(budget, s.run.spend, s.spend, env.prices)
    return NOTHING if why is None else _finish(s, env, "stopped", reason=why)


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
            at=env.now,
        )
        return Step((record,))

    if task.phase == "denied":
        return done("perdure: the user denied this call; it was not run.", "denied")
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


def _run_id(s: SessionState) -> str:
    """The run that owns work started now ("" for a compensation outside any run)."""
    return s.run.run_id if s.run is not None else ""


def _execute(
    s: SessionState, env: Env, task: Task, tool: Tool, *, attempt: int, run_id: str
) -> Step:
    """The executing record, committed BEFORE the tool may touch the world.

    ``run_id`` names the run that owns this attempt: the current run, or during
    recovery the run that continues the interrupted one (not folded in yet).
    """
    if task.executing is not None:
        args = task.executing.args  # a re-run repeats exactly what was executed
        key = task.executing.idempotency_key
    else:
        args = tool.effective_args(task.input)
        if args == task.input:
            args = task.input  # no default added: one dict for both (never mutated)
        key = idempotency_key(s.session_id, task.lineage, task.call_id)
    record = ToolExecuting(
        session_id=s.session_id,
        call_id=task.call_id,
        run_id=run_id,
        tool_name=tool.name,
        args=args,
        replay=tool.replay.value,
        idempotency_key=key,
        fingerprint=fingerprint(tool, args),
        tool_hash=tool.definition_hash,
        attempt=attempt,
        at=env.now,
        policy_reason=tool.policy_reason,
    )
    beat = task.last_heartbeat.details if task.last_heartbeat is not None else None
    return Step((record,), (RunTool(record, tool, last_heartbeat=beat),))


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


def _retry_blocker(env: Env, task: Task) -> str:
    """Why a pending retry may not run now ("" if it may)."""
    assert task.executing is not None
    tool = tool_for(env.tools, task)
    if tool is None:
        return "its tool is no longer registered"
    recorded = ReplayPolicy(task.executing.replay)
    if not task.retry_by_human and not (recorded.replayable and tool.replay.replayable):
        return (
            f"recorded policy {recorded.value}, registered policy {tool.replay.value}: "
            "never retried automatically"
        )
    change, still_fits = _definition_change(task.executing, tool)
    return "" if still_fits else change.removeprefix("; ")


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
        at=env.now,
    )


def _wind_down(s: SessionState, env: Env, view: View, reason: str) -> Step:
    """Cancel what has not started, stop what runs, finish the run when all is terminal."""
    records: list[Record] = []
    effects: list[Effect] = []
    executing = False
    for task in s.open_tasks():
        if task.phase == "executing":
            executing = True
            tool = env.tools.get(task.tool_name)
            stoppable = tool is not None and tool.cancellable
            if stoppable and task.call_id in view.tools and task.call_id not in view.cancelling:
                effects.append(CancelTool(task.call_id))
        else:
            records.append(_task_result_cancelled(s, env, task, reason))
            if task.call_id in view.waiting:
                effects.append(StopBackOff(task.call_id))
    gen = s.current_generation()
    if gen is not None and gen.phase != "completed" and gen.generation_id in view.models:
        effects.append(CancelModel(gen.generation_id))
    if records or effects:
        return Step(tuple(records), tuple(effects))
    if executing:
        return NOTHING  # wait for the executing tools to report
    return _finish(s, env, "cancelled", reason="cancelled by request")


# -- recover: the recovery table -----------------------------------------------------------

Decide = Callable[[str, str, str, str], RecoveryDecision]  # (subject, found, action, reason)
_DISPATCH_ACTION: dict[str, str] = {
    "created": "run it",
    "approved": "run it",
    "denied": "report the denial to the model",
}


def recover(s: SessionState, env: Env) -> Step:
    """Decide what to do with work a dead process left in flight. Called once at start.

    The repair, the close of the interrupted run and the start of its continuation
    are one commit, and every id is derived from the state, so a crash during
    recovery leaves either nothing or all of it, and a second recovery decides the
    same thing again.
    """
    if s.parked:
        return NOTHING
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

    compensating = NOTHING
    for task in s.open_compensations():
        if task.phase == "executing":
            compensating += _recover_executing(s, env, task, "", decision)
        elif task.phase in DISPATCHABLE_PHASES:
            action = _DISPATCH_ACTION[task.phase]
            compensating += Step(
                (decision(task.call_id, "compensation " + task.phase, action, "not started"),)
            )
        elif task.phase in BACKING_OFF_PHASES:
            compensating += Step((_recover_retry(env, task, decision),))
        elif task.phase == "awaiting_human":
            compensating += Step((_recover_human(task, decision),))
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
        people = [t.call_id for t in open_tasks if t.phase == "awaiting_human"]
        if approvals or people:
            found = "; ".join(
                [f"awaiting approval of {', '.join(approvals)}"] * bool(approvals)
                + [f"awaiting a person to resolve {', '.join(people)}"] * bool(people)
            )
            action = "keep waiting"
        elif s.paused:
            found, action = "session paused", "stay paused"
        else:
            found, action = "all tool results saved, next turn not started", "start the next turn"
        return compensating + Step((decision(run.run_id, found, action, "nothing was in flight"),))

    attempt = 1 if run.progressed else run.resume_attempt + 1
    if attempt > env.resume_budget:
        return compensating + _recover_exhausted(s, env, decision)

    records: list[Record] = []
    effects: list[Effect] = []
    sub = s.submissions[run.submission_id]
    new_run_id = f"{sub.submission_id}.r{len(sub.runs)}"
    records.append(
        decision(
            run.run_id,
            "run in progress",
            f"resume as {new_run_id}",
            f"resume {attempt} of at most {env.resume_budget} in a row without progress"
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
    for task in open_tasks:
        if task.phase == "executing":
            step = _recover_executing(s, env, task, new_run_id, decision)
            records += step.records
            effects += step.effects
        elif task.phase in DISPATCHABLE_PHASES:
            action = _DISPATCH_ACTION[task.phase]
            records.append(
                decision(task.call_id, task.phase, action, "it had not started: nothing happened")
            )
        elif task.phase in BACKING_OFF_PHASES:
            records.append(_recover_retry(env, task, decision))
        elif task.phase == "awaiting_human":
            records.append(_recover_human(task, decision))
        elif task.phase in HUMAN_WAIT_PHASES:
            records.append(decision(task.call_id, task.phase, "keep waiting", "no decision yet"))
    return compensating + Step(tuple(records), tuple(effects))


def _recover_retry(env: Env, task: Task, decision: Decide) -> RecoveryDecision:
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
    return decision(task.call_id, found, action, why)


def _recover_human(task: Task, decision: Decide) -> RecoveryDecision:
    return decision(
        task.call_id,
        "awaiting a person (NeedsHuman)",
        "keep waiting for rt.resolve: retry, skip or fail",
        task.last_error or "no resolution yet",
    )


def _recover_executing(
    s: SessionState, env: Env, task: Task, run_id: str, decision: Decide
) -> Step:
    """The heart of recovery: a call that may or may not have taken effect.

    A blind re-run needs both the policy recorded with the call and the policy of the
    tool registered now to allow it, and the call to still be the same call: if the
    tool's definition changed since dispatch (its fingerprint differs), it is re-run
    only if the recorded arguments still fit the new definition, and the decision
    says so. Anything else is asked of the tool's ``reconcile`` or reported unknown.
    """
    assert task.executing is not None
    recorded = ReplayPolicy(task.executing.replay)
    tool = tool_for(env.tools, task)
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
        return Step((decision(task.call_id, "executing", "do not re-run", why), cancelled))
    if tool is None:
        why = "its tool is no longer registered"
        return Step(
            (
                decision(task.call_id, "executing", "report outcome unknown", why),
                _unknown(s, env, task, "interrupted; " + why),
            )
        )
    policy = f"recorded policy {recorded.value}, registered policy {tool.replay.value}"
    change, still_fits = _definition_change(task.executing, tool)
    if recorded.replayable and tool.replay.replayable and still_fits:
        action = f"re-run with the same idempotency key (policy {tool.replay.value})"
        rerun = _execute(s, env, task, tool, attempt=task.attempt + 1, run_id=run_id)
        return Step((decision(task.call_id, "executing", action, policy + change),)) + rerun
    if recorded.replayable and tool.replay.replayable:
        why = f"{policy}{change}"
    else:
        why = f"{policy}: no blind re-run{change}"
    if tool.reconcile is not None:
        return Step(
            (decision(task.call_id, "executing", "ask the tool's reconcile()", why),),
            (Reconcile(task.executing, tool),),
        )
    return Step(
        (
            decision(task.call_id, "executing", "report outcome unknown", why + "; no reconcile"),
            _unknown(s, env, task, "interrupted before its result was saved; not re-run"),
        )
    )


def _definition_change(executing: ToolExecuting, tool: Tool) -> tuple[str, bool]:
    """Whether the call's tool changed since dispatch: words for the decision, and
    whether the recorded arguments still fit the tool as it is now."""
    if fingerprint(tool, executing.args) == executing.fingerprint:
        return "", True
    words = (
        f"; the tool's definition changed since the call was dispatched "
        f"({executing.tool_hash} -> {tool.definition_hash})"
    )
    problems = tool.validate(executing.args)
    if problems:
        return words + " and the recorded arguments no longer fit it: " + "; ".join(problems), False
    return words + "; the recorded arguments still fit it", True


def _unknown(s: SessionState, env: Env, task: Task, reason: str) -> ToolOutcomeUnknown:
    return ToolOutcomeUnknown(
        session_id=s.session_id,
        call_id=task.call_id,
        output=interrupted_text(task.tool_name),
        reason=reason,
        at=env.now,
    )


def _recover_cancelled(s: SessionState, env: Env, decision: Decide) -> Step:
    """A cancellation was winding down when the process died: finish it, never resume."""
    assert s.run is not None
    records: list[Record] = [
        decision(s.run.run_id, "cancellation in progress", "finish cancelling", "never resumed")
    ]
    for task in s.open_tasks():
        if task.phase == "executing":
            records.append(_unknown(s, env, task, "interrupted while the run was being cancelled"))
        else:
            records.append(_task_result_cancelled(s, env, task, "the run was cancelled"))
    return Step(tuple(records)) + _finish(s, env, "cancelled", reason="cancelled by request")


def _recover_exhausted(s: SessionState, env: Env, decision: Decide) -> Step:
    assert s.run is not None
    run = s.run
    reason = (
        f"the run was interrupted {run.resume_attempt + 1} times in a row without progress "
        f"(resume budget {env.resume_budget}); giving up instead of looping"
    )
    records: list[Record] = [decision(run.run_id, "run in progress", "fail the run", reason)]
    for task in s.open_tasks():
        if task.phase == "executing":
            records.append(_unknown(s, env, task, "interrupted; the run was given up"))
        else:
            records.append(_task_result_cancelled(s, env, task, "the run was given up"))
    return Step(tuple(records)) + _finish(s, env, "failed", reason=reason)


# -- on_result: what the actors report --------------------------------------------------------


def on_result(s: SessionState, env: Env, result: Result) -> Step:
    """Decide what a report of a generation or tool actor changes (``RESULTS``)."""
    handler: Callable[[SessionState, Env, Any], Step] = RESULTS[type(result)]
    return handler(s, env, result)


def _live_generation(s: SessionState, generation_id: str) -> Generation | None:
    """The generation, if a reply for it may still advance the session."""
    gen = s.current_generation()
    if gen is None or gen.generation_id != generation_id or gen.phase == "completed":
        return None
    if s.run is None or s.run.cancel_requested or gen.goal_rev != s.goal_rev:
        return None
    return gen


def _model_replied(s: SessionState, env: Env, msg: ModelReplied) -> Step:
    gen = _live_generation(s, msg.generation_id)
    if gen is None or s.run is None:
        return NOTHING
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for call in msg.reply.tool_calls:
        call_id = call.call_id
        while call_id in s.tasks or call_id in seen:  # ids must be unique within a session
            call_id += "_"
        seen.add(call_id)
        calls.append(evolve(call, call_id=call_id))
    records: list[Record] = [
        GenerationCompleted(
            session_id=s.session_id,
            run_id=s.run.run_id,
            generation_id=gen.generation_id,
            submission_id=gen.submission_id,
            text=msg.reply.text,
            thinking=list(msg.reply.thinking),
            tool_calls=calls,
            stop_reason=msg.reply.stop_reason,
            usage=msg.reply.usage,
            attempt=msg.attempt,
            provider=msg.reply.provider,
            model=msg.reply.model,
            response_id=msg.reply.response_id,
            at=env.now,
        )
    ]
    records += [
        ToolTaskCreated(
            session_id=s.session_id,
            generation_id=gen.generation_id,
            call_id=c.call_id,
            tool_name=c.name,
            input=c.input,
            goal_rev=gen.goal_rev,
            at=env.now,
        )
        for c in calls
    ]
    return Step(tuple(records))


def _model_failed(s: SessionState, env: Env, msg: ModelFailed) -> Step:
    gen = _live_generation(s, msg.generation_id)
    if gen is None:
        return NOTHING
    if msg.retryable and msg.attempt < env.max_model_attempts:
        not_before = env.now + retry_delay(env, msg.attempt, msg.retry_after, msg.jitter)
        if msg.fallback:  # the back-off was for the provider that failed, not the next one
            not_before = env.now
        pending = RetryPending(
            session_id=s.session_id,
            generation_id=gen.generation_id,
            attempt=msg.attempt,
            not_before=not_before,
            error=msg.error,
            usage=msg.usage,
            model=msg.model,
            provider=msg.provider,
            fallback=msg.fallback,
            at=env.now,
        )
        return Step((pending,))  # advance makes the call, once the budget allows it
    why = "a non-retryable error" if not msg.retryable else f"{msg.attempt} attempts"
    failed = _finish(s, env, "failed", reason=f"the model call failed after {why}: {msg.error}")
    finished = failed.records[0]
    assert isinstance(finished, RunFinished)
    return Step((evolve(finished, usage=msg.usage),))


_RESULT_KIND: dict[str, ToolResultKind] = {
    "ok": "ok",
    "error": "error",
    "timeout": "timeout",
    "retryable": "error",  # not retried (no policy, or not allowed): an error for the model
}


def _tool_finished(s: SessionState, env: Env, msg: ToolFinished) -> Step:
    task = s.tasks.get(msg.call_id)
    if task is None or task.phase != "executing" or task.attempt != msg.attempt:
        return NOTHING  # a duplicate or a report from a superseded attempt
    assert task.executing is not None
    common: dict[str, Any] = {"session_id": s.session_id, "call_id": task.call_id, "at": env.now}
    never = task.executing.replay == ReplayPolicy.NEVER.value
    if msg.outcome in ("retryable", "timeout"):
        retried = _retry_failed_attempt(s, env, task, msg)
        if retried:
            return retried
    if msg.outcome == "needs_human":
        waiting = ToolAwaitingHuman(attempt=msg.attempt, reason=msg.output, **common)
        return Step((waiting,))
    if msg.outcome == "cancelled":
        effect = " Its effect may have partly happened." if never else ""
        if task.goal_rev < s.goal_rev:
            why = "the request was revised"
        elif s.run is not None and s.run.cancel_requested:
            why = "the run was cancelled"
        else:
            why = "the runtime stopped it"
        record: Record = ToolCancelled(
            output=f"perdure: this call was stopped while it was running: {why}.{effect}",
            reason=f"stopped while executing: {why}",
            while_executing=True,
            **common,
        )
    elif msg.outcome == "unknown":
        record = ToolOutcomeUnknown(
            output=unknown_outcome_text(task.tool_name, f"could not tell ({msg.output})"),
            reason="the tool could not tell: " + msg.output,
            **common,
        )
    elif msg.outcome == "timeout" and never:
        record = ToolOutcomeUnknown(
            output=unknown_outcome_text(task.tool_name, f"timed out ({msg.output})"),
            reason="timeout",
            **common,
        )
    else:
        record = ToolCompleted(
            output=msg.output,
            is_error=msg.is_error or msg.outcome != "ok",
            kind=_RESULT_KIND[msg.outcome],
            attempt=msg.attempt,
            duration=msg.duration,
            terminate=msg.terminate,
            **common,
        )
    return Step((record,))


def _retry_failed_attempt(s: SessionState, env: Env, task: Task, msg: ToolFinished) -> Step:
    """A transient failure (or a timeout) under the tool's ``RetryPolicy``, if it has one.

    NOTHING when no policy applies (the caller records the failure as usual): no
    policy, a NEVER call (as recorded or as registered now), a timeout the policy does
    not retry, or a call whose run was cancelled or whose request was revised. Else a
    ``ToolRetryPending`` (committed before the back-off), or, once ``max_attempts``
    attempts have failed, the last error with the number of attempts made.
    """
    assert task.executing is not None
    tool = tool_for(env.tools, task)
    policy = tool.retry if tool is not None else None
    if tool is None or policy is None:
        return NOTHING
    if not (ReplayPolicy(task.executing.replay).replayable and tool.replay.replayable):
        return NOTHING
    if msg.outcome == "timeout" and not policy.retry_timeouts:
        return NOTHING
    winding_down = s.run is not None and s.run.cancel_requested and task.compensates is None
    if task.goal_rev < s.goal_rev or winding_down:
        return NOTHING
    common: dict[str, Any] = {"session_id": s.session_id, "call_id": task.call_id, "at": env.now}
    if msg.attempt >= policy.max_attempts:
        gave_up = ToolCompleted(
            output=(
                f"perdure: this call failed {msg.attempt} times (its retry policy allows "
                f"{policy.max_attempts} attempts); it was not retried again. "
                f"The last error: {msg.output}"
            ),
            is_error=True,
            kind=_RESULT_KIND[msg.outcome],
            attempt=msg.attempt,
            duration=msg.duration,
            **common,
        )
        return Step((gave_up,))
    wait = policy.delay(msg.attempt, msg.jitter, msg.retry_after)
    pending = ToolRetryPending(
        attempt=msg.attempt, not_before=env.now + wait, error=msg.output, **common
    )
    return Step((pending,))


def _heartbeat(s: SessionState, env: Env, msg: HeartbeatReported) -> Step:
    """The latest progress of a running attempt, for a later attempt to resume from."""
    task = s.tasks.get(msg.call_id)
    if task is None or task.phase != "executing" or task.attempt != msg.attempt:
        return NOTHING  # the attempt is over: its heartbeat tells nothing any more
    beat = ToolHeartbeat(
        session_id=s.session_id,
        call_id=task.call_id,
        attempt=msg.attempt,
        details=msg.details,
        at=env.now,
    )
    return Step((beat,))


def _back_off_over(s: SessionState, env: Env, msg: BackOffOver) -> Step:
    """Nothing to record: ``advance`` (through ``_retry``) dispatches the next attempt,
    now that the shell no longer waits for it, unless the session is paused or draining."""
    return NOTHING


def _reconciled(s: SessionState, env: Env, msg: ReconcileFinished) -> Step:
    task = s.tasks.get(msg.call_id)
    if task is None or task.phase != "executing":
        return NOTHING

    def decision(action: str, reason: str) -> RecoveryDecision:
        return RecoveryDecision(
            session_id=s.session_id,
            run_id=s.run.run_id if s.run is not None else "",
            subject=task.call_id,
            found="reconcile answered " + msg.status,
            action=action,
            reason=reason,
            at=env.now,
        )

    if msg.status == "applied":
        done = ToolCompleted(
            session_id=s.session_id,
            call_id=task.call_id,
            output=msg.output,
            is_error=msg.is_error,
            terminate=msg.terminate,
            kind="reconciled",
            attempt=task.attempt,
            at=env.now,
        )
        return Step((decision("record the real result", "the effect had happened"), done))
    tool = tool_for(env.tools, task)
    if msg.status == "not_applied" and task.goal_rev < s.goal_rev:
        why = "the effect had not happened, and the request was revised since"
        cancelled = _task_result_cancelled(s, env, task, "the request was revised before it ran")
        return Step((decision("do not run it", why), cancelled))
    if msg.status == "not_applied" and s.paused:
        # Keep the call pending; advance asks reconcile again once the session resumes
        # (the world may change while paused).
        why = "the effect had not happened; the session is paused"
        return Step((decision("run it once the session is resumed", why),))
    if msg.status == "not_applied" and tool is not None:
        step = _execute(s, env, task, tool, attempt=task.attempt + 1, run_id=_run_id(s))
        return (
            Step((decision("run it once, with the same key", "the effect had not happened"),))
            + step
        )
    if msg.status == "not_applied":
        why = "the effect had not happened, but its tool is no longer registered"
    else:
        why = msg.reason or "reconcile could not tell"
    return Step(
        (
            decision("report outcome unknown", why),
            ToolOutcomeUnknown(
                session_id=s.session_id,
                call_id=task.call_id,
                # The model reads what the check found (e.g. "still running as pid N").
                output=interrupted_text(task.tool_name) + f" The tool's own check found: {why}",
                reason="reconcile: " + why,
                at=env.now,
            ),
        )
    )


# -- command: what callers ask ------------------------------------------------------------------


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
    compensable = s.compensable(done, lambda name: _has_compensation(env, name))
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
    """A person answers a call awaiting one: retry it (same key), skip it, or fail it."""
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
        output = (
            f"perdure: this call needed a person ({task.last_error}); they chose to fail it.{told}"
        )
        is_error = True
    done = ToolCompleted(
        output=output, is_error=is_error, kind="resolved", attempt=task.attempt, **common
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
    compensable = s.compensable(old_goal, lambda name: _has_compensation(env, name))
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


def compensation_id(call_id: str) -> str:
    return f"comp-{call_id}"


def _has_compensation(env: Env, tool_name: str) -> bool:
    tool = env.tools.get(tool_name)
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
    if not _has_compensation(env, task.tool_name):
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
        tool = env.tools.get(s.tasks[call_id].tool_name)
        if tool is not None and tool.compensate_automatically:
            auto_id = f"{request_id}/auto/{call_id}"
            step += _compensate(s, env, call_id, auto_id, automatic=True, goal_rev=goal_rev)
    return step


# -- fork: a new session from a settled prefix of another's history ---------------------------


def fork_points(committed: Sequence[Committed]) -> list[int]:
    """The positions (seqs) of a session's history where a fork may be taken.

    A settled point is the end of a run (its final ``RunFinished``) or the end of a turn
    (the result that made every call of the current model turn terminal), with no
    compensation unfinished; and the end of the history when the session is idle. At
    such a point nothing runs: the fork inherits no call whose effect is in doubt, and
    what it does inherit (a turn to continue, queued input) is taken up by ``recover``.
    """
    if not committed:
        return []
    s = SessionState(committed[0].record.session_id)
    points: list[int] = []
    for c in committed:
        s.apply(c.record)
        s.note_committed(c)
        if _settled_at(s, c.record):
            points.append(c.seq)
    if s.idle and not s.parked and (not points or points[-1] != committed[-1].seq):
        points.append(committed[-1].seq)
    return points


def _settled_at(s: SessionState, record: Record) -> bool:
    if s.compensations:
        return False
    if isinstance(record, RunFinished):
        return record.status in FINAL_RUN_STATUSES and s.run is None
    if not isinstance(record, ToolCompleted | ToolOutcomeUnknown | ToolCancelled):
        return False
    run, gen = s.run, s.current_generation()
    return (
        run is not None
        and not run.cancel_requested
        and gen is not None
        and gen.phase == "completed"
        and gen.goal_rev == s.goal_rev
        and record.call_id in gen.call_ids
        and all(t.terminal for t in s.tasks_of(gen))
    )


def fork_position(committed: Sequence[Committed], at: int | str | None) -> int:
    """Where a fork ``at`` (None: the latest settled point; a run id: its end; a seq)
    is taken, or ``Refused`` naming the nearest valid points."""
    sid = committed[0].record.session_id if committed else "?"
    points = fork_points(committed)
    if not points:
        raise Refused("invalid_state", f"session {sid} has no settled point to fork at yet")
    if at is None:
        return points[-1]
    if isinstance(at, str):
        ends = [(c.seq, c.record) for c in committed if isinstance(c.record, RunFinished)]
        mine = [(seq, end) for seq, end in ends if end.run_id == at]
        if not mine:
            raise Refused("not_found", f"session {sid} has no finished run {at!r}")
        seq, end = mine[-1]
        if end.status == "interrupted":  # continued by a resumed run: its end is the end
            final = [
                n
                for n, r in ends
                if r.submission_id == end.submission_id and r.status in FINAL_RUN_STATUSES
            ]
            seq = final[-1] if final else seq
        if seq in points:
            return seq
        status = next(r.status for n, r in ends if n == seq)
        what = f"run {at} did not finish (it was {status})"
    else:
        if at in points:
            return at
        seq, what = at, f"{at} is not a settled point of session {sid}"
    nearest = ", ".join(
        [f"{p} (before)" for p in points if p < seq][-1:]
        + [f"{p} (after)" for p in points if p > seq][:1]
    )
    raise Refused(
        "invalid_state",
        f"cannot fork there: {what} (the end of a run or of a turn); the nearest valid "
        f"points are {nearest}",
    )


def fork_records(
    committed: Sequence[Committed], session_id: str, position: int, request_id: str, now: float
) -> tuple[Record, ...]:
    """The records of a fork: its own ``SessionCreated`` and ``SessionForked``, then a copy
    of every record of the source up to ``position`` under the fork's id (one commit).

    Copied calls keep their results and their ``executing`` records: they are history,
    never run again. The source's ``SessionParked`` is not copied (the fork is new).
    """
    source = committed[0].record
    assert isinstance(source, SessionCreated), "a session's history starts with SessionCreated"
    copies = tuple(
        evolve(c.record, session_id=session_id)
        for c in committed
        if c.seq <= position and not isinstance(c.record, SessionCreated | SessionParked)
    )
    created = SessionCreated(
        session_id=session_id,
        system=source.system,
        request_id=request_id,
        budget=source.budget,
        if_busy=source.if_busy,
        tools=source.tools,  # a fork of a sub-agent keeps its tools (not its parent call)
        at=now,
    )
    forked = SessionForked(
        session_id=session_id,
        source=source.session_id,
        position=position,
        request_id=request_id,
        records=len(copies),
        at=now,
    )
    return (created, forked, *copies)


# -- the driver: decide, fold, advance, until nothing changes ----------------------------------


def settle(
    s: SessionState, env: Env, view: View, first: Step = NOTHING, *, recovering: bool = False
) -> Step:
    """Fold ``first`` into ``s``, then keep advancing until the session is settled.

    Returns everything to commit (``first`` included) as one step: e.g. the last tool
    result and the start of the next model turn land in the same commit. Mutates
    ``s`` by applying the returned records (the caller rolls back by re-folding the
    log if the commit fails). Calls settled by the step get their ``Forget`` effect,
    except those settled by recovery itself (``recovering``): a runner the dead
    process left behind may still be using what the tool kept.
    """
    s.apply_all(first.records)
    total = first
    models, tools, cancelling = set(view.models), set(view.tools), set(view.cancelling)
    waiting = set(view.waiting)
    _note_effects(first.effects, models, tools, cancelling, waiting)
    for _ in range(10_000):
        current = View(
            models=frozenset(models),
            tools=frozenset(tools),
            cancelling=frozenset(cancelling),
            waiting=frozenset(waiting),
            draining=view.draining,
            handing_over=view.handing_over,
        )
        step = advance(s, env, current)
        if not step:
            settled = total.records[len(first.records) :] if recovering else total.records
            return total + _forget(s, env, settled, tools)
        s.apply_all(step.records)
        _note_effects(step.effects, models, tools, cancelling, waiting)
        total += step
    raise AssertionError(f"session {s.session_id}: advance did not settle")


def _forget(s: SessionState, env: Env, records: tuple[Record, ...], running: set[str]) -> Step:
    """``Forget`` for every executed call that ``records`` settle, once nothing runs it."""
    if not env.forget_settled:
        return NOTHING
    effects: list[Effect] = []
    for record in records:
        if not isinstance(record, ToolCompleted | ToolOutcomeUnknown | ToolCancelled):
            continue
        task = s.tasks[record.call_id]
        tool = tool_for(env.tools, task)
        if task.executing is None or tool is None or tool.forget is None:
            continue
        if record.call_id not in running:
            effects.append(Forget(task.executing, tool))
    return Step((), tuple(effects))


def _note_effects(
    effects: tuple[Effect, ...],
    models: set[str],
    tools: set[str],
    cancelling: set[str],
    waiting: set[str],
) -> None:
    for e in effects:
        if isinstance(e, CallModel):
            models.add(e.generation_id)
        elif isinstance(e, RunTool | Reconcile):
            tools.add(e.call_id)
        elif isinstance(e, CancelTool):
            cancelling.add(e.call_id)
        elif isinstance(e, CancelModel):
            models.discard(e.generation_id)
        elif isinstance(e, BackOff):
            waiting.add(e.call_id)
        elif isinstance(e, StopBackOff):
            waiting.discard(e.call_id)


# -- the tables ---------------------------------------------------------------------------------

COMMANDS: dict[type, Callable[[SessionState, Env, Any], tuple[Step, Answer]]] = {
    Submit: _submit,
    Cancel: _cancel,
    Approve: _approve,
    Revise: _revise,
    Pause: _pause,
    Resume: _resume,
    Compensate: _compensate_command,
    Resolve: _resolve,
}

RESULTS: dict[type, Callable[[SessionState, Env, Any], Step]] = {
    ModelReplied: _model_replied,
    ModelFailed: _model_failed,
    ToolFinished: _tool_finished,
    ReconcileFinished: _reconciled,
    HeartbeatReported: _heartbeat,
    BackOffOver: _back_off_over,
}
