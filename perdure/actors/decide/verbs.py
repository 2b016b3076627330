"""The shared verbs of the decisions: what several doors of the core say and do alike.

Words the model reads (an unknown outcome, an interrupted call), the identity of a
call (its idempotency key and fingerprint), the back-off formula of a model retry,
and the small steps every door takes: start a model turn, finish a run, cancel a
call that has not run, commit a call's ``executing`` record, stop what runs and
cancel what has not (``_call_off``). Everything here is a pure function of the
state and the ``Env``; the doors (``advancing``, ``recovery``, ``results``,
``commands``) are built from these.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from perdure.actors.entities import Task
from perdure.actors.lifecycle import (
    FAILED_ATTEMPT_PHASES,
    TASK_PHASES,
    TaskPhase,
)
from perdure.actors.protocol import (
    NOTHING,
    CallModel,
    CancelTool,
    Effect,
    Env,
    ModelFailed,
    Overlap,
    RunTool,
    Step,
    StopBackOff,
    View,
)
from perdure.actors.state import SessionState
from perdure.backoff import Backoff
from perdure.budget import over_budget
from perdure.storage.records import (
    ContextCompacted,
    GenerationStarted,
    Record,
    RunFinished,
    RunStarted,
    RunStatus,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from perdure.tools.contract import ReplayPolicy, Tool


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
    """A model retry's wait (``perdure.backoff``), never shorter than the server's
    retry-after, which is believed up to ten times the cap."""
    policy = Backoff(initial=env.limits.retry_base, cap=env.limits.retry_cap)
    told = None if retry_after is None else min(retry_after, env.limits.retry_cap * 10)
    return policy.delay(attempt, jitter, told)


def model_retry_at(env: Env, msg: ModelFailed) -> float | None:
    """When a failed model call (a turn's or a summary's) is made again, or None when it
    is not: it was not retryable, or its attempts are spent."""
    if not msg.retryable or msg.attempt >= env.limits.max_model_attempts:
        return None
    if msg.fallback:  # the back-off was for the provider that failed, not the next one
        return env.now
    return env.now + retry_delay(env, msg.attempt, msg.retry_after, msg.jitter)


def model_failure_words(msg: ModelFailed) -> str:
    """Why a failed model call is not made again, for the reason a record gives."""
    why = "a non-retryable error" if not msg.retryable else f"{msg.attempt} attempts"
    return f"failed after {why}: {msg.error}"


def registered_for(tools: Mapping[str, Tool], task: Task) -> Tool | None:
    """The registered tool ``task``'s call runs on: the version it is pinned to (its
    ``executing`` record's, or for a compensation the undone call's) while that version
    is registered; else, for a new call, a log older than versions or a version no
    longer registered, the newest. None if no tool of that name is registered."""
    newest = tools.get(task.tool_name)
    if newest is None or task.pinned_version is None:
        return newest
    return newest.at_version(task.pinned_version) or newest


def tool_for(tools: Mapping[str, Tool], task: Task) -> Tool | None:
    """The tool that runs ``task``: its registered tool (the version it is pinned to,
    ``registered_for``), or that tool's compensation."""
    tool = registered_for(tools, task)
    if task.compensates is not None:
        return tool.compensation if tool is not None else None
    return tool


def version_words(tools: Mapping[str, Tool], task: Task) -> str:
    """What recovery's decision says of the version a call runs on: nothing while a
    tool has one version and the call started on it; which version it stays on when
    several are registered; that its version is gone and the newest is used instead."""
    newest = tools.get(task.tool_name)
    pinned = task.pinned_version
    if newest is None or pinned is None:
        return ""
    if newest.at_version(pinned) is not None:
        if not newest.earlier:
            return ""
        registered = ", ".join(newest.versions)
        return f"; it stays on version {pinned}, which it started on (registered: {registered})"
    return (
        f"; version {pinned}, which it started on, is no longer registered: version "
        f"{newest.version}, the newest, takes it under the rule for a changed definition"
    )


