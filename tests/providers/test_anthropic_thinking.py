"""Extended thinking through the real SDK against the fake Messages API.

With ``thinking`` on, the API answers a tool-use turn with thinking blocks (text
plus a ``signature``) and sometimes ``redacted_thinking`` blocks, and refuses the
continuation of the loop (400) unless the assistant message hands them back
first, unchanged. The fake server refuses the same way, and refuses a signature
or redacted data it did not issue, so every test here fails if a block is lost,
moved or altered on its way through the provider, the log and the model's view.
The SIGKILL variant (a block that must survive a killed process) is in
``test_anthropic_kill.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure.providers.anthropic import AnthropicProvider, _ReplyBuilder
from perdure.providers.base import (
    Message,
    ModelRequest,
    ProviderError,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import GenerationCompleted, ToolCall
from tests.fake_anthropic import (
    FakeAnthropic,
    RedactedThinking,
    Reply,
    Text,
    Thinking,
    ToolUse,
    sent_messages,
    sign,
    stream_events,
)
from tests.providers.conftest import sdk_client
from tests.providers.test_anthropic_runtime import ask, of, records, runtime

THINKING = {"type": "enabled", "budget_tokens": 1024}
PLAN = "The user wants 2 + 3. I have an add tool; I should call it rather than guess."
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDLhQHwIyO8Wf9GpQ5SIwqe5Rb2HQ"
ADD = ToolDefinition("add", "Add two integers.", {"type": "object", "properties": {}})

Events = list[tuple[str, dict[str, Any]]]


@pytest.fixture
async def thinker(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    """A provider with extended thinking on, as a user would configure it."""
    async with sdk_client(fake.url) as client:
        yield AnthropicProvider(
            model="claude-test", max_tokens=2048, client=client, thinking=THINKING
        )


def user(text: str) -> Message:
    return Message("user", (TextBlock(text),))


async def complete(provider: AnthropicProvider, *messages: Message) -> tuple[Any, Events]:
    events: Events = []
    request = ModelRequest(system=None, messages=messages or (user("2 + 3?"),), tools=(ADD,))
    reply = await provider.complete(request, lambda k, d: events.append((k, d)))
    return reply, events


# -- one model call -------------------------------------------------------------------------


async def test_thinking_is_streamed_and_kept_with_its_signature(
    fake: FakeAnthropic, thinker: AnthropicProvider
) -> None:
    fake.script(
        Reply(
            content=[Thinking(PLAN), Text("Adding."), ToolUse("toolu_1", "add", {"a": 2, "b": 3})],
            chunk=9,
        )
    )
    reply, events = await complete(thinker)
    assert reply.thinking == (ThinkingBlock(PLAN, sign(PLAN)),)
    assert reply.text == "Adding."
    assert reply.tool_calls == (ToolCall(call_id="toolu_1", name="add", input={"a": 2, "b": 3}),)
    # the reasoning is published as it arrives, like text; the signature is not
    pieces = [d for k, d in events if k == "thinking_delta"]
    assert len(pieces) > 1
    assert {d["index"] for d in pieces} == {0}
    assert "".join(d["thinking"] for d in pieces) == PLAN
    assert sign(PLAN) not in json.dumps(events)
    (sent,) = fake.requests
    assert sent.body["thinking"] == THINKING


async def test_redacted_thinking_is_kept_whole_and_in_order(
    fake: FakeAnthropic, thinker: AnthropicProvider
) -> None:
    fake.script(Reply(content=[RedactedThinking(REDACTED), Thinking(PLAN), Text("Hm.")]))
    reply, _ = await complete(thinker)
    assert reply.thinking == (RedactedThinkingBlock(REDACTED), ThinkingBlock(PLAN, sign(PLAN)))
    assert reply.text == "Hm."


def fold(reply: Reply, *, drop: str = "") -> _ReplyBuilder:
    """The provider's stream folding, fed the fake's events minus deltas of type ``drop``."""
    builder = _ReplyBuilder(lambda k, d: None)
    for name, data in stream_events(reply, "msg_1", "claude-test"):
        if data.get("delta", {}).get("type") != drop:
            builder.on_event(name, json.dumps(data))
    return builder


def test_a_redacted_thinking_block_needs_its_data() -> None:
    with pytest.raises(Exception, match="without data"):
        fold(Reply(content=[RedactedThinking(""), Text("ok")])).reply()


def test_a_thinking_block_needs_its_signature() -> None:
    """The signature_delta completes the block: without it the reply is not complete."""
    complete_stream = fold(Reply(content=[Thinking(PLAN), Text("ok")]))
    assert complete_stream.reply().thinking == (ThinkingBlock(PLAN, sign(PLAN)),)
    with pytest.raises(Exception, match="without a signature"):
        fold(Reply(content=[Thinking(PLAN), Text("ok")]), drop="signature_delta").reply()
    # cut off by max_tokens before its signature came: dropped, like a cut tool call
    cut = fold(
        Reply(content=[Thinking(PLAN)], stop_reason="max_tokens"), drop="signature_delta"
    ).reply()
    assert cut.thinking == ()
    assert cut.stop_reason == "max_tokens"


async def test_thinking_blocks_go_back_first_and_verbatim(
    fake: FakeAnthropic, thinker: AnthropicProvider
) -> None:
    fake.script(
        Reply(content=[RedactedThinking(REDACTED), ToolUse("toolu_0", "add", {"a": 0, "b": 0})]),
        Reply(content=[Text("Done.")]),
    )
    first, _ = await complete(thinker)  # the server has now issued REDACTED
    assistant = Message(
        "assistant",
        (
            *first.thinking,
            ThinkingBlock(PLAN, sign(PLAN)),
            TextBlock("Adding."),
            ToolUseBlock("toolu_1", "add", {"a": 2, "b": 3}),
        ),
    )
    results = Message("user", (ToolResultBlock("toolu_1", "5"),))
    reply, _ = await complete(thinker, user("2 + 3?"), assistant, results)
    assert reply.text == "Done."
    sent = fake.requests[1].body
    assert sent_messages(sent)[1] == {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": REDACTED},
            {"type": "thinking", "thinking": PLAN, "signature": sign(PLAN)},
            {"type": "text", "text": "Adding."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
        ],
    }


async def test_no_cache_breakpoint_on_a_thinking_block(thinker: AnthropicProvider) -> None:
    """The API refuses cache_control on thinking blocks; the breakpoint moves back."""
    request = ModelRequest(
        system=None,
        messages=(
            user("2 + 3?"),
            Message("assistant", (ThinkingBlock(PLAN, "sig"), TextBlock("Adding.  "))),
        ),
    )
    last = thinker.params(request)["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["thinking", "text"]
    assert "cache_control" not in last[0]
    assert last[1]["cache_control"] == {"type": "ephemeral"}
    # only reasoning left after the trailing whitespace is stripped: no breakpoint at all
    request = ModelRequest(
        system=None,
        messages=(
            user("2 + 3?"),
            Message("assistant", (ThinkingBlock(PLAN, "sig"), TextBlock(" "))),
        ),
    )
    (only,) = thinker.params(request)["messages"][-1]["content"]
    assert only == {"type": "thinking", "thinking": PLAN, "signature": "sig"}


# -- the fake refuses what the real API refuses (so the tests below can fail) ----------------


@pytest.mark.parametrize(
    ("assistant", "message"),
    [
        pytest.param(
            (TextBlock("Adding."), ToolUseBlock("toolu_1", "add", {"a": 2, "b": 3})),
            "Expected `thinking` or `redacted_thinking`, but found `text`",
            id="thinking-left-out",
        ),
        pytest.param(
            (
                ToolUseBlock("toolu_1", "add", {"a": 2, "b": 3}),
                ThinkingBlock(PLAN, sign(PLAN)),
            ),
            "Expected `thinking` or `redacted_thinking`, but found `tool_use`",
            id="thinking-after-tool-use",
        ),
        pytest.param(
            (ThinkingBlock(PLAN + " ", sign(PLAN)), ToolUseBlock("toolu_1", "add", {})),
            "Invalid `signature` in `thinking` block",
            id="thinking-edited",
        ),
        pytest.param(
            (RedactedThinkingBlock("forged"), ToolUseBlock("toolu_1", "add", {})),
            "Invalid `data` in `redacted_thinking` block",
            id="redacted-forged",
        ),
    ],
)
async def test_fake_refuses_a_continuation_without_its_reasoning_intact(
    fake: FakeAnthropic, thinker: AnthropicProvider, assistant: tuple[Any, ...], message: str
) -> None:
    fake.script(Reply(content=[Text("never sent")]))
    results = Message("user", (ToolResultBlock("toolu_1", "5"),))
    with pytest.raises(ProviderError) as info:
        await complete(thinker, user("2 + 3?"), Message("assistant", assistant), results)
    assert info.value.status == 400
    assert not info.value.retryable
    assert message in info.value.message
    assert fake.pending == 1  # refused before an answer was chosen


# -- through the runtime and its log ----------------------------------------------------------


async def test_tool_use_turn_with_thinking_round_trips(
    fake: FakeAnthropic, thinker: AnthropicProvider, log_dir: Path
) -> None:
    second_plan = "add returned 5, so the answer is 5."
    fake.script(
        Reply(
            content=[Thinking(PLAN), Text("Adding."), ToolUse("toolu_01", "add", {"a": 2, "b": 3})]
        ),
        Reply(content=[Thinking(second_plan), Text("2 + 3 = 5.")]),
    )
    async with runtime(log_dir, thinker) as rt:
        sid, outcome = await ask(rt, "What is 2 + 3?")
        committed = await records(rt, sid)
    assert (outcome.status, outcome.final_text) == ("completed", "2 + 3 = 5."), outcome.reason
    replies = of(GenerationCompleted, committed)
    assert [r.thinking for r in replies] == [
        [ThinkingBlock(PLAN, sign(PLAN))],
        [ThinkingBlock(second_plan, sign(second_plan))],
    ]
    assert len(fake.requests) == 2
    assert sent_messages(fake.requests[1].body) == [
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": PLAN, "signature": sign(PLAN)},
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "5"}],
        },
    ]


async def test_redacted_thinking_round_trips(
    fake: FakeAnthropic, thinker: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(
            content=[
                RedactedThinking(REDACTED),
                Thinking(PLAN),
                ToolUse("toolu_01", "add", {"a": 2, "b": 3}),
            ]
        ),
        Reply(content=[Text("5.")]),
    )
    async with runtime(log_dir, thinker) as rt:
        sid, outcome = await ask(rt, "What is 2 + 3?")
        committed = await records(rt, sid)
    assert outcome.status == "completed", outcome.reason
    assert of(GenerationCompleted, committed)[0].thinking == [
        RedactedThinkingBlock(REDACTED),
        ThinkingBlock(PLAN, sign(PLAN)),
    ]
    assistant = sent_messages(fake.requests[1].body)[1]
    assert assistant["content"][:2] == [
        {"type": "redacted_thinking", "data": REDACTED},
        {"type": "thinking", "thinking": PLAN, "signature": sign(PLAN)},
    ]
    assert assistant["content"][2]["type"] == "tool_use"


async def test_thinking_survives_reopening_the_log(
    fake: FakeAnthropic, thinker: AnthropicProvider, log_dir: Path
) -> None:
    """The runtime stops while the continuation is in flight; the next one rebuilds the
    request from the log alone, reasoning included."""
    fake.script(
        Reply(content=[Thinking(PLAN), ToolUse("toolu_01", "add", {"a": 2, "b": 3})]),
        Reply(content=[Text("never seen")], delay=30.0),  # still in flight at shutdown
    )
    async with runtime(log_dir, thinker) as rt:
        sid = await rt.create_session()
        await rt.submit(sid, "What is 2 + 3?")
        with trio.fail_after(30):
            while len(fake.requests) < 2:  # noqa: ASYNC110 (another thread's server)
                await trio.sleep(0.01)
    before = fake.requests[1].body
    fake.clear()
    fake.script(Reply(content=[Text("2 + 3 = 5.")]))
    async with runtime(log_dir, thinker) as rt:
        assert rt.recovered_sessions == [sid]
        outcome = await rt.wait_idle(sid)
    assert outcome is not None
    assert (outcome.status, outcome.final_text) == ("completed", "2 + 3 = 5."), outcome.reason
    after = fake.requests[2].body
    assert sent_messages(after) == sent_messages(before)
    assert sent_messages(after)[1]["content"][0] == {
        "type": "thinking",
        "thinking": PLAN,
        "signature": sign(PLAN),
    }
