"""What a session is doing, as data: a pure summary of a ``SessionState``.

``summarize`` answers the four questions a restart must answer, for a person or a
program (``GET /v1/sessions/{id}`` and ``perdure show`` both use it):

* which version of the request is in force (``request``: goal revision and text);
* what is done (``done``: answered inputs, completed tool calls of the input in progress);
* what happens next (``next``: one plain sentence per pending step);
* which side effects are unconfirmed (``unconfirmed``: NEVER calls that are executing
  or were cancelled while executing, and results whose outcome is unknown);

plus the runs, every tool task with its phase, pending approvals, calls waiting
for a person to resolve them, recovery decisions and token usage. The result
holds only JSON values. ``render`` turns it into styled lines for the terminal.
Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from perdure.actors.entities import Revision, Task, UserTurn
from perdure.actors.state import SessionState
from perdure.budget import DEFAULT_PRICES, Price, cost_summary
from perdure.storage.records import (
    RecoveryDecision,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
    Usage,
)
from perdure.storage.redact import masked

Summary = dict[str, Any]

# What recovery would do with a call that is executing when the process stops,
# by the policy recorded with the call (the registered policy may narrow it).
_ON_RESTART = {
    "safe": "re-run with the same idempotency key",
    "keyed": "re-run with the same idempotency key",
    "never": "ask the tool's reconcile() if it has one, otherwise report the outcome unknown",
}


def _usage(u: Usage) -> dict[str, int]:
    return attrs.asdict(u)


def status(s: SessionState) -> str:
    """One word: parked, idle, cancelling, paused, awaiting_approval, awaiting_human,
    compensating or running."""
    if s.parked:
        return "parked"
    compensations = s.open_compensations()
    if s.run is None and compensations:
        if s.paused:
            return "paused"
        waiting = any(t.phase == "awaiting_approval" for t in compensations)
        return "awaiting_approval" if waiting else "compensating"
    if s.run is None:
        return "paused" if s.paused and s.queue else "idle" if not s.queue else "running"
    if s.run.cancel_requested:
        return "cancelling"
    if s.paused:
        return "paused"
    if any(t.phase == "awaiting_approval" for t in s.open_tasks()):
        return "awaiting_approval"
    if any(t.phase == "awaiting_human" for t in s.open_tasks()):
        return "awaiting_human"
    return "running"


def _request(s: SessionState) -> dict[str, Any]:
    """The request in force: the latest input, as revised since it was given."""
    submission_id: str | None = None
    revision: Revision | None = None
    for item in s.conversation:
        if isinstance(item, UserTurn):
            submission_id, revision = item.submission_id, None
        elif isinstance(item, Revision):
            revision = item
    if s.run is not None and s.run.submission_id != submission_id:
        submission_id, revision = s.run.submission_id, None
    if submission_id is None:
        return {"goal_rev": s.goal_rev, "submission_id": None, "text": None, "revised": False}
    text = revision.text if revision is not None else s.submissions[submission_id].text
    return {
        "goal_rev": s.goal_rev,
        "submission_id": submission_id,
        "text": text,
        "revised": revision is not None,
        "revision_of": s.submissions[submission_id].text if revision is not None else None,
    }


def _result(task: Task) -> dict[str, Any] | None:
    r = task.result
    if r is None:
        return None
    out: dict[str, Any] = {"output": r.output}
    if isinstance(r, ToolCompleted):
        out.update(kind=r.kind, is_error=r.is_error, duration=r.duration)
    elif isinstance(r, ToolOutcomeUnknown):
        out.update(kind="outcome_unknown", is_error=True, reason=r.reason)
    else:
        out.update(kind="cancelled", is_error=True, reason=r.reason)
    return out


def _task(task: Task) -> dict[str, Any]:
    ex = task.executing
    return {
        "call_id": task.call_id,
        "tool": task.tool_name,
        "phase": task.phase,
        "generation_id": task.generation_id,
        "goal_rev": task.goal_rev,
        "stale": task.stale,
        "input": masked(task.input, task.secret),
        "replay": ex.replay if ex else None,
        "version": task.pinned_version,  # the tool version it runs on (None: not started)
        "attempt": task.attempt,
        "idempotency_key": ex.idempotency_key if ex else None,
        "result": _result(task),
        "last_error": task.last_error or None,
        "retry_not_before": task.not_before,
        "last_heartbeat": task.last_heartbeat.details if task.last_heartbeat else None,
    }


def _unconfirmed(s: SessionState) -> list[dict[str, Any]]:
    out = []
    for task in s.tasks.values():
        ex = task.executing
        never = ex is not None and ex.replay == "never"
        r = task.result
        if task.phase == "executing" and never:
            why = "executing: its effect is not confirmed until its result is saved"
        elif isinstance(r, ToolOutcomeUnknown):
            why = f"outcome unknown: {r.reason}"
        elif isinstance(r, ToolCancelled) and r.while_executing and never:
            why = "cancelled while executing: its effect may have partly happened"
        else:
            continue
        out.append(
            {
                "call_id": task.call_id,
                "tool": task.tool_name,
                "phase": task.phase,
                "replay": ex.replay if ex else None,
                "idempotency_key": ex.idempotency_key if ex else None,
                "why": why,
            }
        )
    return out


def _next(s: SessionState) -> list[str]:
    if s.parked:
        return [f"nothing: the session is parked ({s.parked})"]
    steps: list[str] = []
    run = s.run
    if run is None:
        if not s.queue:
            return ["nothing: the session is idle and waits for input"]
        if s.paused:
            return [f"nothing until resumed (paused); then start a run for {s.queue[0]}"]
        steps.append(f"start a run for input {s.queue[0]}")
    elif run.cancel_requested:
        steps.append(f"finish cancelling run {run.run_id} (it is never resumed)")
    else:
        if s.paused:
            steps.append("nothing new is dispatched until the session is resumed (paused)")
        gen = s.current_generation()
        if gen is None:
            steps.append(f"start the first model turn of run {run.run_id}")
        elif gen.phase == "started":
            steps.append(f"model turn {gen.generation_id}: call the model (attempt {gen.attempt})")
        elif gen.phase == "retry_pending":
            steps.append(
                f"model turn {gen.generation_id}: retry (attempt {gen.attempt}) after a "
                f"retryable error: {gen.last_error}"
            )
        else:
            tasks = s.tasks_of(gen)
            for t in tasks:
                if t.phase == "awaiting_approval":
                    steps.append(f"wait for a human to approve or deny {t.tool_name} [{t.call_id}]")
                elif t.phase in ("created", "approved"):
                    steps.append(f"run {t.tool_name} [{t.call_id}]")
                elif t.phase == "denied":
                    steps.append(f"record that {t.tool_name} [{t.call_id}] was denied")
                elif t.phase == "awaiting_human":
                    steps.append(
                        f"wait for a person to resolve {t.tool_name} [{t.call_id}] (retry, skip "
                        f"or fail): {t.last_error}"
                    )
                elif t.phase == "retry_pending":
                    steps.append(
                        f"retry {t.tool_name} [{t.call_id}] (attempt {t.attempt + 1}, same key) "
                        f"once its back-off is over; attempt {t.attempt}: {t.last_error}"
                    )
                elif t.phase == "executing":
                    replay = t.executing.replay if t.executing else "never"
                    steps.append(
                        f"{t.tool_name} [{t.call_id}] is executing ({replay}); if the process "
                        f"stops first, recovery will {_ON_RESTART[replay]}"
                    )
            if all(t.terminal for t in tasks):
                steps.append(
                    "start the next model turn"
                    if tasks
                    else "finish the run with the model's reply"
                )
        if s.goal_rev > (gen.goal_rev if gen is not None else run.goal_rev):
            steps.append(f"apply revision {s.goal_rev} of the request before anything else")
    if len(s.queue) > (1 if run is None else 0):
        waiting = s.queue[1:] if run is None else s.queue
        steps.append(f"then run the queued input(s): {', '.join(waiting)}")
    return steps


def _decision(d: RecoveryDecision) -> dict[str, Any]:
    return {k: v for k, v in attrs.asdict(d).items() if k != "session_id"}


def summarize(s: SessionState, prices: Mapping[str, Price] = DEFAULT_PRICES) -> Summary:
    """The session's state as JSON-ready data; see the module docstring.

    Cost is the usage of each model at ``prices`` (models without a price are listed).
    """
    current = s.run.run_id if s.run is not None else None
    runs = []
    for run in s.runs.values():
        fin = run.finished
        runs.append(
            {
                "run_id": run.run_id,
                "submission_id": run.submission_id,
                "status": fin.status if fin else "running",
                "goal_rev": run.goal_rev,
                "resumed_from": run.resumed_from,
                "resume_attempt": run.resume_attempt,
                "started_at": run.started_at,
                "finished_at": fin.at if fin else None,
                "final_text": fin.final_text if fin else None,
                "reason": fin.reason if fin else None,
                "usage": _usage(run.usage),
                "cost": cost_summary(run.spend, prices),
            }
        )
    answered = [
        {
            "submission_id": sub.submission_id,
            "status": sub.outcome.status,
            "final_text": sub.outcome.final_text,
            "reason": sub.outcome.reason,
        }
        for sub in s.submissions.values()
        if sub.outcome is not None
    ]
    gen = s.current_generation()
    completed_now = []
    if s.run is not None:
        for gen_id in s.submissions[s.run.submission_id].generations:
            for t in s.tasks_of(s.generations[gen_id]):
                if isinstance(t.result, ToolCompleted):
                    completed_now.append(
                        {"call_id": t.call_id, "tool": t.tool_name, "kind": t.result.kind}
                    )
    return {
        "session_id": s.session_id,
        "status": status(s),
        "system": s.system,
        # lineage: the session it was forked from (and where), the call it serves
        "forked_from": (
            {"session_id": s.forked.source, "position": s.forked.position} if s.forked else None
        ),
        "parent": s.parent,
        "if_busy": s.if_busy,
        "paused": s.paused,
        "parked": s.parked,
        "last_seq": s.last_seq,
        "request": _request(s),
        "done": {"inputs": answered, "tool_calls_this_request": completed_now},
        "next": _next(s),
        "unconfirmed": _unconfirmed(s),
        "current_run": current,
        "queue": [
            {"submission_id": q, "text": s.submissions[q].text, "seq": s.submissions[q].seq}
            for q in s.queue
        ],
        "runs": runs,
        "current_generation": None
        if gen is None
        else {
            "generation_id": gen.generation_id,
            "phase": gen.phase,
            "attempt": gen.attempt,
            "not_before": gen.not_before,
            "last_error": gen.last_error or None,
        },
        "tasks": [_task(t) for t in s.tasks.values()],
        "pending_approvals": [
            {"call_id": t.call_id, "tool": t.tool_name, "input": masked(t.input, t.secret)}
            for t in s.tasks.values()
            if t.phase == "awaiting_approval"
        ],
        "awaiting_resolution": [
            {
                "call_id": t.call_id,
                "tool": t.tool_name,
                "input": masked(t.input, t.secret),
                "reason": t.last_error,
            }
            for t in s.tasks.values()
            if t.phase == "awaiting_human"
        ],
        "decisions": [_decision(d) for d in s.decisions],
        "usage": _usage(s.usage),
        "cost": cost_summary(s.spend, prices),
        "budget": None if s.budget is None else attrs.asdict(s.budget),
        "context": _context(s),
    }


def _context(s: SessionState) -> dict[str, Any]:
    """Context compaction: what the model is sent in place of the older items."""
    pending = s.compacting
    return {
        "items": len(s.conversation),
        "summarised": s.compacted_end,
        "last_input_tokens": s.last_input_tokens,
        "compactions": [
            {
                "compaction_id": c.compaction_id,
                "items": [c.start, c.end],
                "tokens_before": c.tokens_before,
                "tokens_after": c.tokens_after,
                "model": c.model,
                "usage": _usage(c.usage),
                "at": c.at,
            }
            for c in s.compactions
        ],
        "compacting": None
        if pending is None
        else {
            "compaction_id": pending.started.compaction_id,
            "items": [pending.started.start, pending.started.end],
            "attempt": pending.attempt,
            "not_before": pending.not_before,
            "last_error": pending.last_error or None,
        },
        "abandoned": s.abandoned.reason if s.abandoned is not None else None,
    }


def _context_lines(context: Any) -> list[tuple[str, str]]:
    """What ``perdure show`` says of context compaction (nothing before the first)."""
    if not context or not (context["compactions"] or context["compacting"]):
        return []
    out = []
    done = context["compactions"]
    if done:
        last = done[-1]
        out.append(
            (
                "plain",
                f"  context: {len(done)} compaction(s); the model is sent a summary of the "
                f"first {context['summarised']} of {context['items']} items (last: "
                f"{last['tokens_before']} -> ~{last['tokens_after']} tokens, by "
                f"{last['model'] or 'the model'}); the log keeps them all",
            )
        )
    pending = context["compacting"]
    if pending is not None:
        first, end = pending["items"]
        error = f", last error: {pending['last_error']}" if pending["last_error"] else ""
        out.append(
            (
                "warning",
                f"  compacting: items {first}-{end} (attempt {pending['attempt']}{error})",
            )
        )
    if context["abandoned"]:
        out.append(("warning", f"  last compaction made nothing: {context['abandoned']}"))
    return out


def render(summary: Summary) -> list[tuple[str, str]]:
    """``(style, text)`` lines for the terminal (styles as in ``perdure.cli.STYLES``)."""
    out: list[tuple[str, str]] = []
    req = summary["request"]
    out.append(("title", f"session {summary['session_id']}: {summary['status']}"))
    if summary["parked"]:
        out.append(("warning", f"  parked: {summary['parked']}"))
    if req["text"] is not None:
        revised = f" (revised; was {req['revision_of']!r})" if req["revised"] else ""
        out.append(
            ("input", f"  request in force (revision {req['goal_rev']}): {req['text']!r}{revised}")
        )
    done = summary["done"]
    out.append(("plain", f"  done: {len(done['inputs'])} input(s) answered"))
    for item in done["inputs"][-3:]:
        style = "outcome" if item["status"] == "completed" else "warning"
        why = f" — {item['reason']}" if item["reason"] else ""
        out.append((style, f"    {item['submission_id']}: {item['status']}{why}"))
    for call in done["tool_calls_this_request"]:
        out.append(("tool", f"    {call['tool']} [{call['call_id']}] {call['kind']}"))
    out.append(("plain", "  next:"))
    for step in summary["next"]:
        out.append(("plain", f"    {step}"))
    if summary["unconfirmed"]:
        out.append(("warning", "  unconfirmed side effects:"))
        for u in summary["unconfirmed"]:
            out.append(("warning", f"    {u['tool']} [{u['call_id']}]: {u['why']}"))
    else:
        out.append(("plain", "  unconfirmed side effects: none"))
    for a in summary["pending_approvals"]:
        out.append(("warning", f"  awaiting approval: {a['tool']} [{a['call_id']}] {a['input']}"))
    for h in summary["awaiting_resolution"]:
        out.append(("warning", f"  needs a person: {h['tool']} [{h['call_id']}]: {h['reason']}"))
    if summary["decisions"]:
        out.append(("recovery", f"  recovery decisions: {len(summary['decisions'])}"))
    out += _context_lines(summary.get("context"))
    u = summary["usage"]
    out.append(
        (
            "plain",
            f"  usage: {u['input_tokens']} input / {u['output_tokens']} output tokens "
            f"(cache: {u['cache_creation_input_tokens']} written, "
            f"{u['cache_read_input_tokens']} read) over {len(summary['runs'])} run(s)",
        )
    )
    cost = summary["cost"]
    unpriced = (
        f" (no price for {', '.join(cost['unpriced_models'])})" if cost["unpriced_models"] else ""
    )
    out.append(("plain", f"  cost: ${cost['usd']:.4f}{unpriced}"))
    return out