def not_granted(s: SessionState, tool_name: str) -> bool:
    """True if the session was created with a grant of tools that leaves ``tool_name``
    out: a call to it is refused at dispatch, whatever the runtime registers."""
    return s.allowed_tools is not None and tool_name not in s.allowed_tools


def _run_id(s: SessionState) -> str:
    """The run that owns work started now ("" for a compensation outside any run)."""
    return s.run.run_id if s.run is not None else ""


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


def _continue_turn(s: SessionState, env: Env, run_id: str, submission_id: str) -> Step:
    turns = len(s.submissions[submission_id].generations)
    limit = env.limits.max_turns
    if turns >= limit:
        return _finish(s, env, "failed", reason=f"the run reached its limit of {limit} model turns")
    return _budget_stop(s, env) or _next_generation(s, env, run_id, submission_id)


def _budget_stop(s: SessionState, env: Env) -> Step:
    """Before a model call: the run finishes ``stopped`` if a budget in force is spent.

    The spend is the usage folded from the log (every reply, every failed attempt), so
    a restart counts what was spent before it. The session's own budget, if it was
    given one, replaces the runtime's default.
    """
    budget = s.budget if s.budget is not None else env.limits.budget
    if budget is None or s.run is None:
        return NOTHING
    why = over_budget(budget, s.run.spend, s.spend, env.limits.prices)
    return NOTHING if why is None else _finish(s, env, "stopped", reason=why)


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


def _holding(s: SessionState, view: View) -> bool:
    """Start no model call and no run: the session is paused, the process drains, or
    the session is being handed to another node (its current tool calls still run)."""
    return s.paused or view.draining or view.handing_over


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
        secret=sorted(tool.secret_params & args.keys()),
        tool_version=_version_run(env, task, tool),
    )
    beat = task.last_heartbeat.details if task.last_heartbeat is not None else None
    # Where this session left the workspace: the shell names what changed since by
    # other hands (another session, a person) when it snapshots before the call.
    since = next((m.after for m in reversed(s.checkpoints) if m.after), "")
    run = RunTool(record, tool, last_heartbeat=beat, workspace_since=since)
    return Step((record,), (run,))


def _version_run(env: Env, task: Task, tool: Tool) -> str:
    """The version an attempt of ``task`` on ``tool`` runs on: the tool's own, or for a
    compensation the version of the tool whose compensation it is."""
    if task.compensates is None:
        return tool.version
    registered = registered_for(env.tools, task)
    return registered.version if registered is not None else tool.version


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


# What a person is asked to say about a call whose outcome is unknown, in the words of
# rt.resolve: the decision records and the person's views name them alike.
ASK_A_PERSON: Final = (
    "ask a person: applied (resolve skip, with the result), not applied (resolve retry: "
    "run once more, same key) or failed (resolve fail)"
)


def asks_a_person(s: SessionState, env: Env, task: Task) -> bool:
    """Whether an unknown outcome of ``task`` goes to a person rather than the model.

    Its tool, as registered now, must say so (``unknown_outcome="ask_person"``); and a
    call of a run that is being cancelled, or of a request revised since, is not held
    for anyone (the cancel or the revision would call the wait off at once): its
    outcome is told to the model as unknown.
    """
    tool = tool_for(env.tools, task)
    if tool is None or tool.unknown_outcome != "ask_person":
        return False
    if task.compensates is not None:
        return True  # a compensation lives beside runs: no cancel or revision ends it
    winding_down = s.run is not None and s.run.cancel_requested
    return not winding_down and task.goal_rev >= s.goal_rev


def _unknown_or_ask(
    s: SessionState, env: Env, task: Task, *, reason: str, output: str
) -> ToolOutcomeUnknown | ToolAwaitingHuman:
    """An unknown outcome: told to the model (``output``), or, if the tool asks for
    one, the call waits for a person, who reads ``reason``."""
    if asks_a_person(s, env, task):
        return ToolAwaitingHuman(
            session_id=s.session_id,
            call_id=task.call_id,
            attempt=task.attempt,
            reason=f"its outcome is unknown: {reason}",
            unknown_outcome=True,
            at=env.now,
        )
    return ToolOutcomeUnknown(
        session_id=s.session_id, call_id=task.call_id, output=output, reason=reason, at=env.now
    )


