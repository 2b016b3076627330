"""A session's events folded into neutral parts that frontend protocols encode.

``Follower`` is a pure fold: feed it each ``Event`` of ``Runtime.events`` (the log's
records in order, then live events) and it returns the ``Part``\\ s that event adds
to what a person would see: a run starts, a model turn (a *step*) starts, text and
reasoning open, grow and close, a tool call is asked for, waits for approval and
gets its output, the run ends. perdure's own facts that no chat protocol has a word
for (a restart, a recovery decision, an unknown outcome, a pause) are ``fact``
parts.

Text streams live as ephemeral deltas and is committed whole in
``GenerationCompleted``. The follower remembers what it already sent for each
model turn: live, the committed reply only closes the part (and adds any text the
deltas missed); replayed from the log (a page opened later, a reconnect), the
committed reply becomes one open/delta/close. Deltas count only from the attempt's
start (its ``model_call`` event): a follower that joined in the middle of an attempt
saw none of its beginning and shows that reply when it is committed. So a client
that starts over from any log position sees each reply exactly once.

A follower may be limited to one submission (one user input and everything its
runs did) and may be *cut* at a log position: the parts of events up to there are
``hidden`` (an encoder folds them but sends nothing), so a continuation (after an
approval, or a reconnect) starts where the previous response ended while still
knowing the run's context.

Each part carries the ``seq`` of the record it came from (``None`` for live
deltas): an encoder gives the last frame of each record that seq as its SSE id,
so ``Last-Event-ID`` maps to a log position.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import define, field, frozen

from perdure.storage.bus import Event
from perdure.storage.records import (
    FINAL_RUN_STATUSES,
    ApprovalDecided,
    CancelRequested,
    CompensationFinished,
    CompensationRequested,
    GenerationCompleted,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    LogOpened,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    RunStarted,
    SessionParked,
    SessionPaused,
    SessionResumed,
    ThinkingBlock,
    ToolAwaitingApproval,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
    ToolRetryPending,
    ToolTaskCreated,
    Usage,
)
from perdure.storage.redact import masked


@frozen
class Part:
    """One thing a frontend shows. ``kind`` is one of:

    ``run_start`` (submission_id, request_id, run_id), ``run_end`` (status, reason,
    final_text, usage), ``step_start``/``step_end`` (generation_id),
    ``text_start``/``text_delta``/``text_end`` and the same three for
    ``reasoning_*`` (id, delta), ``tool_start`` (call_id, name, parent),
    ``tool_args`` (call_id, delta), ``tool_input`` (call_id, name, input, parent),
    ``approval`` (call_id, approval_id, reason), ``tool_output`` (call_id, output,
    is_error, kind), ``tool_denied`` (call_id, output), ``blocked`` (call_ids and
    their approval parts: the run now waits for these approvals and nothing else),
    ``fact`` (name, value).
    """

    kind: str
    seq: int | None
    data: dict[str, Any] = field(factory=dict)


# Ephemeral events that stream a model attempt's reply (shown live from its start only).
_STREAMED = frozenset({"text_delta", "thinking_delta", "tool_use_start", "tool_input_delta"})


def approval_id(call_id: str, seq: int) -> str:
    """The id of an approval request: the call and the log position that asked it."""
    return f"{call_id}@{seq}"


def parse_approval_id(value: str) -> tuple[str, int] | None:
    call_id, sep, seq = value.rpartition("@")
    if not sep or not call_id or not seq.isdigit():
        return None
    return call_id, int(seq)


@define
class _Stream:
    """A text or reasoning part that live deltas opened."""

    id: str
    text: str = ""


@define
class Follower:
    """See the module docstring. ``submission``: only that input's parts;
    ``cut``: the parts of events with a seq at or below it are ``hidden``."""

    submission: str | None = None
    cut: int = 0
    done: bool = False  # the followed submission's run has ended
    requests: dict[str, str] = field(factory=dict)  # submission id -> request id
    _gen_sub: dict[str, str] = field(factory=dict)
    _run_sub: dict[str, str] = field(factory=dict)
    _call_sub: dict[str, str] = field(factory=dict)
    _call_gen: dict[str, str] = field(factory=dict)
    _call_name: dict[str, str] = field(factory=dict)
    _active: str | None = None  # the submission whose run is running
    _step: str | None = None  # the generation whose step is open
    _attempt: dict[str, int] = field(factory=dict)
    _text: dict[str, _Stream] = field(factory=dict)
    _reasoning: dict[str, _Stream] = field(factory=dict)
    # Live reasoning already closed because the text began: the commit must not send
    # it again.
    _reasoned: dict[str, list[_Stream]] = field(factory=dict)
    _live_tools: dict[str, str] = field(factory=dict)  # call id -> streamed argument text
    _live_index: dict[tuple[str, int], str] = field(factory=dict)
    _pending: set[str] = field(factory=set)  # calls created and not yet answered
    _ids: set[str] = field(factory=set)  # text and reasoning part ids given out
    _awaiting: dict[str, dict[str, Any]] = field(factory=dict)  # call id -> approval part data

    def feed(self, event: Event) -> list[Part]:
        out: list[Part] = []
        sub = self._owner(event)
        if self.submission is not None and sub != self.submission:
            return []
        if event.seq is None:
            self._live(event, out)
        elif event.record is not None:
            self._record(event.record, event.seq, out)
        return out

    def hidden(self, event: Event) -> bool:
        """Whether ``event`` falls before the cut: its parts update an encoder's state
        (which step is open) but are not sent."""
        return event.seq is not None and event.seq <= self.cut

    # -- whose is it -------------------------------------------------------------------

    def _owner(self, event: Event) -> str | None:
        """The submission an event belongs to (the running one for session-wide facts)."""
        r = event.record
        if r is None:
            data = event.data
            if "submission_id" in data:
                return str(data["submission_id"])
            if "call_id" in data:
                return self._call_sub.get(str(data["call_id"]), self._active)
            return self._active
        if isinstance(r, InputAccepted):
            self.requests[r.submission_id] = r.request_id
            return r.submission_id
        if isinstance(r, RunStarted):
            self._run_sub[r.run_id] = r.submission_id
            return r.submission_id
        if isinstance(r, RunFinished):
            return r.submission_id
        if isinstance(r, GenerationStarted | GenerationCompleted):
            sub = r.submission_id or self._active or ""
            self._gen_sub[r.generation_id] = sub
            return sub
        if isinstance(r, RetryPending):
            return self._gen_sub.get(r.generation_id, self._active)
        if isinstance(r, ToolTaskCreated):
            sub_or_none = self._gen_sub.get(r.generation_id, self._active)
            if sub_or_none is not None:
                self._call_sub[r.call_id] = sub_or_none
            return sub_or_none
        if isinstance(r, RecoveryDecision):
            return self._run_sub.get(r.run_id, self._active)
        call_id = getattr(r, "call_id", None)
        if isinstance(call_id, str):
            return self._call_sub.get(call_id, self._active)
        return self._active

    # -- live (ephemeral) events ---------------------------------------------------------

    def _live(self, event: Event, out: list[Part]) -> None:
        d = event.data
        gen = str(d.get("generation_id", ""))
        if event.kind == "model_call":
            attempt = int(d.get("attempt", 1))
            if self._attempt.get(gen, attempt) != attempt:
                # A new attempt: what the failed one streamed cannot be taken back,
                # so close it and say so.
                self._close_live(gen, out, None)
                out.append(Part("fact", None, {"name": "attempt", "value": dict(d)}))
            self._attempt[gen] = attempt
        elif event.kind in _STREAMED and gen not in self._attempt:
            # Joined in the middle of the attempt (a page opened, a stream resumed, while
            # the model was writing): the start of its text was never seen here, so
            # nothing of it is shown live; the committed reply comes whole.
            return
        elif event.kind == "thinking_delta":
            text = str(d.get("thinking", ""))
            r = self._reasoning.get(gen)
            if r is None:
                r = self._reasoning[gen] = _Stream(self._new_id(gen, "reasoning"))
                out.append(Part("reasoning_start", None, {"id": r.id, "generation_id": gen}))
            if text:
                r.text += text
                out.append(Part("reasoning_delta", None, {"id": r.id, "delta": text}))
        elif event.kind == "text_delta":
            text = str(d.get("text", ""))
            self._end_reasoning(gen, out, None)
            t = self._text.get(gen)
            if t is None:
                t = self._text[gen] = _Stream(self._new_id(gen, "text"))
                out.append(Part("text_start", None, {"id": t.id, "generation_id": gen}))
            if text:
                t.text += text
                out.append(Part("text_delta", None, {"id": t.id, "delta": text}))
        elif event.kind == "tool_use_start":
            call_id, name = str(d.get("id", "")), str(d.get("name", ""))
            self._end_reasoning(gen, out, None)
            if call_id and call_id not in self._live_tools:
                self._live_index[(gen, int(d.get("index", 0)))] = call_id
                self._live_tools[call_id] = ""
                out.append(
                    Part("tool_start", None, {"call_id": call_id, "name": name, "parent": gen})
                )
        elif event.kind == "tool_input_delta":
            found = self._live_index.get((gen, int(d.get("index", 0))))
            piece = str(d.get("partial_json", ""))
            if found is not None and piece:
                self._live_tools[found] += piece
                out.append(Part("tool_args", None, {"call_id": found, "delta": piece}))
        elif event.kind == "tool_progress":
            out.append(
                Part("fact", None, {"name": "progress", "value": dict(d), "transient": True})
            )

    def _new_id(self, gen: str, what: str) -> str:
        """``<generation>.text`` (the same live or replayed, so a replay matches what
        streamed live), suffixed only when that turn already had such a part."""
        n = 0
        found = f"{gen}.{what}"
        while found in self._ids:
            n += 1
            found = f"{gen}.{what}.{n}"
        self._ids.add(found)
        return found

    def _end_reasoning(self, gen: str, out: list[Part], seq: int | None) -> None:
        r = self._reasoning.pop(gen, None)
        if r is not None:
            self._reasoned.setdefault(gen, []).append(r)
            out.append(Part("reasoning_end", seq, {"id": r.id}))

    def _close_live(self, gen: str, out: list[Part], seq: int | None) -> None:
        self._end_reasoning(gen, out, seq)
        t = self._text.pop(gen, None)
        if t is not None:
            out.append(Part("text_end", seq, {"id": t.id}))

    # -- committed records ---------------------------------------------------------------

    def _record(self, r: Any, seq: int, out: list[Part]) -> None:
        value: dict[str, Any]
        if isinstance(r, RunStarted):
            if r.resumed_from is None or self._active != r.submission_id:
                self._active = r.submission_id
                request = self.requests.get(r.submission_id, r.submission_id)
                out.append(
                    Part(
                        "run_start",
                        seq,
                        {
                            "submission_id": r.submission_id,
                            "request_id": request,
                            "run_id": r.run_id,
                        },
                    )
                )
            if r.resumed_from is not None:
                value = {"run_id": r.run_id, "resumed_from": r.resumed_from}
                out.append(Part("fact", seq, {"name": "run_resumed", "value": value}))
        elif isinstance(r, RunFinished):
            if r.status not in FINAL_RUN_STATUSES:
                value = {"run_id": r.run_id, "status": r.status, "reason": r.reason}
                out.append(Part("fact", seq, {"name": "run_interrupted", "value": value}))
                return
            self._end_step(out, seq)
            self._active = None
            if self.submission is not None:
                self.done = True
            out.append(
                Part(
                    "run_end",
                    seq,
                    {
                        "submission_id": r.submission_id,
                        "request_id": self.requests.get(r.submission_id, r.submission_id),
                        "run_id": r.run_id,
                        "status": r.status,
                        "reason": r.reason,
                        "final_text": r.final_text,
                        "usage": _usage(r.usage),
                    },
                )
            )
        elif isinstance(r, GenerationStarted):
            self._end_step(out, seq)
            self._step = r.generation_id
            out.append(Part("step_start", seq, {"generation_id": r.generation_id}))
        elif isinstance(r, GenerationCompleted):
            self._completed(r, seq, out)
        elif isinstance(r, ToolTaskCreated):
            self._call_gen[r.call_id] = r.generation_id
            self._call_name[r.call_id] = r.tool_name
            self._pending.add(r.call_id)
            if r.compensates is not None:
                value = {"call_id": r.call_id, "compensates": r.compensates, "tool": r.tool_name}
                out.append(Part("fact", seq, {"name": "compensation", "value": value}))
        elif isinstance(r, ToolAwaitingApproval):
            self._pending.discard(r.call_id)
            asked = {
                "call_id": r.call_id,
                "approval_id": approval_id(r.call_id, seq),
                "reason": r.reason,
                "name": self._call_name.get(r.call_id, ""),
            }
            self._awaiting[r.call_id] = asked
            out.append(Part("approval", seq, dict(asked)))
            self._check_blocked(seq, out)
        elif isinstance(r, ApprovalDecided):
            if self._awaiting.pop(r.call_id, None) is not None:
                self._pending.add(r.call_id)
            value = {"call_id": r.call_id, "approved": r.approved, "note": r.note}
            out.append(Part("fact", seq, {"name": "approval_decided", "value": value}))
        elif isinstance(r, ToolCompleted | ToolCancelled | ToolOutcomeUnknown):
            self._answered(r, seq, out)
        elif isinstance(r, ToolAwaitingHuman):
            value = {"call_id": r.call_id, "attempt": r.attempt, "reason": r.reason}
            if r.unknown_outcome:  # the person says whether it took effect
                value["unknown_outcome"] = True
            out.append(Part("fact", seq, {"name": "needs_human", "value": value}))
        elif isinstance(r, ToolRetryPending | RetryPending):
            name = "tool_retry" if isinstance(r, ToolRetryPending) else "model_retry"
            value = {"attempt": r.attempt, "error": r.error, "not_before": r.not_before}
            if isinstance(r, ToolRetryPending):
                value["call_id"] = r.call_id
            out.append(Part("fact", seq, {"name": name, "value": value}))
        elif isinstance(r, RecoveryDecision):
            value = {
                "run_id": r.run_id,
                "subject": r.subject,
                "found": r.found,
                "action": r.action,
                "reason": r.reason,
            }
            out.append(Part("fact", seq, {"name": "recovery", "value": value}))
        elif isinstance(r, LogOpened):
            # Whatever the dead process streamed live is gone: close it.
            for gen in list(self._text) + list(self._reasoning):
                self._close_live(gen, out, seq)
            value = {"epoch": r.epoch, "pid": r.pid, "host": r.host, "at": r.at}
            out.append(Part("fact", seq, {"name": "restart", "value": value}))
        else:
            fact = _session_fact(r)
            if fact is not None:
                out.append(Part("fact", seq, {"name": fact[0], "value": fact[1]}))

    def _completed(self, r: GenerationCompleted, seq: int, out: list[Part]) -> None:
        gen = r.generation_id
        # Reasoning first, as the model produced it. Blocks that streamed live are
        # completed (or, already closed, skipped); the others are sent whole.
        closed = self._reasoned.pop(gen, [])
        for block in r.thinking:
            if not isinstance(block, ThinkingBlock):
                continue
            live = self._reasoning.pop(gen, None)
            if live is not None and block.thinking.startswith(live.text):
                rest = block.thinking[len(live.text) :]
                if rest:
                    out.append(Part("reasoning_delta", seq, {"id": live.id, "delta": rest}))
                out.append(Part("reasoning_end", seq, {"id": live.id}))
                continue
            if live is not None:
                out.append(Part("reasoning_end", seq, {"id": live.id}))
            text = block.thinking
            if closed and text.startswith(closed[0].text):
                text = text[len(closed.pop(0).text) :]  # what streamed is already shown
                if not text:
                    continue
            rid = self._new_id(gen, "reasoning")
            out.append(Part("reasoning_start", seq, {"id": rid, "generation_id": gen}))
            if text:
                out.append(Part("reasoning_delta", seq, {"id": rid, "delta": text}))
            out.append(Part("reasoning_end", seq, {"id": rid}))
        self._end_reasoning(gen, out, seq)
        live_text = self._text.pop(gen, None)
        if live_text is not None and r.text.startswith(live_text.text):
            rest = r.text[len(live_text.text) :]
            if rest:
                out.append(Part("text_delta", seq, {"id": live_text.id, "delta": rest}))
            out.append(Part("text_end", seq, {"id": live_text.id}))
        else:
            if live_text is not None:
                out.append(Part("text_end", seq, {"id": live_text.id}))
            if r.text:
                tid = self._new_id(gen, "text")
                out.append(Part("text_start", seq, {"id": tid, "generation_id": gen}))
                out.append(Part("text_delta", seq, {"id": tid, "delta": r.text}))
                out.append(Part("text_end", seq, {"id": tid}))
        for call in r.tool_calls:
            self._call_sub.setdefault(call.call_id, self._gen_sub.get(gen, ""))
            streamed = self._live_tools.pop(call.call_id, None)
            if streamed is None:
                out.append(
                    Part(
                        "tool_start",
                        seq,
                        {"call_id": call.call_id, "name": call.name, "parent": gen},
                    )
                )
            shown = masked(call.input, call.secret)  # secret parameters never leave the log
            if not streamed or not _same_json(streamed, shown):
                args = json.dumps(shown, ensure_ascii=False, separators=(",", ":"))
                if streamed:
                    # The live argument text is incomplete or differs: the committed
                    # input is authoritative (a client should take tool_input's).
                    out.append(
                        Part("fact", seq, {"name": "arguments_replaced", "value": call.call_id})
                    )
                out.append(Part("tool_args", seq, {"call_id": call.call_id, "delta": args}))
            out.append(
                Part(
                    "tool_input",
                    seq,
                    {
                        "call_id": call.call_id,
                        "name": call.name,
                        "input": shown,
                        "parent": gen,
                    },
                )
            )
        usage = _usage(r.usage)
        value = {"generation_id": gen, "usage": usage, "model": r.model, "provider": r.provider}
        out.append(Part("fact", seq, {"name": "usage", "value": value}))

    def _answered(
        self, r: ToolCompleted | ToolCancelled | ToolOutcomeUnknown, seq: int, out: list[Part]
    ) -> None:
        self._pending.discard(r.call_id)
        self._awaiting.pop(r.call_id, None)
        if isinstance(r, ToolCompleted) and r.kind == "denied":
            out.append(Part("tool_denied", seq, {"call_id": r.call_id, "output": r.output}))
        elif isinstance(r, ToolCompleted):
            data = {
                "call_id": r.call_id,
                "output": r.output,
                "is_error": r.is_error,
                "kind": r.kind,
            }
            out.append(Part("tool_output", seq, data))
        elif isinstance(r, ToolOutcomeUnknown):
            value = {"call_id": r.call_id, "reason": r.reason, "output": r.output}
            out.append(Part("fact", seq, {"name": "outcome_unknown", "value": value}))
            data = {"call_id": r.call_id, "output": r.output, "is_error": True, "kind": "unknown"}
            out.append(Part("tool_output", seq, data))
        else:
            data = {"call_id": r.call_id, "output": r.output, "is_error": True, "kind": "cancelled"}
            out.append(Part("tool_output", seq, data))
        self._check_blocked(seq, out)

    def _check_blocked(self, seq: int, out: list[Part]) -> None:
        if self._awaiting and not self._pending:
            asked = [self._awaiting[c] for c in sorted(self._awaiting)]
            out.append(
                Part("blocked", seq, {"call_ids": sorted(self._awaiting), "approvals": asked})
            )

    def _end_step(self, out: list[Part], seq: int) -> None:
        if self._step is not None:
            self._close_live(self._step, out, seq)
            out.append(Part("step_end", seq, {"generation_id": self._step}))
            self._step = None


def _usage(u: Usage) -> dict[str, int]:
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
    }


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


def _session_fact(r: Any) -> tuple[str, dict[str, Any]] | None:
    if isinstance(r, CancelRequested):
        return "cancel_requested", {"run_id": r.run_id, "compensable": list(r.compensable)}
    if isinstance(r, GoalRevised):
        return "goal_revised", {"goal_rev": r.goal_rev, "text": r.text}
    if isinstance(r, SessionPaused):
        return "paused", {}
    if isinstance(r, SessionResumed):
        return "resumed", {}
    if isinstance(r, SessionParked):
        return "parked", {"reason": r.reason}
    if isinstance(r, CompensationRequested):
        return "compensation_requested", {
            "call_id": r.call_id,
            "compensation_id": r.compensation_id,
        }
    if isinstance(r, CompensationFinished):
        return "compensation_finished", {"compensation_id": r.compensation_id}
    return None
