"""A deterministic provider for tests and the demo: replies from a script.

The reply is chosen by the number of assistant turns already in the conversation
it is sent, so a restarted process that re-sends a model request receives the same
reply, and tool-use ids are derived from that turn number. A reply may fail its
first attempts (retryable errors) or fail outright, to exercise retries and
fatal errors deterministically across restarts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import cattrs
import trio
from attrs import field, frozen

from perdure.providers.base import Emit, ModelReply, ModelRequest, ProviderError, ThinkingBlock
from perdure.storage.records import ToolCall, Usage


@frozen
class ToolUse:
    name: str
    input: dict[str, Any] = field(factory=dict)


@frozen(kw_only=True)
class Reply:
    text: str = ""
    thinking: str = ""  # reasoning streamed (thinking_delta) before the text, then kept
    tool_uses: list[ToolUse] = field(factory=list)
    stop_reason: str | None = None
    fail_attempts: int = 0  # attempts 1..n raise a retryable error
    retry_after: float | None = None
    error: str | None = None  # a fatal error instead of a reply
    delay: float = 0.0  # seconds before the reply (to test cancellation, pauses)
    usage: Usage = field(factory=lambda: Usage(input_tokens=10, output_tokens=5))


class ScriptError(ValueError):
    pass


_converter = cattrs.Converter(forbid_extra_keys=True)


class ScriptedProvider:
    name = "scripted"

    def __init__(
        self, replies: Sequence[Reply], by_system: Mapping[str, Sequence[Reply]] | None = None
    ) -> None:
        self.replies = list(replies)
        # Scripts for the sessions with these system prompts (e.g. sub-agents).
        self.by_system = {k: list(v) for k, v in (by_system or {}).items()}
        self.calls = 0

    @classmethod
    def from_file(cls, path: str | PathLike[str]) -> ScriptedProvider:
        """Load ``{"replies": [...]}`` (or a bare list) of Reply-shaped objects."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ScriptError(f"cannot read script {path}: {exc}") from None
        by_system: Any = {}
        if isinstance(data, dict):
            by_system = data.get("by_system", {})
            data = data.get("replies")
        if not isinstance(data, list):
            raise ScriptError(f"script {path}: expected a list of replies")
        try:
            return cls(
                _converter.structure(data, list[Reply]),
                _converter.structure(by_system, dict[str, list[Reply]]),
            )
        except Exception as exc:
            detail = "; ".join(cattrs.transform_error(exc))
            raise ScriptError(f"script {path}: {detail}") from None

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        self.calls += 1
        turn = sum(1 for m in request.messages if m.role == "assistant")
        replies = self.by_system.get(request.system or "", self.replies)
        if turn >= len(replies):
            raise ProviderError(
                f"the script has {len(replies)} replies; none for turn {turn + 1}",
                retryable=False,
            )
        reply = replies[turn]
        if reply.delay:
            await trio.sleep(reply.delay)
        if request.attempt <= reply.fail_attempts:
            raise ProviderError(
                f"scripted overload (attempt {request.attempt} of turn {turn + 1})",
                retryable=True,
                retry_after=reply.retry_after,
                status=529,
                usage=Usage(input_tokens=reply.usage.input_tokens),
            )
        if reply.error is not None:
            raise ProviderError(reply.error, retryable=False, status=400)
        for start in range(0, len(reply.thinking), 16):
            emit("thinking_delta", {"index": 0, "thinking": reply.thinking[start : start + 16]})
            await trio.lowlevel.checkpoint()
        for start in range(0, len(reply.text), 16):
            emit("text_delta", {"text": reply.text[start : start + 16]})
            await trio.lowlevel.checkpoint()
        calls = tuple(
            ToolCall(call_id=f"toolu_{turn + 1:03d}_{j + 1}", name=use.name, input=dict(use.input))
            for j, use in enumerate(reply.tool_uses)
        )
        stop = reply.stop_reason or ("tool_use" if calls else "end_turn")
        thinking = (ThinkingBlock(reply.thinking, "scripted"),) if reply.thinking else ()
        return ModelReply(
            text=reply.text,
            tool_calls=calls,
            thinking=thinking,
            stop_reason=stop,
            usage=reply.usage,
            provider=self.name,
            model="scripted",
        )
