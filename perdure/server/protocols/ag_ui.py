"""AG-UI events from a session's parts.

An AG-UI *run* is one perdure submission: ``RUN_STARTED`` (``threadId`` is the
session, ``runId`` the submission's request id, which is the client's ``runId``
when the input came through AG-UI), ``STEP_STARTED``/``STEP_FINISHED`` per model
turn, ``TEXT_MESSAGE_*`` and ``REASONING_*`` (the assistant message of a turn has
the turn's generation id), ``TOOL_CALL_START/ARGS/END`` then ``TOOL_CALL_RESULT``,
and ``RUN_FINISHED`` or ``RUN_ERROR``. A run that waits for approvals finishes with
the ``interrupt`` outcome, one interrupt per call (``reason: "tool_approval"``);
the client answers in the next run's ``resume`` entries. A ``STATE_SNAPSHOT`` at
the start of a response carries what the session is doing, and perdure's facts
are ``CUSTOM`` events named ``perdure.<name>``.
"""

from __future__ import annotations

from typing import Any

from perdure.server.protocols.parts import Part

TOOL_APPROVAL = "tool_approval"


class AgUiEncoder:
    """Parts to AG-UI event objects (camelCase JSON, as on the wire)."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.run_id: str | None = None
        self.step: str | None = None
        self.tool_open: set[str] = set()
        # A turn's text is its assistant message: the message id is the generation id,
        # which the turn's tool calls name as their parent.
        self.text_message: dict[str, str] = {}

    def start(self, run_id: str, snapshot: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """``RUN_STARTED`` (and a state snapshot) that opens a response."""
        self.run_id = run_id
        out: list[dict[str, Any]] = [_ev("RUN_STARTED", threadId=self.thread_id, runId=run_id)]
        if snapshot is not None:
            out.append(_ev("STATE_SNAPSHOT", snapshot=snapshot))
        return out

    def encode(self, part: Part) -> list[dict[str, Any]]:
        d = part.data
        k = part.kind
        if k == "run_start":
            if self.run_id is not None:
                return [_custom("run", {"run_id": d["run_id"]})]
            return self.start(d["request_id"])
        if k == "run_end":
            out = self._finish_step()
            run_id = self.run_id or d["request_id"]
            self.run_id = None
            usage = {
                "inputTokens": d["usage"]["input_tokens"],
                "outputTokens": d["usage"]["output_tokens"],
                "totalTokens": d["usage"]["input_tokens"] + d["usage"]["output_tokens"],
            }
            if d["status"] == "failed":
                out.append(_ev("RUN_ERROR", message=d["reason"] or "the run failed", code="failed"))
                return out
            outcome: dict[str, Any] = {"type": "success"}
            if d["status"] == "cancelled":
                outcome = {"type": "cancelled"}
            result = {"status": d["status"], "final_text": d["final_text"], "reason": d["reason"]}
            out.append(
                _ev(
                    "RUN_FINISHED",
                    threadId=self.thread_id,
                    runId=run_id,
                    result=result,
                    outcome=outcome,
                    usage=[usage],
                )
            )
            return out
        if k == "step_start":
            out = self._finish_step()
            self.step = d["generation_id"]
            out.append(_ev("STEP_STARTED", stepName=self.step))
            return out
        if k == "step_end":
            return self._finish_step()
        if k == "text_start":
            self.text_message[d["id"]] = d["generation_id"]
            return [_ev("TEXT_MESSAGE_START", messageId=d["generation_id"], role="assistant")]
        if k == "text_delta":
            if not d["delta"]:
                return []  # AG-UI forbids an empty delta
            return [
                _ev(
                    "TEXT_MESSAGE_CONTENT",
                    messageId=self.text_message.get(d["id"], d["id"]),
                    delta=d["delta"],
                )
            ]
        if k == "text_end":
            return [_ev("TEXT_MESSAGE_END", messageId=self.text_message.pop(d["id"], d["id"]))]
        if k == "reasoning_start":
            rid = d["id"]
            return [
                _ev("REASONING_START", messageId=rid),
                _ev("REASONING_MESSAGE_START", messageId=rid, role="reasoning"),
            ]
        if k == "reasoning_delta":
            if not d["delta"]:
                return []
            return [_ev("REASONING_MESSAGE_CONTENT", messageId=d["id"], delta=d["delta"])]
        if k == "reasoning_end":
            return [
                _ev("REASONING_MESSAGE_END", messageId=d["id"]),
                _ev("REASONING_END", messageId=d["id"]),
            ]
        if k == "tool_start":
            self.tool_open.add(d["call_id"])
            return [
                _ev(
                    "TOOL_CALL_START",
                    toolCallId=d["call_id"],
                    toolCallName=d["name"],
                    parentMessageId=d["parent"],
                )
            ]
        if k == "tool_args":
            if not d["delta"]:
                return []
            return [_ev("TOOL_CALL_ARGS", toolCallId=d["call_id"], delta=d["delta"])]
        if k == "tool_input":
            if d["call_id"] not in self.tool_open:
                return []
            self.tool_open.discard(d["call_id"])
            return [_ev("TOOL_CALL_END", toolCallId=d["call_id"])]
        if k in ("tool_output", "tool_denied"):
            return [
                _ev(
                    "TOOL_CALL_RESULT",
                    messageId=f"{d['call_id']}.result",
                    toolCallId=d["call_id"],
                    content=d["output"],
                    role="tool",
                )
            ]
        if k == "approval":
            return [
                _custom(
                    "approval_requested",
                    {k2: d[k2] for k2 in ("call_id", "approval_id", "reason", "name")},
                )
            ]
        if k == "blocked":
            return [_custom("awaiting_approval", {"call_ids": d["call_ids"]})]
        if k == "fact":
            return [_custom(d["name"], d["value"])]
        return []

    def interrupt(self, approvals: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``RUN_FINISHED`` with the interrupt outcome: the run waits for these approvals."""
        out = self._finish_step()
        interrupts = [
            {
                "id": a["approval_id"],
                "reason": TOOL_APPROVAL,
                "toolCallId": a["call_id"],
                "message": a["reason"] or f"approve the call to {a['name']}?",
                "responseSchema": {
                    "type": "object",
                    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
                    "required": ["approved"],
                },
            }
            for a in approvals
        ]
        run_id = self.run_id or ""
        self.run_id = None
        out.append(
            _ev(
                "RUN_FINISHED",
                threadId=self.thread_id,
                runId=run_id,
                outcome={"type": "interrupt", "interrupts": interrupts},
            )
        )
        return out

    def reopen(self) -> list[dict[str, Any]]:
        """A continuation run re-opens the step the previous run was interrupted in."""
        return [] if self.step is None else [_ev("STEP_STARTED", stepName=self.step)]

    def _finish_step(self) -> list[dict[str, Any]]:
        if self.step is None:
            return []
        step, self.step = self.step, None
        return [_ev("STEP_FINISHED", stepName=step)]


def _ev(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


def _custom(name: str, value: Any) -> dict[str, Any]:
    return _ev("CUSTOM", name=f"perdure.{name}", value=value)
