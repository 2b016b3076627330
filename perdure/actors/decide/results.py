"""``on_result``: what an actor's report changes (``RESULTS``).

A model reply (the turn completes and its calls become tasks), a model error (a
retry after a back-off, or the run fails), a tool result (by the tool's policy: a
result, a retry after a back-off, a wait for a person, an unknown outcome), a
heartbeat, the end of a back-off, a reconciliation (with, for a workspace call, the
diff from its before-snapshot), the end of a rewind's restore. A report that no longer
matches the state (a superseded attempt, a discarded turn) changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import evolve

from perdure.actors.decide import compacting
from perdure.actors.decide.verbs import (
    ASK_A_PERSON,
    _execute,
    _finish,
    _run_id,
    _task_result_cancelled,
    _unknown_or_ask,
    asks_a_person,
    interrupted_text,
    model_failure_words,
    model_retry_at,
    tool_for,
    unknown_outcome_text,
)
from perdure.actors.entities import Generation, Task
from perdure.actors.protocol import (
    NOTHING,
    AgentLinked,
    BackOffOver,
    Env,
    HeartbeatReported,
    ModelFailed,
    ModelReplied,
    ReconcileFinished,
    RestoreFinished,
    Result,
    Step,
    ToolFinished,
    WorkspaceSeen,
)
from perdure.actors.state import SessionState
from perdure.storage.records import (
    AgentStarted,
    GenerationCompleted,
    Record,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    ToolAwaitingHuman,
    ToolCall,
    ToolCancelled,
    ToolCompleted,
    ToolHeartbeat,
    ToolResultKind,
    ToolRetryPending,
    ToolTaskCreated,
    WorkspaceCheckpointed,
    WorkspaceRestored,
)
from perdure.tools.contract import ReplayPolicy


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
    if compacting.is_summary(s, msg.generation_id):
        return compacting.summary_replied(s, env, msg)
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
        tool = env.tools.get(call.name)
        secret = sorted(tool.secret_params & call.input.keys()) if tool is not None else []
        if call_id != call.call_id or secret != call.secret:
            # A copy only when something changes (a frozen call is shared otherwise:
            # an ``evolve`` per call was the costliest line of a reply's decision).
            call = evolve(call, call_id=call_id, secret=secret)
        calls.append(call)
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
            secret=c.secret,
            at=env.now,
        )
        for c in calls
    ]
    return Step(tuple(records))


def _model_failed(s: SessionState, env: Env, msg: ModelFailed) -> Step:
    if compacting.is_summary(s, msg.generation_id):
        return compacting.summary_failed(s, env, msg)
    gen = _live_generation(s, msg.generation_id)
    if gen is None:
        return NOTHING
    not_before = model_retry_at(env, msg)
    if not_before is not None:
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
    failed = _finish(s, env, "failed", reason="the model call " + model_failure_words(msg))
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
    """The attempt's outcome, with its workspace checkpoints (a workspace call's)."""
    task = s.tasks.get(msg.call_id)
    if task is None or task.phase != "executing" or task.attempt != msg.attempt:
        return NOTHING  # a duplicate or a report from a superseded attempt
    outcome = _tool_outcome(s, env, task, msg)
    if msg.workspace is None or not msg.workspace.before:
        return outcome
    return Step((checkpointed(s, env, task, msg.workspace),)) + outcome


def checkpointed(s: SessionState, env: Env, task: Task, seen: WorkspaceSeen) -> Record:
    return WorkspaceCheckpointed(
        session_id=s.session_id,
        call_id=task.call_id,
        attempt=task.attempt,
        before=seen.before,
        after=seen.after,
        changed=list(seen.changed),
        skipped=list(seen.skipped),
        outside=list(seen.outside),
        at=env.now,
    )


def _tool_outcome(s: SessionState, env: Env, task: Task, msg: ToolFinished) -> Step:
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
        record = _unknown_or_ask(
            s,
            env,
            task,
            reason="the tool could not tell: " + msg.output,
            output=unknown_outcome_text(task.tool_name, f"could not tell ({msg.output})"),
        )
    elif msg.outcome == "timeout" and never:
        record = _unknown_or_ask(
            s,
            env,
            task,
            reason=f"timeout ({msg.output})" if asks_a_person(s, env, task) else "timeout",
            output=unknown_outcome_text(task.tool_name, f"timed out ({msg.output})"),
        )
    else:
        record = ToolCompleted(
            output=msg.output,
            is_error=msg.is_error or msg.outcome != "ok",
            kind=_RESULT_KIND[msg.outcome],
            attempt=msg.attempt,
            duration=msg.duration,
            terminate=msg.terminate,
            goal_rev=task.goal_rev,
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
            goal_rev=task.goal_rev,
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


def _agent_linked(s: SessionState, env: Env, msg: AgentLinked) -> Step:
    """A running attempt started a sub-agent: the parent's record of the link."""
    task = s.tasks.get(msg.call_id)
    if task is None or task.phase != "executing" or task.attempt != msg.attempt:
        return NOTHING  # the attempt is over: its child answers nobody here
    if msg.child in task.children:
        return NOTHING  # a re-run found the child it had started: linked already
    started = AgentStarted(
        session_id=s.session_id,
        call_id=task.call_id,
        attempt=msg.attempt,
        child=msg.child,
        at=env.now,
    )
    return Step((started,))


