"""The OpenAI provider inside the runtime: open_runtime -> openai SDK -> fake OpenAI API.

What the runtime commits for each kind of reply and failure, on both APIs: who
answered, tool round trips (parallel, failing tools), every retry class as a
durable ``RetryPending`` (``retry-after`` honoured), fatal errors, an exhausted
quota, usage sums, ephemeral deltas.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perdure.providers.openai import Api, OpenAIProvider
from perdure.storage.records import (
    GenerationCompleted,
    RetryPending,
    ToolCompleted,
    Usage,
)
from tests.fake_openai import (
    Action,
    Disconnect,
    FakeOpenAI,
    FakeUsage,
    HttpError,
    Reply,
    Text,
    ToolCall,
)
from tests.providers._agent import (
    ask,
    ask_collecting,
    failed_at_once,
    gave_up,
    of,
    records,
    retried_durably,
    runtime,
)
from tests.support.fold import fold_of


def tool_results(body: dict[str, object], api: Api) -> dict[str, str]:
    """The tool results of a request body, by call id."""
    if api == "chat":
        messages = body["messages"]
        assert isinstance(messages, list)
        return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    items = body["input"]
    assert isinstance(items, list)
    return {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}


async def test_text_reply_completes_the_run_and_records_who_answered(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path, api: Api
) -> None:
    fake_oa.script(Reply(content=[Text("Nothing to do; all is well.")]))
    async with runtime(log_dir, oa_provider) as rt:
        sid, outcome = await ask(rt, "Anything to do?", system="You are terse.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "Nothing to do; all is well."
    (gen,) = of(GenerationCompleted, committed)
    assert gen.stop_reason == "end_turn"
    expected_id = "chatcmpl-fake-0001" if api == "chat" else "resp_fake_0001"
    assert (gen.provider, gen.model, gen.response_id) == ("openai", "gpt-test", expected_id)
    body = fake_oa.requests[0].body
    assert [t["name"] if api == "responses" else t["function"]["name"] for t in body["tools"]] == [
        "add",
        "lookup",
        "deploy",
    ]


async def test_parallel_tool_calls_and_errors_round_trip(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path, api: Api
) -> None:
    fake_oa.script(
        Reply(
            content=[
                Text("Looking both up, and deploying."),
                ToolCall("call_a", "lookup", {"key": "alpha"}),
                ToolCall("call_o", "lookup", {"key": "omega"}),
                ToolCall("call_d", "deploy", {"service": "api"}),
                ToolCall("call_x", "launch_rockets", {}),
            ],
            interleave=True,
        ),
        Reply(content=[ToolCall("call_s", "add", {"a": 40, "b": 2})]),
        Reply(content=[Text("alpha is first, omega is last; the deploy failed; 42.")]),
    )
    async with runtime(log_dir, oa_provider) as rt:
        sid, outcome = await ask(rt, "Look up alpha and omega, deploy, add.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "alpha is first, omega is last; the deploy failed; 42."
    done = {r.call_id: r for r in of(ToolCompleted, committed)}
    assert done.keys() == {"call_a", "call_o", "call_d", "call_x", "call_s"}
    # the second request carries every result (the fake refuses an unanswered call)
    results = tool_results(fake_oa.requests[1].body, api)
    assert results["call_a"] == "first letter"
    assert results["call_o"] == "last letter"
    assert results["call_d"].startswith("Error: ")
    assert "cluster for api is unreachable" in results["call_d"]
    assert results["call_x"].startswith("Error: ")
    assert "no tool named 'launch_rockets'" in results["call_x"]
    # the third carries the whole history: five results, in call order
    assert list(tool_results(fake_oa.requests[2].body, api)) == [
        "call_a",
        "call_o",
        "call_d",
        "call_x",
        "call_s",
    ]
    assert tool_results(fake_oa.requests[2].body, api)["call_s"] == "42"


RETRYABLE: list[tuple[str, Action]] = [
    ("429", HttpError(status=429, type="requests", code="rate_limit_exceeded", message="slow")),
    ("500", HttpError(status=500, message="The server had an error")),
    ("502", HttpError(status=502, message="Bad gateway")),
    ("503", HttpError(status=503, message="The engine is currently overloaded")),
    ("408", HttpError(status=408, type="timeout", message="Request timed out")),
    ("409", HttpError(status=409, type="conflict", message="Conflict")),
    ("cut", Reply(content=[Text("PARTIAL text never finished")], chunk=4, cut_after=4)),
    ("eof", Reply(content=[Text("PARTIAL text never finished")], cut_after=4, cut_mode="eof")),
    ("error-event", Reply(content=[Text("PARTIAL text never finished")], error_after=4)),
    ("disconnect", Disconnect()),
]


@pytest.mark.parametrize(("label", "failure"), RETRYABLE, ids=[r[0] for r in RETRYABLE])
async def test_retryable_failure_is_retried_durably(
    fake_oa: FakeOpenAI,
    oa_provider: OpenAIProvider,
    log_dir: Path,
    label: str,
    failure: Action,
) -> None:
    answer = Reply(content=[Text("Recovered answer.")])
    pending, _, _ = await retried_durably(log_dir, oa_provider, fake_oa, failure, answer)
    assert (pending.provider, pending.fallback) == ("openai", False)  # who failed
    assert fake_oa.requests[1].body == fake_oa.requests[0].body  # the same request again


@pytest.mark.parametrize("header", [{"retry-after": "0.5"}, {"retry-after-ms": "500"}])
async def test_retry_after_is_honoured_by_the_back_off(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path, header: dict[str, str]
) -> None:
    fake_oa.script(
        HttpError(status=429, type="requests", message="slow", headers=header),
        Reply(content=[Text("ok")]),
    )
    async with runtime(log_dir, oa_provider) as rt:
        sid, outcome = await ask(rt, "Go.")
        (pending,) = of(RetryPending, await records(rt, sid))
    assert outcome.status == "completed"
    assert pending.not_before - pending.at >= 0.5
    first, second = fake_oa.requests
    assert second.at - first.at >= 0.49
    assert "429" in pending.error


FATAL = [
    (400, "invalid_request_error", None, "Invalid 'messages[0].content': string too long."),
    (401, "invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-test."),
    (404, "invalid_request_error", "model_not_found", "The model `gpt-x` does not exist"),
    (
        429,
        "insufficient_quota",
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
    ),
]


@pytest.mark.parametrize(
    ("status", "kind", "code", "message"), FATAL, ids=[f[2] or str(f[0]) for f in FATAL]
)
async def test_fatal_error_fails_the_run_with_the_server_message(
    fake_oa: FakeOpenAI,
    oa_provider: OpenAIProvider,
    log_dir: Path,
    status: int,
    kind: str,
    code: str | None,
    message: str,
) -> None:
    failure = HttpError(
        status=status, type=kind, code=code, message=message, headers={"retry-after": "1"}
    )
    outcome = await failed_at_once(log_dir, oa_provider, fake_oa, failure)
    assert message in outcome.reason
    assert str(status) in outcome.reason


async def test_retries_stop_at_max_model_attempts(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path
) -> None:
    failure = HttpError(status=503, message="The engine is currently overloaded")
    outcome = await gave_up(log_dir, oa_provider, fake_oa, failure)
    assert "overloaded" in outcome.reason


async def test_usage_is_summed_per_generation_run_and_session(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path
) -> None:
    fake_oa.script(
        # run 1, turn 1: an HTTP error (no usage reported), then a tool call
        HttpError(status=500, message="oops"),
        Reply(
            content=[ToolCall("call_1", "add", {"a": 1, "b": 2})],
            usage=FakeUsage(prompt_tokens=100, completion_tokens=20, cached_tokens=60),
        ),
        # run 1, turn 2
        Reply(
            content=[Text("3")],
            usage=FakeUsage(prompt_tokens=130, completion_tokens=10, cached_tokens=100),
        ),
        # run 2
        Reply(content=[Text("hi")], usage=FakeUsage(prompt_tokens=5, completion_tokens=5)),
    )
    async with runtime(log_dir, oa_provider) as rt:
        sid = await rt.create_session()
        await rt.submit(sid, "1 + 2?")
        await rt.submit(sid, "Say hi.")
        await rt.wait_idle(sid)
        state = await fold_of(rt, sid)
    first, second = (state.submissions[s] for s in ("in1", "in2"))
    g1, g2 = (state.generations[g] for g in first.generations)
    assert g1.usage == Usage(input_tokens=40, output_tokens=20, cache_read_input_tokens=60)
    assert g2.usage == Usage(input_tokens=30, output_tokens=10, cache_read_input_tokens=100)
    (run1,) = (state.runs[r] for r in first.runs)
    (run2,) = (state.runs[r] for r in second.runs)
    assert run1.usage == g1.usage + g2.usage
    assert run2.usage == Usage(input_tokens=5, output_tokens=5)
    assert state.usage == Usage(input_tokens=75, output_tokens=35, cache_read_input_tokens=160)


async def test_deltas_are_live_and_never_stored(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path
) -> None:
    fake_oa.script(
        Reply(
            content=[Text("I will add them. "), ToolCall("call_1", "add", {"a": 40, "b": 2})],
            chunk=3,
        ),
        Reply(content=[Text("The result is 42.")], chunk=3),
    )
    async with runtime(log_dir, oa_provider) as rt:
        sid, events = await ask_collecting(rt, "Add 40 and 2.")
        stored = await records(rt, sid)
    ephemeral = [e for e in events if e.ephemeral]
    assert all(e.seq is None and e.record is None for e in ephemeral)
    kinds = {e.kind for e in ephemeral}
    assert {"model_call", "text_delta", "tool_use_start", "tool_input_delta"} <= kinds
    text = "".join(e.data["text"] for e in ephemeral if e.kind == "text_delta")
    assert text == "I will add them. The result is 42."
    (start,) = [e.data for e in ephemeral if e.kind == "tool_use_start"]
    assert (start["id"], start["name"]) == ("call_1", "add")
    pieces = "".join(e.data["partial_json"] for e in ephemeral if e.kind == "tool_input_delta")
    assert pieces == '{"a": 40, "b": 2}'
    assert all(e.data["submission_id"] for e in ephemeral)
    stored_kinds = {type(r).__name__ for r in stored}
    assert not stored_kinds & {"text_delta", "tool_input_delta"}
