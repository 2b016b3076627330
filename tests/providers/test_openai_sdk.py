"""OpenAIProvider.complete through the real ``openai`` SDK against the fake OpenAI server.

One model call at a time, on both APIs (the ``api`` fixture runs a test on Chat
Completions and on the Responses API where both apply): what the SDK sends, how the
streamed reply is folded and published, and how every failure is classified.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from perdure.providers.base import (
    Message,
    ModelRequest,
    ProviderError,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.providers.openai import (
    Api,
    MissingCredentials,
    OpenAIProvider,
    chat_messages,
    classify_error,
    provider_from_env,
)
from perdure.storage.records import ToolCall as RecordedCall
from perdure.storage.records import Usage
from tests.fake_openai import (
    Disconnect,
    FakeOpenAI,
    FakeUsage,
    HttpError,
    Reply,
    Text,
    ToolCall,
    chat_problem,
)
from tests.providers.conftest import openai_client

ROOT = Path(__file__).resolve().parents[2]

Events = list[tuple[str, dict[str, Any]]]

ADD = ToolDefinition("add", "Add two integers.", {"type": "object", "properties": {}})


def hello(system: str | None = "Be brief.", tools: tuple[ToolDefinition, ...] = ()) -> ModelRequest:
    return ModelRequest(
        system=system, messages=(Message("user", (TextBlock("hello"),)),), tools=tools
    )


async def call(provider: OpenAIProvider, request: ModelRequest | None = None) -> Any:
    events: Events = []
    reply = await provider.complete(request or hello(), lambda k, d: events.append((k, d)))
    return reply, events


async def failure(provider: OpenAIProvider) -> tuple[ProviderError, Events]:
    events: Events = []
    with pytest.raises(ProviderError) as info:
        await provider.complete(hello(), lambda k, d: events.append((k, d)))
    return info.value, events


def texts(events: Events) -> str:
    return "".join(d["text"] for k, d in events if k == "text_delta")


# -- replies --------------------------------------------------------------------------------


async def test_text_reply_is_streamed_and_returned_whole(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, api: Api
) -> None:
    usage = FakeUsage(prompt_tokens=12, completion_tokens=7, cached_tokens=4)
    fake_oa.script(Reply(content=[Text("Hello, durable world!")], usage=usage, chunk=5))
    reply, events = await call(oa_provider)
    assert reply.text == "Hello, durable world!"
    assert reply.tool_calls == ()
    assert reply.stop_reason == "end_turn"
    # prompt tokens read from the cache are counted apart, as Anthropic reports them
    assert reply.usage == Usage(input_tokens=8, output_tokens=7, cache_read_input_tokens=4)
    assert (reply.provider, reply.model) == ("openai", "gpt-test")
    prefix = "chatcmpl-fake-" if api == "chat" else "resp_fake_"
    assert reply.response_id == prefix + "0001"
    deltas = [d["text"] for k, d in events if k == "text_delta"]
    assert len(deltas) == 5
    assert "".join(deltas) == reply.text
    (sent,) = fake_oa.requests
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["stream"] is True
    assert sent.body["model"] == "gpt-test"
    if api == "chat":
        assert sent.path == "/v1/chat/completions"
        assert sent.body["stream_options"] == {"include_usage": True}
        assert sent.body["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello"},
        ]
    else:
        assert sent.path == "/v1/responses"
        assert sent.body["instructions"] == "Be brief."
        assert sent.body["input"] == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("interleave", [False, True])
async def test_parallel_tool_calls(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, api: Api, interleave: bool
) -> None:
    fake_oa.script(
        Reply(
            content=[
                Text("Let me add both."),
                ToolCall("call_a", "add", {"a": 1, "b": 2}),
                ToolCall("call_b", "add", {"a": 30, "b": 12, "note": "ünïcode"}),
            ],
            chunk=4,
            interleave=interleave,
        )
    )
    reply, events = await call(oa_provider, hello(tools=(ADD,)))
    assert reply.text == "Let me add both."
    assert reply.tool_calls == (
        RecordedCall(call_id="call_a", name="add", input={"a": 1, "b": 2}),
        RecordedCall(call_id="call_b", name="add", input={"a": 30, "b": 12, "note": "ünïcode"}),
    )
    assert reply.stop_reason == "tool_use"
    starts = [d for k, d in events if k == "tool_use_start"]
    assert [(d["id"], d["name"]) for d in starts] == [("call_a", "add"), ("call_b", "add")]
    for start, call_ in zip(starts, reply.tool_calls, strict=True):
        pieces = [d["partial_json"] for k, d in events if k == "tool_input_delta"]
        mine = [
            d["partial_json"]
            for k, d in events
            if k == "tool_input_delta" and d["index"] == start["index"]
        ]
        assert len(pieces) > len(mine) > 1  # streamed in several pieces, per call
        assert json.loads("".join(mine)) == call_.input
    (sent,) = fake_oa.requests
    tools = sent.body["tools"]
    if api == "chat":
        assert tools == [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": False,  # an open object: not strict
                },
            }
        ]
    else:
        assert tools == [
            {
                "type": "function",
                "name": "add",
                "description": "Add two integers.",
                "parameters": {"type": "object", "properties": {}},
                "strict": False,
            }
        ]


async def test_tool_call_without_arguments(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(Reply(content=[ToolCall("call_1", "now", raw="")]))
    reply, _ = await call(oa_provider)
    assert reply.tool_calls == (RecordedCall(call_id="call_1", name="now", input={}),)


@pytest.mark.parametrize(
    ("finish", "expected"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "refusal")],
)
async def test_chat_finish_reasons_are_mapped(
    fake_oa: FakeOpenAI, finish: str, expected: str
) -> None:
    fake_oa.script(Reply(content=[Text("partial")], finish_reason=finish))
    async with openai_client(fake_oa.url) as client:
        reply, _ = await call(OpenAIProvider(model="gpt-test", client=client))
    assert reply.stop_reason == expected


@pytest.mark.parametrize(
    ("reason", "expected"), [("max_output_tokens", "max_tokens"), ("content_filter", "refusal")]
)
async def test_responses_incomplete_reasons_are_mapped(
    fake_oa: FakeOpenAI, reason: str, expected: str
) -> None:
    fake_oa.script(Reply(content=[Text("partial")], incomplete=reason))
    async with openai_client(fake_oa.url) as client:
        reply, _ = await call(OpenAIProvider(model="gpt-test", client=client, api="responses"))
    assert reply.stop_reason == expected
    assert reply.text == "partial"


async def test_a_refusal_is_the_reply_text_with_its_stop_reason(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(Reply(refusal="I can't help with that."))
    reply, events = await call(oa_provider)
    assert reply.stop_reason == "refusal"
    assert reply.text == "I can't help with that."
    assert texts(events) == reply.text


async def test_tool_call_cut_by_the_token_limit_is_dropped(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, api: Api
) -> None:
    cut = {"finish_reason": "length"} if api == "chat" else {"incomplete": "max_output_tokens"}
    fake_oa.script(
        Reply(
            content=[Text("Calling."), ToolCall("call_1", "add", raw='{"a": 1, "b'), *()],
            **cut,  # type: ignore[arg-type]
        )
    )
    reply, _ = await call(oa_provider)
    assert reply.stop_reason == "max_tokens"
    assert reply.tool_calls == ()
    assert reply.text == "Calling."


async def test_unreadable_tool_arguments_are_a_retryable_error(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(Reply(content=[ToolCall("call_1", "add", raw='{"a": 1,')]))
    err, _ = await failure(oa_provider)
    assert err.retryable
    assert "call_1" in err.message
    assert "not a JSON object" in err.message


# -- the request ----------------------------------------------------------------------------

CONVERSATION = (
    Message("user", (TextBlock("Add 1 and 2, then deploy."),)),
    Message(
        "assistant",
        (
            ThinkingBlock("another vendor's reasoning", "sig"),
            TextBlock("On it."),
            ToolUseBlock("toolu_1", "add", {"a": 1, "b": 2}),
            ToolUseBlock("toolu_2", "deploy", {"service": "api"}),
        ),
    ),
    Message(
        "user",
        (
            ToolResultBlock("toolu_1", "3"),
            ToolResultBlock("toolu_2", "cluster unreachable", is_error=True),
        ),
    ),
    Message("assistant", (ToolUseBlock("toolu_3", "add", {"a": 3, "b": 0}),)),
    Message("user", (ToolResultBlock("toolu_3", "3"), TextBlock("Also: be quick."))),
)


async def test_a_conversation_maps_onto_chat_messages(fake_oa: FakeOpenAI) -> None:
    fake_oa.script(Reply(content=[Text("Done.")]))
    request = ModelRequest(system="You deploy.", messages=CONVERSATION, tools=(ADD,))
    async with openai_client(fake_oa.url) as client:
        reply, _ = await call(OpenAIProvider(model="gpt-test", client=client), request)
    assert reply.text == "Done."  # the fake accepted the pairing of calls and results
    assert fake_oa.requests[0].body["messages"] == [
        {"role": "system", "content": "You deploy."},
        {"role": "user", "content": "Add 1 and 2, then deploy."},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "deploy", "arguments": '{"service": "api"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "3"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: cluster unreachable"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_3",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 3, "b": 0}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_3", "content": "3"},
        {"role": "user", "content": "Also: be quick."},
    ]


async def test_a_conversation_maps_onto_responses_input(fake_oa: FakeOpenAI) -> None:
    fake_oa.script(Reply(content=[Text("Done.")]))
    request = ModelRequest(system="You deploy.", messages=CONVERSATION, tools=(ADD,))
    async with openai_client(fake_oa.url) as client:
        provider = OpenAIProvider(model="gpt-test", client=client, api="responses")
        reply, _ = await call(provider, request)
    assert reply.text == "Done."
    body = fake_oa.requests[0].body
    assert body["instructions"] == "You deploy."
    assert body["input"] == [
        {"role": "user", "content": "Add 1 and 2, then deploy."},
        {"role": "assistant", "content": "On it."},
        {
            "type": "function_call",
            "call_id": "toolu_1",
            "name": "add",
            "arguments": '{"a": 1, "b": 2}',
        },
        {
            "type": "function_call",
            "call_id": "toolu_2",
            "name": "deploy",
            "arguments": '{"service": "api"}',
        },
        {"type": "function_call_output", "call_id": "toolu_1", "output": "3"},
        {
            "type": "function_call_output",
            "call_id": "toolu_2",
            "output": "Error: cluster unreachable",
        },
        {
            "type": "function_call",
            "call_id": "toolu_3",
            "name": "add",
            "arguments": '{"a": 3, "b": 0}',
        },
        {"type": "function_call_output", "call_id": "toolu_3", "output": "3"},
        {"role": "user", "content": "Also: be quick."},
    ]


def test_the_fake_refuses_results_that_answer_no_call() -> None:
    """The fake checks pairing as the API does, so the mapping tests above mean something."""
    messages = chat_messages(None, CONVERSATION)
    assert chat_problem({"messages": messages, "stream": True}) is None
    without_result = [m for m in messages if m.get("tool_call_id") != "toolu_2"]
    problem = chat_problem({"messages": without_result, "stream": True})
    assert problem is not None
    assert "toolu_2" in problem
    orphan = [m for m in messages if m.get("role") != "assistant"]
    problem = chat_problem({"messages": orphan, "stream": True})
    assert problem is not None
    assert "must be a response to a preceeding message" in problem


async def test_request_options_are_sent(fake_oa: FakeOpenAI) -> None:
    fake_oa.script(Reply(content=[Text("ok")]))
    async with openai_client(fake_oa.url) as client:
        provider = OpenAIProvider(
            model="gpt-test",
            client=client,
            temperature=0.2,
            max_completion_tokens=64,
            top_k=5,  # a compatible server's own field: goes in the extra body
            stream_usage=False,
        )
        await call(provider)
    body = fake_oa.requests[0].body
    assert (body["temperature"], body["max_completion_tokens"], body["top_k"]) == (0.2, 64, 5)
    assert "stream_options" not in body


def test_reserved_request_options_are_refused() -> None:
    client = openai.AsyncOpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(TypeError, match="messages"):
        OpenAIProvider(model="m", client=client, messages=[])
    with pytest.raises(TypeError, match="instructions"):
        OpenAIProvider(model="m", client=client, api="responses", instructions="x")
    with pytest.raises(ValueError, match="api must be"):
        OpenAIProvider(model="m", client=client, api="completions")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model"):
        OpenAIProvider(model="", client=client)


async def test_sdk_retries_are_off_and_base_url_applies_to_a_given_client(
    fake_oa: FakeOpenAI,
) -> None:
    fake_oa.script(HttpError(status=503, message="busy"))
    async with openai.AsyncOpenAI(
        api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=5
    ) as client:
        provider = OpenAIProvider(model="gpt-test", client=client, base_url=fake_oa.url)
        assert provider.client.max_retries == 0
        assert client.max_retries == 5  # the caller's client is left as it was
        err, _ = await failure(provider)
    assert err.retryable
    assert len(fake_oa.requests) == 1  # one attempt: the runtime decides about the next


# -- failures -------------------------------------------------------------------------------

HTTP_CASES = [
    (400, "invalid_request_error", None, False),
    (401, "invalid_request_error", "invalid_api_key", False),
    (403, "permission_error", None, False),
    (404, "invalid_request_error", "model_not_found", False),
    (422, "invalid_request_error", None, False),
    (408, "timeout", None, True),
    (409, "conflict", None, True),
    (429, "requests", "rate_limit_exceeded", True),
    (500, "server_error", None, True),
    (502, "server_error", None, True),
    (503, "server_error", None, True),
]


@pytest.mark.parametrize(("status", "kind", "code", "retryable"), HTTP_CASES)
async def test_http_errors_are_classified(
    fake_oa: FakeOpenAI,
    oa_provider: OpenAIProvider,
    status: int,
    kind: str,
    code: str | None,
    retryable: bool,
) -> None:
    fake_oa.script(HttpError(status=status, type=kind, code=code, message=f"server says {status}"))
    err, events = await failure(oa_provider)
    assert err.retryable is retryable
    assert not err.exhausted
    assert err.status == status
    assert f"server says {status}" in err.message
    assert f"OpenAI API error {status} {kind}" in err.message
    assert "req_fake_0001" in err.message  # the request id, for a support ticket
    assert err.usage == Usage()
    assert events == []


async def test_exhausted_quota_is_not_retried(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(
        HttpError(
            status=429,
            type="insufficient_quota",
            code="insufficient_quota",
            message="You exceeded your current quota, please check your plan and billing details.",
            headers={"retry-after": "20"},
        )
    )
    err, _ = await failure(oa_provider)
    assert not err.retryable
    assert err.exhausted  # a fallback moves on at once
    assert err.retry_after is None
    assert "exceeded your current quota" in err.message


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (429, {"retry-after": "7"}, 7.0),
        (429, {"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        (503, {"retry-after": "3"}, 3.0),
        (500, {}, None),
    ],
)
async def test_retry_after_is_read_from_headers(
    fake_oa: FakeOpenAI,
    oa_provider: OpenAIProvider,
    status: int,
    headers: dict[str, str],
    expected: float | None,
) -> None:
    fake_oa.script(HttpError(status=status, type="requests", message="slow", headers=headers))
    err, _ = await failure(oa_provider)
    assert err.retryable
    assert err.retry_after == expected


@pytest.mark.parametrize("mode", ["abort", "eof"])
async def test_stream_cut_midway_is_retryable(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, mode: str
) -> None:
    fake_oa.script(
        Reply(
            content=[Text("This answer will never be finished.")],
            chunk=4,
            cut_after=5,
            cut_mode=mode,  # type: ignore[arg-type]
        )
    )
    err, events = await failure(oa_provider)
    assert err.retryable
    assert texts(events)  # something streamed before the cut
    assert texts(events) != "This answer will never be finished."


async def test_connection_cut_before_any_event(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(Reply(content=[Text("never")], cut_after=0, cut_mode="eof"))
    err, _ = await failure(oa_provider)
    assert err.retryable
    assert "before its first event" in err.message


async def test_a_chat_stream_without_done_is_broken(fake_oa: FakeOpenAI) -> None:
    reply = Reply(content=[Text("almost")])
    # everything but the final ``data: [DONE]``: 1 role + 1 text + finish + usage chunks
    fake_oa.script(Reply(content=reply.content, cut_after=4, cut_mode="eof"))
    async with openai_client(fake_oa.url) as client:
        err, events = await failure(OpenAIProvider(model="gpt-test", client=client))
    assert err.retryable
    assert "before data: [DONE]" in err.message
    assert texts(events) == "almost"


async def test_error_event_midway_is_retryable(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, api: Api
) -> None:
    fake_oa.script(Reply(content=[Text("partial answer here")], error_after=3))
    err, events = await failure(oa_provider)
    assert err.retryable
    assert err.status == 500
    assert "server_error" in err.message
    assert "The server had an error" in err.message
    # chat: the role chunk and two text pieces came first; responses: only the preamble
    assert texts(events) == ("partial answer h" if api == "chat" else "")


@pytest.mark.parametrize(
    ("code", "retryable", "exhausted"),
    [
        ("context_length_exceeded", False, False),
        ("insufficient_quota", False, True),
        ("rate_limit_exceeded", True, False),
        ("something_new", True, False),  # an unknown kind counts as a server error
    ],
)
async def test_error_event_is_classified_by_its_code(
    fake_oa: FakeOpenAI,
    oa_provider: OpenAIProvider,
    code: str,
    retryable: bool,
    exhausted: bool,
) -> None:
    fake_oa.script(
        Reply(content=[Text("x")], error_after=2, error_code=code, error_message=f"says {code}")
    )
    err, _ = await failure(oa_provider)
    assert err.retryable is retryable
    assert err.exhausted is exhausted
    assert f"says {code}" in err.message


async def test_a_failed_response_is_classified(
    fake_oa: FakeOpenAI,
) -> None:
    fake_oa.script(
        Reply(
            content=[Text("x")],
            error_after=4,
            error_as="response.failed",
            error_code="server_error",
            error_message="upstream died",
        )
    )
    async with openai_client(fake_oa.url) as client:
        err, _ = await failure(OpenAIProvider(model="gpt-test", client=client, api="responses"))
    assert err.retryable
    assert "upstream died" in err.message


async def test_disconnect_without_response(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(Disconnect())
    err, _ = await failure(oa_provider)
    assert err.retryable
    assert "cannot reach the OpenAI API" in err.message


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with openai_client(f"http://127.0.0.1:{port}/v1") as client:
        err, _ = await failure(OpenAIProvider(model="gpt-test", client=client))
    assert err.retryable
    assert "cannot reach" in err.message


async def test_timeout_is_retryable(fake_oa: FakeOpenAI) -> None:
    fake_oa.script(Reply(content=[Text("late")], delay=1.0))
    async with openai_client(fake_oa.url, timeout=0.2) as client:
        err, _ = await failure(OpenAIProvider(model="gpt-test", client=client))
    assert err.retryable
    assert "timed out" in err.message


async def test_cancellation_stops_a_slow_stream_promptly(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider
) -> None:
    fake_oa.script(
        Reply(content=[Text("a slow answer that takes a long time")], chunk=2, event_delay=0.1),
        Reply(content=[Text("next")]),
    )
    events: Events = []
    started = trio.current_time()
    with trio.move_on_after(0.45) as scope:
        await oa_provider.complete(hello(), lambda k, d: events.append((k, d)))
    assert scope.cancelled_caught
    assert trio.current_time() - started < 1.0
    assert 0 < len(texts(events)) < len("a slow answer that takes a long time")
    reply, _ = await call(oa_provider)  # the client is still usable
    assert reply.text == "next"


def test_generic_exceptions_are_classified() -> None:
    assert classify_error(OSError("network is down")).retryable
    assert not classify_error(ValueError("bug")).retryable
    original = ProviderError("as is", retryable=True, status=503)
    assert classify_error(original) is original


# -- configuration --------------------------------------------------------------------------


def test_provider_from_env_needs_a_key_and_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(MissingCredentials) as info:
        provider_from_env("gpt-test")
    assert "OPENAI_API_KEY" in str(info.value)
    assert "OPENAI_BASE_URL" in str(info.value)
    with pytest.raises(MissingCredentials, match="OPENAI_API_KEY"):
        OpenAIProvider(model="gpt-test")  # the SDK's own refusal, said plainly
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    with pytest.raises(ValueError, match="--model"):
        provider_from_env(None)


async def test_provider_from_env_reads_key_and_base_url(
    fake_oa: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", fake_oa.url)
    fake_oa.script(Reply(content=[Text("env ok")]), Reply(content=[Text("env ok")]))
    async with provider_from_env("gpt-env") as provider:
        reply, _ = await call(provider)
        assert provider.client.max_retries == 0
    async with provider_from_env("gpt-env", api="responses") as provider:
        await call(provider)
    assert reply.text == "env ok"
    chat, responses = fake_oa.requests
    assert chat.headers["authorization"] == "Bearer sk-from-env"
    assert chat.body["model"] == "gpt-env"
    assert (chat.path, responses.path) == ("/v1/chat/completions", "/v1/responses")


def test_import_perdure_does_not_load_the_openai_sdk() -> None:
    code = (
        "import sys, perdure, perdure.providers\n"
        "assert 'openai' not in sys.modules\n"
        "perdure.providers.FallbackProvider\n"
        "assert 'openai' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_openai_provider_is_exported_lazily() -> None:
    import perdure.providers

    assert perdure.providers.OpenAIProvider is OpenAIProvider