def _back_off_over(s: SessionState, env: Env, msg: BackOffOver) -> Step:
    """Nothing to record: ``advance`` (through ``_retry``) dispatches the next attempt,
    now that the shell no longer waits for it, unless the session is paused or draining."""
    return NOTHING


def _reconciled(s: SessionState, env: Env, msg: ReconcileFinished) -> Step:
    """What a reconcile found, and for a workspace call what the diff from its
    before-snapshot says: the checkpoints are recorded with the decision."""
    task = s.tasks.get(msg.call_id)
    if task is None or task.phase != "executing":
        return NOTHING
    seen = msg.workspace
    if seen is None:
        return _reconciled_by_tool(s, env, task, msg)
    step = _reconciled_by_tool(s, env, task, _with_workspace(env, task, msg, seen))
    if not seen.before:
        return step
    return Step((checkpointed(s, env, task, seen),)) + step


def _with_workspace(
    env: Env, task: Task, msg: ReconcileFinished, seen: WorkspaceSeen
) -> ReconcileFinished:
    """The reconcile's answer in the light of the workspace diff.

    A tool whose only effect is the workspace (the built-in file tools) that changed
    nothing did not take effect: it runs once more (a tool's own "applied" stands: a
    write of the content already there changes nothing and is done). For any other
    workspace tool (``bash``) the diff cannot prove the call did nothing, so an unknown
    outcome names the files that changed, or says none did, and that any other effect
    stays unknown.
    """
    tool = tool_for(env.tools, task)
    only_files = tool is not None and tool.workspace_only
    if not seen.before:  # no before-snapshot: the attempt never reached its tool
        return evolve(
            msg,
            status="not_applied",
            reason="the call was interrupted before its tool started (no checkpoint of it)",
        )
    if only_files and not seen.changed and msg.status != "applied":
        return evolve(
            msg,
            status="not_applied",
            reason="no file of the workspace changed since the call started",
        )
    files = describe_changes(seen.changed)
    if msg.status == "unknown":
        other = "" if only_files else "; any effect outside the workspace files stays unknown"
        found = f"{msg.reason}; " if msg.reason else ""
        return evolve(msg, reason=f"{found}in the workspace {files}{other}")
    if msg.status == "applied" and seen.changed:
        return evolve(msg, output=f"{msg.output}\n[perdure: in the workspace {files}]")
    return msg


def describe_changes(changed: tuple[str, ...] | list[str], limit: int = 50) -> str:
    """The files a call changed, in words the model reads."""
    if not changed:
        return "no file changed"
    shown = ", ".join(changed[:limit])
    more = f" and {len(changed) - limit} more" if len(changed) > limit else ""
    noun = "file" if len(changed) == 1 else "files"
    return f"{len(changed)} {noun} changed: {shown}{more}"


def _reconciled_by_tool(s: SessionState, env: Env, task: Task, msg: ReconcileFinished) -> Step:

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
            goal_rev=task.goal_rev,
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
        # The decision says how it is known when that was said (e.g. no file of the
        # workspace changed, or the attempt never reached its tool).
        why = "the effect had not happened" + (f": {msg.reason}" if msg.reason else "")
        step = _execute(s, env, task, tool, attempt=task.attempt + 1, run_id=_run_id(s))
        return Step((decision("run it once, with the same key", why),)) + step
    if msg.status == "not_applied":
        why = "the effect had not happened, but its tool is no longer registered"
    else:
        why = msg.reason or "reconcile could not tell"
    action = ASK_A_PERSON if asks_a_person(s, env, task) else "report outcome unknown"
    outcome = _unknown_or_ask(
        s,
        env,
        task,
        reason="reconcile: " + why,
        # The model reads what the check found (e.g. "still running as pid N").
        output=interrupted_text(task.tool_name) + f" The tool's own check found: {why}",
    )
    return Step((decision(action, why), outcome))


def _restore_finished(s: SessionState, env: Env, msg: RestoreFinished) -> Step:
    """A rewind's restore is over (or was refused by the store): record it."""
    if s.restoring is None or s.restoring.request_id != msg.request_id:
        return NOTHING
    done = WorkspaceRestored(
        session_id=s.session_id,
        request_id=msg.request_id,
        tree=msg.tree,
        before=msg.before,
        error=msg.error,
        at=env.now,
    )
    return Step((done,))


RESULTS: dict[type, Callable[[SessionState, Env, Any], Step]] = {
    ModelReplied: _model_replied,
    ModelFailed: _model_failed,
    ToolFinished: _tool_finished,
    ReconcileFinished: _reconciled,
    HeartbeatReported: _heartbeat,
    AgentLinked: _agent_linked,
    BackOffOver: _back_off_over,
    RestoreFinished: _restore_finished,
}
