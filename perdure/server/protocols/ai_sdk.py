"""The Vercel AI SDK's UI message stream (protocol v1), from a session's parts.

A response is Server-Sent Events whose ``data`` is one JSON chunk each, with the
``x-vercel-ai-ui-message-stream: v1`` header, ending with ``data: [DONE]``. One
perdure submission (a user input and every run that answered it) is one UI
message: ``start`` (its ``messageId`` is stable, so a replayed stream replaces the
message rather than adding one), a ``start-step``/``finish-step`` pair per model
turn, ``text-*`` and ``reasoning-*`` parts, ``tool-input-start``/``-delta``/
``-available``, ``tool-approval-request``, ``tool-output-available``/``-error``/
``-denied``, ``finish`` or ``error``. perdure's own facts go out as
``data-perdure-<name>`` parts (a restart, a recovery decision, an unknown outcome,
usage per turn); progress is ``transient``.
"""

from __future__ import annotations

from typing import Any, Final

from perdure.server.protocols.parts import Part

HEADERS: Final = {"x-vercel-ai-ui-message-stream": "v1"}
DONE: Final = b"data: [DONE]\n\n"

_FINISH_REASON: Final = {
    "completed": "stop",
    "cancelled": "other",
    "stopped": "length",  # a budget was spent
    "failed": "error",
}


def message_id(submission_id: str) -> str:
    """The UI message id of a submission's reply."""
    return f"msg_{submission_id}"


class AiSdkEncoder:
    """Parts to UI message chunks; ``start`` is sent once per response."""

    def __init__(self) -> None:
        self.started = False
        self.step_open = False

    def start(self, submission_id: str) -> list[dict[str, Any]]:
        """The ``start`` chunk a response opens with (also a continuation's)."""
        self.started = True
        return [{"type": "start", "messageId": message_id(submission_id)}]

    def encode(self, part: Part) -> list[dict[str, Any]]:
        d = part.data
        k = part.kind
        if k == "run_start":
            if self.started:
                return [_data("run", {"run_id": d["run_id"]})]
            return self.start(d["submission_id"])
        if k == "run_end":
            out = self._finish_step()
            metadata = {"status": d["status"], "usage": d["usage"], "run_id": d["run_id"]}
            if d["status"] == "failed":
                out.append({"type": "error", "errorText": d["reason"] or "the run failed"})
            out.append(
                {
                    "type": "finish",
                    "finishReason": _FINISH_REASON.get(d["status"], "other"),
                    "messageMetadata": metadata,
                }
            )
            self.started = False
            return out
        if k == "step_start":
            out = self._finish_step()
            self.step_open = True
            return [*out, {"type": "start-step"}]
        if k == "step_end":
            return self._finish_step()
        if k in ("text_start", "text_end", "reasoning_start", "reasoning_end"):
            return [{"type": k.replace("_", "-"), "id": d["id"]}]
        if k in ("text_delta", "reasoning_delta"):
            return [{"type": k.replace("_", "-"), "id": d["id"], "delta": d["delta"]}]
        if k == "tool_start":
            return [
                {
                    "type": "tool-input-start",
                    "toolCallId": d["call_id"],
                    "toolName": d["name"],
                    "dynamic": True,
                }
            ]
        if k == "tool_args":
            return [
                {
                    "type": "tool-input-delta",
                    "toolCallId": d["call_id"],
                    "inputTextDelta": d["delta"],
                }
            ]
        if k == "tool_input":
            return [
                {
                    "type": "tool-input-available",
                    "toolCallId": d["call_id"],
                    "toolName": d["name"],
                    "input": d["input"],
                    "dynamic": True,
                }
            ]
        if k == "approval":
            return [
                {
                    "type": "tool-approval-request",
                    "approvalId": d["approval_id"],
                    "toolCallId": d["call_id"],
                }
            ]
        if k == "tool_output":
            if d["is_error"]:
                return [
                    {
                        "type": "tool-output-error",
                        "toolCallId": d["call_id"],
                        "errorText": d["output"],
                        "dynamic": True,
                    }
                ]
            return [
                {
                    "type": "tool-output-available",
                    "toolCallId": d["call_id"],
                    "output": d["output"],
                    "dynamic": True,
                }
            ]
        if k == "tool_denied":
            return [{"type": "tool-output-denied", "toolCallId": d["call_id"]}]
        if k == "blocked":
            return [_data("awaiting_approval", {"call_ids": d["call_ids"]})]
        if k == "fact":
            chunk = _data(d["name"], d["value"])
            if d.get("transient"):
                chunk["transient"] = True
            return [chunk]
        return []

    def pause(self) -> list[dict[str, Any]]:
        """End a response that waits for approvals: the client answers them and posts
        again, and the next response continues the same message."""
        out = self._finish_step()
        out.append({"type": "finish", "finishReason": "tool-calls"})
        return out

    def _finish_step(self) -> list[dict[str, Any]]:
        if not self.step_open:
            return []
        self.step_open = False
        return [{"type": "finish-step"}]


def _data(name: str, value: Any) -> dict[str, Any]:
    return {"type": f"data-perdure-{name.replace('_', '-')}", "data": value}
