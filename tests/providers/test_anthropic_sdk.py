"""AnthropicProvider.complete through the real SDK against the fake Messages API server.

These tests cover one model call at a time: what the SDK sends, how the streamed
reply is folded and published, and how every failure is classified.
"""

from __future__ import annotations

import email.utils
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio

from perdure.providers._sdk import SSEParser
from perdure.providers.anthropic import (
    AnthropicProvider,
    MissingCredentials,
    classify_error,
    provider_from_env,
    retry_after,
)
from perdure.providers.base import (
    Message,
    ModelRequest,
    ProviderError,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import ToolCall, Usage
from tests.fake_anthropic import (
    Disconnect,
    FakeAnthropic,
    FakeUsage,
    HttpError,
    Reply,
    Text,
    ToolUse,
    sent_messages,
)
from tests.providers.conftest import sdk_client

ROOT = Path(__file__).resolve().parents[2]

Events = list[tuple[str, dict[str, Any]]]


def hello(system: str | None = "Be brief.", tools: tuple[ToolDefinition, ...] = ()) -> ModelRequest:
    return ModelRequest(
        system=system, messages=(Message("user", (TextBlock("hello"),)),), tools=tools
    )


async def call(provider: AnthropicProvider, request: ModelRequest | None = None) -> Any:
    events: Events = []
    reply = await provider.complete(request or hello(), lambda k, d: events.append((k, d)))
    return reply, events


async def failure(provider: AnthropicProvider) -> tuple[ProviderError, Events]:
    events: Events = []
    with pytest.raises(ProviderError) as info:
        await provider.complete(hello(), lambda k, d: events.append((k, d)))
    return info.value, events


def api_key(headers: dict[str, str]) -> str:
    """The key the SDK sent (this SDK version sends it as a bearer token)."""
    return headers.get("x-api-key") or headers["authorization"].removeprefix("Bearer ")


def texts(events: Events) -> str:
    return "".join(d["text"] for k, d in events if k == "text_delta")


# -- replies --------------------------------------------------------------------------------


async def test_text_reply_is_streamed_and_returned_whole(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    usage = FakeUsage(
        input_tokens=12, output_tokens=7, cache_creation_input_tokens=3, cache_read_input_tokens=4
    )
    fake.script(Reply(content=[Text("Hello, durable world!")], usage=usage, chunk=5))
    reply, events = await call(provider)
    assert reply.text == "Hello, durable world!"
    assert reply.tool_calls == ()
    assert reply.stop_reason == "end_turn"
    assert reply.usage == Usage(
        input_tokens=12, output_tokens=7, cache_creation_input_tokens=3, cache_read_input_tokens=4
    )
    deltas = [d["text"] for k, d in events if k == "text_delta"]
    assert len(deltas) == 5
    assert "".join(deltas) == reply.text
    (sent,) = fake.requests
    assert sent.path == "/v1/messages"
    assert api_key(sent.headers) == "sk-ant-test"
    assert sent.body["stream"] is True
    assert sent.body["model"] == "claude-test"
    assert sent.body["max_tokens"] == 1024
    assert sent_messages(sent.body) == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    ]


async def test_parallel_tool_use_reply(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    fake.script(
        Reply(
            content=[
                Text("Let me look at both."),
                ToolUse("toolu_a", "read_file", {"path": "a.txt"}),
                ToolUse("toolu_b", "read_file", {"path": "b.txt", "lines": [1, 2]}),
            ],
            chunk=4,
        )
    )
    reply, events = await call(provider)
    assert reply.stop_reason == "tool_use"
    assert reply.text == "Let me look at both."
    assert reply.tool_calls == (
        ToolCall(call_id="toolu_a", name="read_file", input={"path": "a.txt"}),
        ToolCall(call_id="toolu_b", name="read_file", input={"path": "b.txt", "lines": [1, 2]}),
    )
    starts = [d for k, d in events if k == "tool_use_start"]
    assert starts == [
        {"index": 1, "id": "toolu_a", "name": "read_file"},
        {"index": 2, "id": "toolu_b", "name": "read_file"},
    ]
    for index, call_ in ((1, reply.tool_calls[0]), (2, reply.tool_calls[1])):
        pieces = [
            d["partial_json"] for k, d in events if k == "tool_input_delta" and d["index"] == index
        ]
        assert len(pieces) > 1
        assert json.loads("".join(pieces)) == call_.input


async def test_tool_without_arguments(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    fake.script(Reply(content=[ToolUse("toolu_1", "now", raw_json="")]))
    reply, _ = await call(provider)
    assert reply.tool_calls == (ToolCall(call_id="toolu_1", name="now", input={}),)


@pytest.mark.parametrize(
    "stop_reason", ["end_turn", "max_tokens", "pause_turn", "refusal", "stop_sequence"]
)
async def test_stop_reasons_are_returned(
    fake: FakeAnthropic, provider: AnthropicProvider, stop_reason: str
) -> None:
    fake.script(Reply(content=[Text("text")], stop_reason=stop_reason))
    reply, _ = await call(provider)
    assert reply.stop_reason == stop_reason


async def test_tool_call_cut_by_max_tokens_is_dropped(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(
        Reply(
            content=[
                Text("Writing the file"),
                ToolUse("toolu_1", "write", raw_json='{"path": "/tm'),
            ],
            stop_reason="max_tokens",
        )
    )
    reply, _ = await call(provider)
    assert reply.stop_reason == "max_tokens"
    assert reply.text == "Writing the file"
    assert reply.tool_calls == ()


async def test_unreadable_tool_input_is_a_retryable_error(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(Reply(content=[ToolUse("toolu_1", "write", raw_json='{"path": ')]))
    err, _ = await failure(provider)
    assert err.retryable
    assert "toolu_1" in err.message


# -- what the SDK sends ---------------------------------------------------------------------


def conversation() -> ModelRequest:
    return ModelRequest(
        system="You are careful.",
        messages=(
            Message("user", (TextBlock("Tidy up."),)),
            Message(
                "assistant",
                (
                    TextBlock("Two things first."),
                    ToolUseBlock("toolu_1", "ls", {"dir": "."}),
                    ToolUseBlock("toolu_2", "rm", {"path": "x"}),
                ),
            ),
            Message(
                "user",
                (
                    ToolResultBlock("toolu_1", "a.txt\nb.txt"),
                    ToolResultBlock("toolu_2", "permission denied", is_error=True),
                    TextBlock("[The user revised the request.]"),
                ),
            ),
            Message("assistant", (TextBlock("Searching the web...  \n"),)),
        ),
        tools=(
            ToolDefinition("ls", "List a directory.", {"type": "object"}),
            ToolDefinition("rm", "Remove a file.", {"type": "object", "required": ["path"]}),
        ),
    )


async def test_request_mapping_with_cache_breakpoints(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(Reply(content=[Text("ok")]))
    await call(provider, conversation())
    body = fake.requests[0].body
    assert body["system"] == [
        {"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"] == [
        {"name": "ls", "description": "List a directory.", "input_schema": {"type": "object"}},
        {
            "name": "rm",
            "description": "Remove a file.",
            "input_schema": {"type": "object", "required": ["path"]},
            "cache_control": {"type": "ephemeral"},
        },
    ]
    assert sent_messages(body) == [
        {"role": "user", "content": [{"type": "text", "text": "Tidy up."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Two things first."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": "."}},
                {"type": "tool_use", "id": "toolu_2", "name": "rm", "input": {"path": "x"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.txt"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "permission denied",
                    "is_error": True,
                },
                {"type": "text", "text": "[The user revised the request.]"},
            ],
        },
        # a conversation ending with the assistant (pause_turn) must not end in whitespace
        {"role": "assistant", "content": [{"type": "text", "text": "Searching the web..."}]},
    ]
    # The third breakpoint sits on the newest block: the conversation prefix is cached.
    marked = [
        (i, j)
        for i, m in enumerate(body["messages"])
        for j, block in enumerate(m["content"])
        if "cache_control" in block
    ]
    assert marked == [(3, 0)]


async def test_tool_results_go_first_and_empty_text_is_dropped(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(Reply(content=[Text("ok")]))
    request = ModelRequest(
        system=None,
        messages=(
            Message("user", (TextBlock("go"),)),
            Message("assistant", (TextBlock(""), ToolUseBlock("toolu_1", "ls", {}))),
            Message("user", (TextBlock("note"), ToolResultBlock("toolu_1", "done"))),
        ),
    )
    await call(provider, request)
    body = fake.requests[0].body
    assert "system" not in body
    assert "tools" not in body
    assert sent_messages(body)[1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}
    ]
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "text"]


async def test_cache_off_and_request_options(fake: FakeAnthropic) -> None:
    fake.script(Reply(content=[Text("ok")]))
    async with sdk_client(fake.url) as client:
        provider = AnthropicProvider(
            model="claude-x", max_tokens=99, client=client, cache=False, temperature=0.25
        )
        await call(provider, conversation())
    body = fake.requests[0].body
    assert body["system"] == "You are careful."
    assert body["temperature"] == 0.25
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 99
    assert "cache_control" not in repr(body)


async def test_sdk_retries_are_switched_off_on_a_given_client(fake: FakeAnthropic) -> None:
    fake.script(
        HttpError(status=529, type="overloaded_error", message="Overloaded"),
        Reply(content=[Text("would be a hidden retry")]),
    )
    async with anthropic.AsyncAnthropic(api_key="k", base_url=fake.url, max_retries=5) as client:
        provider = AnthropicProvider(model="claude-test", client=client)
        assert provider.client.max_retries == 0
        err, _ = await failure(provider)
    assert err.retryable
    assert len(fake.requests) == 1  # the runtime decides about retrying, not the SDK


def test_reserved_request_options_are_refused() -> None:
    with pytest.raises(TypeError, match="messages"):
        AnthropicProvider(model="m", client=None, messages=[])


# -- failures -------------------------------------------------------------------------------

HTTP_CASES = [
    (400, "invalid_request_error", False),
    (401, "authentication_error", False),
    (402, "billing_error", False),
    (403, "permission_error", False),
    (404, "not_found_error", False),
    (413, "request_too_large", False),
    (422, "invalid_request_error", False),
    (408, "timeout_error", True),
    (409, "api_error", True),
    (429, "rate_limit_error", True),
    (500, "api_error", True),
    (502, "api_error", True),
    (503, "api_error", True),
    (504, "timeout_error", True),
    (529, "overloaded_error", True),
]


@pytest.mark.parametrize(("status", "error_type", "retryable"), HTTP_CASES)
async def test_http_errors_are_classified(
    fake: FakeAnthropic, provider: AnthropicProvider, status: int, error_type: str, retryable: bool
) -> None:
    fake.script(HttpError(status=status, type=error_type, message=f"server says {status}"))
    err, events = await failure(provider)
    assert err.retryable is retryable
    assert err.status == status
    assert f"server says {status}" in err.message
    assert error_type in err.message
    assert "req_fake_0001" in err.message  # the request id, for a support ticket
    assert err.usage == Usage()
    assert events == []


async def test_spend_limit_429_is_not_retried(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(
        HttpError(
            status=429,
            type="rate_limit_error",
            message="You have reached your spend limit.",
            error_code="enforced_spend_limit_reached",
            headers={"retry-after": "60"},
        )
    )
    err, _ = await failure(provider)
    assert not err.retryable
    assert err.retry_after is None
    assert "spend limit" in err.message


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (429, {"retry-after": "7"}, 7.0),
        (429, {"retry-after": "0.25"}, 0.25),
        (429, {"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        (529, {"retry-after": "3"}, 3.0),
        (500, {}, None),
        (429, {"retry-after": "soon"}, None),
    ],
)
async def test_retry_after_is_read_from_headers(
    fake: FakeAnthropic,
    provider: AnthropicProvider,
    status: int,
    headers: dict[str, str],
    expected: float | None,
) -> None:
    fake.script(
        HttpError(status=status, type="rate_limit_error", message="slow down", headers=headers)
    )
    err, _ = await failure(provider)
    assert err.retryable
    assert err.retry_after == expected


def test_retry_after_http_date() -> None:
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    value = retry_after({"Retry-After": date}, now=now)
    assert value is not None
    assert 28 <= value <= 31
    assert retry_after({"retry-after": email.utils.formatdate(now - 30, usegmt=True)}, now=now) == 0
    assert retry_after({"retry-after": "-1"}) is None


@pytest.mark.parametrize("mode", ["abort", "eof"])
async def test_stream_cut_midway_is_retryable_and_keeps_usage(
    fake: FakeAnthropic, provider: AnthropicProvider, mode: str
) -> None:
    usage = FakeUsage(input_tokens=40, cache_read_input_tokens=30, output_tokens=99)
    fake.script(
        Reply(
            content=[Text("This answer will never be finished.")],
            usage=usage,
            chunk=4,
            cut_after=6,
            cut_mode=mode,  # type: ignore[arg-type]
        )
    )
    err, events = await failure(provider)
    assert err.retryable
    assert err.usage == Usage(input_tokens=40, output_tokens=1, cache_read_input_tokens=30)
    assert texts(events) == "This answer "  # what streamed before the cut (3 deltas)


async def test_connection_cut_before_any_event(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(Reply(content=[Text("never")], cut_after=0, cut_mode="eof"))
    err, _ = await failure(provider)
    assert err.retryable
    assert "before message_start" in err.message
    assert err.usage == Usage()


async def test_sse_error_event_midway(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    fake.script(Reply(content=[Text("partial answer here")], error_after=4))
    err, events = await failure(provider)
    assert err.retryable
    assert err.status == 529
    assert "overloaded_error" in err.message
    assert "Overloaded" in err.message
    assert err.usage.input_tokens == 10
    assert texts(events) == "partial "


async def test_sse_invalid_request_error_midway_is_fatal(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(
        Reply(
            content=[Text("x")],
            error_after=1,
            error_type="invalid_request_error",
            error_message="prompt is too long",
        )
    )
    err, _ = await failure(provider)
    assert not err.retryable
    assert "prompt is too long" in err.message


async def test_disconnect_without_response(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(Disconnect())
    err, _ = await failure(provider)
    assert err.retryable
    assert "cannot reach the Anthropic API" in err.message


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with sdk_client(f"http://127.0.0.1:{port}") as client:
        provider = AnthropicProvider(model="claude-test", client=client)
        with pytest.raises(ProviderError) as info:
            await provider.complete(hello(), lambda k, d: None)
    assert info.value.retryable
    assert "cannot reach" in info.value.message


async def test_timeout_is_retryable(fake: FakeAnthropic) -> None:
    fake.script(Reply(content=[Text("late")], delay=1.0))
    async with sdk_client(fake.url, timeout=0.2) as client:
        provider = AnthropicProvider(model="claude-test", client=client)
        with pytest.raises(ProviderError) as info:
            await provider.complete(hello(), lambda k, d: None)
    assert info.value.retryable
    assert "timed out" in info.value.message


async def test_cancellation_stops_a_slow_stream_promptly(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.script(
        Reply(content=[Text("a slow answer that takes a long time")], chunk=2, event_delay=0.1),
        Reply(content=[Text("next")]),
    )
    events: Events = []
    started = trio.current_time()
    with trio.move_on_after(0.45) as scope:
        await provider.complete(hello(), lambda k, d: events.append((k, d)))
    assert scope.cancelled_caught
    assert trio.current_time() - started < 1.0
    assert 0 < len(texts(events)) < len("a slow answer that takes a long time")
    reply, _ = await call(provider)  # the client is still usable
    assert reply.text == "next"


def test_generic_exceptions_are_classified() -> None:
    assert classify_error(OSError("network is down")).retryable
    assert not classify_error(ValueError("bug")).retryable
    original = ProviderError("as is", retryable=True, status=529)
    assert classify_error(original) is original


# -- the fake server speaks plain JSON too --------------------------------------------------


async def test_fake_server_answers_non_streaming_requests(fake: FakeAnthropic) -> None:
    fake.script(Reply(content=[Text("hi"), ToolUse("toolu_1", "f", {"a": 1})]))
    async with sdk_client(fake.url) as client:
        message = await client.messages.create(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.usage.input_tokens == 10


async def test_fake_server_without_script_says_so(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    err, _ = await failure(provider)
    assert not err.retryable
    assert "no scripted response" in err.message


# -- the SSE parser -------------------------------------------------------------------------


def test_sse_parser_handles_split_lines_comments_and_crlf() -> None:
    stream = (
        b": a comment\r\n"
        b'event: message_start\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
        b"event: ping\ndata: {}\n\n"
        b"data: no name\r\r"
    )
    parser = SSEParser()
    out: list[tuple[str, str]] = []
    for i in range(len(stream)):  # one byte at a time: every split point
        out += parser.feed(stream[i : i + 1])
    out += parser.end()
    assert out == [
        ("message_start", '{"a":\n1}'),
        ("ping", "{}"),
        ("message", "no name"),
    ]


# -- configuration --------------------------------------------------------------------------


def test_provider_from_env_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(MissingCredentials) as info:
        provider_from_env("claude-test")
    assert "ANTHROPIC_API_KEY" in str(info.value)
    assert "--provider scripted:FILE" in str(info.value)


async def test_provider_from_env_reads_key_and_base_url(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    fake.script(Reply(content=[Text("env ok")]))
    async with provider_from_env("claude-env") as provider:
        reply, _ = await call(provider)
        assert provider.client.max_retries == 0
    assert reply.text == "env ok"
    assert api_key(fake.requests[0].headers) == "sk-ant-from-env"
    assert fake.requests[0].body["model"] == "claude-env"


def test_import_perdure_does_not_load_the_sdk() -> None:
    code = "import sys, perdure, perdure.providers\nassert 'anthropic' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_anthropic_provider_is_exported_lazily() -> None:
    import perdure.providers

    assert perdure.providers.AnthropicProvider is AnthropicProvider
    assert perdure.providers.provider_from_env is provider_from_env
    with pytest.raises(AttributeError):
        _ = perdure.providers.NoSuchProvider  # type: ignore[attr-defined]