def _called_off(
    s: SessionState, env: Env, task: Task, reason: str
) -> ToolCancelled | ToolOutcomeUnknown:
    """The result of a call a cancel, a revision or a spent resume budget ends before it
    runs (again). One that waited for a person to say whether it took effect keeps its
    outcome unknown: the model is told so, never that it did not run."""
    if task.phase == "awaiting_human" and task.unknown_outcome:
        why = (
            f"was waiting for a person to say whether it took effect ({task.last_error}); "
            f"nobody had answered when it was called off ({reason})"
        )
        return ToolOutcomeUnknown(
            session_id=s.session_id,
            call_id=task.call_id,
            output=unknown_outcome_text(task.tool_name, why),
            reason=f"called off while waiting for a person: {reason}",
            at=env.now,
        )
    return _task_result_cancelled(s, env, task, reason)


def _call_off(
    s: SessionState, env: Env, view: View, tasks: Sequence[Task], reason: str
) -> tuple[list[Record], list[Effect], bool]:
    """Stop what runs and cancel what has not: how a cancel and a revision call work off.

    A call not started (or between two attempts) gets its ``ToolCancelled`` for
    ``reason`` (and its back-off timer stops); an executing call is stopped where its
    tool is ``cancellable`` and this process runs it, or else left to finish (its late
    result is recorded). Returns the records, the effects, and whether a call still
    executes. Terminal calls are skipped.
    """
    records: list[Record] = []
    effects: list[Effect] = []
    executing = False
    for task in tasks:
        if task.terminal:
            continue
        if task.phase == "executing":
            executing = True
            tool = registered_for(env.tools, task)
            stoppable = tool is not None and tool.cancellable
            if stoppable and task.call_id in view.tools and task.call_id not in view.cancelling:
                effects.append(CancelTool(task.call_id))
        else:
            records.append(_called_off(s, env, task, reason))
            if task.call_id in view.waiting:
                effects.append(StopBackOff(task.call_id))
    return records, effects, executing


def every_phase_has_a_row(table: Mapping[TaskPhase, object], name: str) -> None:
    """A table keyed by task phase must answer for every phase: checked at import, so a
    new phase without its rows is an error before any session runs, not a KeyError in one."""
    missing = [phase for phase in TASK_PHASES if phase not in table]
    extra = [str(phase) for phase in table if phase not in TASK_PHASES]
    if missing or extra:
        raise ImportError(
            f"the table {name} has no row for the phase(s) {missing}"
            + (f" and rows for unknown phase(s) {extra}" if extra else "")
        )


# -- what may start before its commit is durable (docs/DESIGN.md, "What must be durable
# before what") --------------------------------------------------------------------------


def overlapping(step: Step, overlap: Overlap) -> tuple[Effect, ...]:
    """The effects of ``step`` that may start while its records commit.

    None in a step that starts or resumes a run: the resume budget counts the runs that
    died, so a run's start must be durable before the work that may kill the process
    (a reply that crashes every process receiving it would otherwise start the run
    again and again, each start lost with its process). Nor in a step that compacts the
    context: the turn after a compaction reads its summary from the log. What overlaps
    is a running run's next turn: its model call beside the commit of the last turn's
    results.
    """
    if any(isinstance(r, RunStarted | ContextCompacted) for r in step.records):
        return ()
    return tuple(e for e in step.effects if overlaps_commit(e, overlap))


def overlaps_commit(effect: Effect, overlap: Overlap) -> bool:
    """Whether ``effect`` may start before the records of its step are durable.

    Everything else waits for the commit: a tool that is not SAFE (its ``executing``
    record is what recovery reads to know the call may have run), a reconcile, a
    forget (it drops state a recovery could still need), a cancel, a back-off.
    """
    if isinstance(effect, CallModel):
        return overlap.model_calls
    if isinstance(effect, RunTool):
        return overlap.safe_tools and effect.executing.replay == ReplayPolicy.SAFE.value
    return False
