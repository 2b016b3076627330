"""A readable timeline of a session, straight from its records (pure; no I/O).

The one renderer of records as lines: ``perdure show``, ``perdure demo`` and
``perdure run``'s live output all use it. Inputs, runs, model turns, tool calls
with their phases and durations, every restart of the runtime, and every recovery
decision with its reason. Each line is ``(seq, kind, text)`` where kind is a
style hint ("input", "model", "tool", "restart", "recovery", "outcome",
"warning", "plain") for colouring. Failed attempts show their retry and back-off,
calls waiting for a person say how to answer, and a run of heartbeats of one call
is one line with the latest details.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from perdure.storage.records import (
    AgentStarted,
    ApprovalDecided,
    CancelRequested,
    Committed,
    CompactionAbandoned,
    CompactionRetryPending,
    CompactionStarted,
    ContextCompacted,
    GenerationCompleted,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    LogOpened,
    RecoveryDecision,
    ResolutionDecided,
    RetryPending,
    RunFinished,
    RunStarted,
    SessionCreated,
    SessionForked,
    SessionParked,
    SessionPaused,
    SessionResumed,
    ToolAwaitingApproval,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolRetryPending,
    ToolTaskCreated,
    WorkspaceCheckpointed,
    WorkspaceRestored,
    WorkspaceRestoreStarted,
)
from perdure.storage.redact import redacted

Line = tuple[int, str, str]


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def _args(values: dict[str, object]) -> str:
    return ", ".join(f"{k}={_short(repr(v), 40)}" for k, v in values.items())


class Timeline:
    """The timeline built one record at a time: ``add`` returns the record's new lines.

    Both faces use it: ``render`` (``perdure show``, the demo) over a whole session,
    and ``perdure run``'s live output record by record. A stretch of heartbeats of
    one call is one line, updated in ``lines``; ``add`` returns it only the first
    time. A model reply whose text was already shown as it streamed (its generation
    id in ``streamed``) is rendered without the text.
    """

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.streamed: set[str] = set()
        self._tools: dict[str, str] = {}
        self._started: dict[str, float] = {}
        # The heartbeat lines since the last other line: call id -> (line index, count).
        self._beats: dict[str, tuple[int, int]] = {}

    def add(self, c: Committed) -> list[Line]:
        lines, tools, started = self.lines, self._tools, self._started
        r = redacted(c.record)  # a timeline is shown to people: secrets masked
        seq = c.seq
        stamp = _clock(r.at)
        before = len(lines)

        def add(kind: str, text: str, seq: int = seq, stamp: str = stamp) -> None:
            lines.append((seq, kind, f"{stamp}  {text}"))

        if isinstance(r, LogOpened):
            add("restart", f"── runtime started (epoch {r.epoch}, pid {r.pid}) ──")
        elif isinstance(r, SessionCreated):
            add("plain", f"session {r.session_id} created")
        elif isinstance(r, SessionForked):
            add(
                "plain",
                f"forked from {r.source} at record {r.position} ({r.records} records copied)",
            )
        elif isinstance(r, InputAccepted):
            cut = f" (interrupts run {r.interrupts})" if r.interrupts else ""
            add("input", f"input {r.submission_id} accepted{cut}: {_short(r.text)!r}")
        elif isinstance(r, RunStarted):
            extra = (
                f" (resumes {r.resumed_from}, attempt {r.resume_attempt})" if r.resumed_from else ""
            )
            add("plain", f"run {r.run_id} started{extra}")
        elif isinstance(r, RunFinished):
            kind = "outcome" if r.status == "completed" else "warning"
            text = f"run {r.run_id} {r.status}"
            if r.final_text:
                text += f": {_short(r.final_text, 200)!r}"
            if r.reason:
                text += f" — {r.reason}"
            add(kind, text)
        elif isinstance(r, GenerationStarted):
            add("model", f"model turn {r.generation_id} requested")
        elif isinstance(r, RetryPending):
            wait = max(0.0, r.not_before - r.at)
            by = f" on {r.provider}" if r.provider else ""
            add(
                "warning", f"model attempt {r.attempt}{by} failed ({r.error}); retry in {wait:.1f}s"
            )
        elif isinstance(r, GenerationCompleted):
            calls = "; ".join(f"{t.name}({_args(t.input)})" for t in r.tool_calls)
            who = " ".join(x for x in (r.provider, r.model) if x)
            text = f"model ({who}) replied" if who else "model replied"
            if r.text and r.generation_id not in self.streamed:
                text += f": {_short(r.text)!r}"
            if calls:
                text += f" → calls {calls}"
            u = r.usage
            text += f"  [{u.input_tokens} in / {u.output_tokens} out tokens]"
            add("model", text)
        elif isinstance(r, ToolTaskCreated):
            tools[r.call_id] = r.tool_name
        elif isinstance(r, ToolAwaitingApproval):
            add("warning", f"{tools.get(r.call_id, '?')} [{r.call_id}] awaits approval")
        elif isinstance(r, ApprovalDecided):
            verdict = "approved" if r.approved else "denied"
            add("plain", f"{tools.get(r.call_id, '?')} [{r.call_id}] {verdict} by the user")
        elif isinstance(r, ToolExecuting):
            started[r.call_id] = r.at
            again = f", attempt {r.attempt}" if r.attempt > 1 else ""
            add(
                "tool",
                f"{r.tool_name} [{r.call_id}] executing ({r.replay}{again}, "
                f"key {r.idempotency_key[:12]}…)",
            )
        elif isinstance(r, AgentStarted):
            add("plain", f"{tools.get(r.call_id, '?')} [{r.call_id}] started sub-agent {r.child}")
        elif isinstance(r, ToolHeartbeat):
            # One line per call for a stretch of heartbeats: how many, and the latest.
            index, count = self._beats.get(r.call_id, (len(lines), 0))
            times = f" ×{count + 1}" if count else ""
            details = _short(json.dumps(r.details, ensure_ascii=False), 80)
            text = f"{stamp}  {tools.get(r.call_id, '?')} [{r.call_id}] heartbeat{times}: {details}"
            if count:
                lines[index] = (seq, "plain", text)
            else:
                lines.append((seq, "plain", text))
            self._beats[r.call_id] = (index, count + 1)
            return lines[before:]  # a later heartbeat of a stretch only updates its line
        elif isinstance(r, ToolRetryPending):
            wait = max(0.0, r.not_before - r.at)
            add(
                "warning",
                f"{tools.get(r.call_id, '?')} [{r.call_id}] attempt {r.attempt} failed "
                f"({_short(r.error, 80)}); retry in {wait:.1f}s with the same key",
            )
        elif isinstance(r, ToolAwaitingHuman):
            answers = (
                "applied, not-applied or failed"
                if r.unknown_outcome
                else "answer with retry, skip or fail"
            )
            add(
                "warning",
                f"{tools.get(r.call_id, '?')} [{r.call_id}] NEEDS A PERSON: {_short(r.reason)} "
                f"({answers})",
            )
        elif isinstance(r, ResolutionDecided):
            said = {"retry": "run it again", "skip": "skip it", "fail": "fail it"}[r.action]
            given = f" with {_short(json.dumps(r.result), 60)}" if r.result is not None else ""
            name = tools.get(r.call_id, "?")
            add("plain", f"{name} [{r.call_id}] a person chose to {said}{given}")
        elif isinstance(r, ToolCompleted):
            name = tools.get(r.call_id, "?")
            took = f" in {r.duration:.2f}s" if r.duration else ""
            how = {
                "ok": "completed",
                "reconciled": "confirmed by reconcile",
                "resolved": "resolved by a person",
            }.get(r.kind, r.kind)
            kind = "warning" if r.is_error else "tool"
            add(kind, f"{name} [{r.call_id}] {how}{took}: {_short(r.output)!r}")
        elif isinstance(r, ToolOutcomeUnknown):
            add(
                "warning", f"{tools.get(r.call_id, '?')} [{r.call_id}] OUTCOME UNKNOWN — {r.reason}"
            )
        elif isinstance(r, ToolCancelled):
            add("warning", f"{tools.get(r.call_id, '?')} [{r.call_id}] cancelled — {r.reason}")
        elif isinstance(r, RecoveryDecision):
            add(
                "recovery",
                f"recovery: {r.subject}: found {r.found} → {r.action} ({r.reason})",
            )
        elif isinstance(r, CancelRequested):
            add("warning", f"cancel requested for run {r.run_id}")
        elif isinstance(r, GoalRevised):
            how = "steered by new input" if r.steered else "revised"
            add("input", f"request {how} (revision {r.goal_rev}): {_short(r.text)!r}")
        elif isinstance(r, SessionPaused):
            add("warning", "session paused")
        elif isinstance(r, SessionResumed):
            add("plain", "session resumed")
        elif isinstance(r, SessionParked):
            add("warning", f"session PARKED: {r.reason}")
        elif isinstance(r, WorkspaceCheckpointed):
            files = ", ".join(r.changed) if r.changed else "no file"
            add("plain", f"{tools.get(r.call_id, '?')} [{r.call_id}] changed {files}")
            if r.outside:
                others = ", ".join(r.outside)
                add("warning", f"before [{r.call_id}], others changed the workspace: {others}")
        elif isinstance(r, WorkspaceRestoreStarted):
            add("warning", f"rewind of the workspace to record {r.position} ({r.tree[:12]})")
        elif isinstance(r, WorkspaceRestored):
            if r.error:
                add("warning", f"rewind REFUSED, nothing restored: {r.error}")
            else:
                add("plain", f"workspace restored (it was {r.before[:12]} before the rewind)")
        elif isinstance(r, CompactionStarted):
            add(
                "model",
                f"context compaction {r.compaction_id}: summarising items {r.start}-{r.end} "
                f"({r.reason or 'auto'}; {r.tokens_before} input tokens last)",
            )
        elif isinstance(r, CompactionRetryPending):
            wait = max(0.0, r.not_before - r.at)
            add(
                "warning",
                f"summary attempt {r.attempt} failed ({r.error}); retry in {wait:.1f}s",
            )
        elif isinstance(r, ContextCompacted):
            add(
                "plain",
                f"context compacted ({r.compaction_id}): the model is sent a summary of the "
                f"first {r.end} items ({r.tokens_before} -> ~{r.tokens_after} tokens)",
            )
        elif isinstance(r, CompactionAbandoned):
            add("warning", f"context compaction {r.compaction_id} made nothing: {r.reason}")
        if len(lines) > before:
            self._beats = {}  # another line came after the heartbeats: a new stretch starts
        return lines[before:]


def render(records: Iterable[Committed]) -> list[Line]:
    """Timeline lines for the given records (a session's, plus LogOpened markers)."""
    timeline = Timeline()
    for c in records:
        timeline.add(c)
    return timeline.lines


def with_restarts(session: list[Committed], system: list[Committed]) -> list[Committed]:
    """Interleave restart markers (LogOpened) that fall within the session's lifetime."""
    if not session:
        return []
    first, last = session[0].seq, session[-1].seq
    markers = [c for c in system if isinstance(c.record, LogOpened) and first < c.seq < last]
    return sorted(session + markers, key=lambda c: c.seq)
