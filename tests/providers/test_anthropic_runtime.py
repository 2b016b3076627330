"""The Anthropic provider inside the runtime: open_runtime -> SDK -> fake Messages API.

What the runtime commits for each kind of model reply and failure: tool round
trips (single, parallel, failing tools), durable retries, fatal errors, cut
streams, usage sums, ephemeral deltas, pause_turn continuation, cancellation.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Annotated

import pytest
import trio

import perdure
from perdure.providers.anthropic import AnthropicProvider
from perdure.storage.records import (
    GenerationCompleted,
    RetryPending,
    ToolCompleted,
    Usage,
)
from tests.fake_anthropic import (
    Action,
    Disconnect,
    FakeAnthropic,
    FakeUsage,
    HttpError,
    Reply,
    Text,
    ToolUse,
    sent_messages,
)
from tests.providers import _agent
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

# -- replies and tools ----------------------------------------------------------------------


async def test_text_reply_completes_the_run(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(Reply(content=[Text("Nothing to do; all is well.")]))
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "Anything to do?", system="You are terse.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "Nothing to do; all is well."
    (gen,) = of(GenerationCompleted, committed)
    assert gen.text == outcome.final_text
    assert gen.stop_reason == "end_turn"
    # Who answered is recorded with the reply, as the vendor reported it.
    assert (gen.provider, gen.response_id) == ("anthropic", "msg_fake_0001")
    assert gen.model == fake.requests[0].body["model"]
    assert gen.submission_id == outcome.submission_id
    body = fake.requests[0].body
    assert body["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
    ]
    assert sent_messages(body) == [
        {"role": "user", "content": [{"type": "text", "text": "Anything to do?"}]}
    ]
    assert [t["name"] for t in body["tools"]] == ["add", "lookup", "deploy"]
    assert [("cache_control" in t) for t in body["tools"]] == [False, False, True]
    assert body["tools"][0]["input_schema"]["properties"].keys() == {"a", "b"}


async def test_single_tool_round_trip(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(content=[Text("Adding."), ToolUse("toolu_01", "add", {"a": 2, "b": 3})]),
        Reply(content=[Text("2 + 3 = 5.")]),
    )
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "What is 2 + 3?")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "2 + 3 = 5."
    (done,) = of(ToolCompleted, committed)
    assert done.call_id == "toolu_01"
    assert done.output == "5"
    assert not done.is_error
    second = sent_messages(fake.requests[1].body)
    assert second == [
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "5"}],
        },
    ]


async def test_parallel_tool_use_round_trip(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(
            content=[
                ToolUse("toolu_a", "lookup", {"key": "alpha"}),
                ToolUse("toolu_o", "lookup", {"key": "omega"}),
            ]
        ),
        Reply(content=[Text("alpha is first, omega is last.")]),
    )
    _agent.LOOKUPS_STARTED.clear()
    _agent.PARTNERS.update(alpha=("omega",), omega=("alpha",))  # each waits for the other
    try:
        async with runtime(log_dir, provider) as rt:
            sid, outcome = await ask(rt, "Look up alpha and omega.")
            committed = await records(rt, sid)
    finally:
        _agent.PARTNERS.clear()
    assert outcome.status == "completed"
    done = of(ToolCompleted, committed)
    assert {r.call_id for r in done} == {"toolu_a", "toolu_o"}
    assert not any(r.is_error for r in done), "both ran at once (each waited for the other)"
    assert [r.call_id for r in done] == ["toolu_o", "toolu_a"], "completed out of order"
    assistant, results = sent_messages(fake.requests[1].body)[1:]
    assert [b["id"] for b in assistant["content"]] == ["toolu_a", "toolu_o"]
    assert results == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "first letter"},
            {"type": "tool_result", "tool_use_id": "toolu_o", "content": "last letter"},
        ],
    }


async def test_failing_tools_are_sent_back_with_is_error(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(
            content=[
                ToolUse("toolu_d", "deploy", {"service": "api"}),
                ToolUse("toolu_x", "launch_rockets", {}),
                ToolUse("toolu_s", "add", {"a": 1, "b": 1}),
            ]
        ),
        Reply(content=[Text("The deploy failed; I did not retry it.")]),
    )
    async with runtime(log_dir, provider) as rt:
        _, outcome = await ask(rt, "Deploy the api.")
    assert outcome.status == "completed"
    results = sent_messages(fake.requests[1].body)[-1]["content"]
    by_id = {r["tool_use_id"]: r for r in results}
    assert by_id["toolu_d"]["is_error"] is True
    assert "cluster for api is unreachable" in by_id["toolu_d"]["content"]
    assert by_id["toolu_x"]["is_error"] is True
    assert "no tool named 'launch_rockets'" in by_id["toolu_x"]["content"]
    assert "is_error" not in by_id["toolu_s"]
    assert by_id["toolu_s"]["content"] == "2"


async def test_pause_turn_is_continued_with_another_call(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(content=[Text("Searching the web. ")], stop_reason="pause_turn"),
        Reply(content=[Text("The answer is 42.")]),
    )
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "What is the answer?")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "The answer is 42."
    assert [g.stop_reason for g in of(GenerationCompleted, committed)] == ["pause_turn", "end_turn"]
    assert sent_messages(fake.requests[1].body)[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Searching the web."}],
    }


async def test_refusal_ends_the_run_with_its_stop_reason(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(Reply(content=[Text("I can't help with that.")], stop_reason="refusal"))
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "Something bad.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert [g.stop_reason for g in of(GenerationCompleted, committed)] == ["refusal"]


# -- failures -------------------------------------------------------------------------------

RETRYABLE: list[tuple[str, Action]] = [
    ("429", HttpError(status=429, type="rate_limit_error", message="slow down")),
    ("529", HttpError(status=529, type="overloaded_error", message="Overloaded")),
    ("500", HttpError(status=500, type="api_error", message="Internal server error")),
    ("cut", Reply(content=[Text("PARTIAL text never finished")], chunk=4, cut_after=5)),
    ("eof", Reply(content=[Text("PARTIAL text never finished")], cut_after=5, cut_mode="eof")),
    ("sse-error", Reply(content=[Text("PARTIAL text never finished")], error_after=5)),
    ("disconnect", Disconnect()),
]


@pytest.mark.parametrize(("label", "failure"), RETRYABLE, ids=[r[0] for r in RETRYABLE])
async def test_retryable_failure_is_retried_durably(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path, label: str, failure: Action
) -> None:
    await retried_durably(
        log_dir, provider, fake, failure, Reply(content=[Text("Recovered answer.")])
    )


async def test_retry_after_is_honoured_by_the_back_off(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        HttpError(
            status=429, type="rate_limit_error", message="slow", headers={"retry-after": "0.4"}
        ),
        Reply(content=[Text("ok")]),
    )
    async with runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, "Go.")
        (pending,) = of(RetryPending, await records(rt, sid))
    assert outcome.status == "completed"
    assert pending.not_before - pending.at >= 0.4
    first, second = fake.requests
    assert second.at - first.at >= 0.39
    assert "429" in pending.error
    assert "slow" in pending.error


FATAL = [
    (400, "invalid_request_error", "messages.0.content: text content blocks must be non-empty"),
    (401, "authentication_error", "invalid x-api-key"),
    (403, "permission_error", "Your API key does not have permission to use this resource"),
    (404, "not_found_error", "model: claude-nonexistent"),
    (422, "invalid_request_error", "unprocessable"),
]


@pytest.mark.parametrize(("status", "error_type", "message"), FATAL, ids=[str(f[0]) for f in FATAL])
async def test_fatal_error_fails_the_run_with_the_server_message(
    fake: FakeAnthropic,
    provider: AnthropicProvider,
    log_dir: Path,
    status: int,
    error_type: str,
    message: str,
) -> None:
    failure = HttpError(status=status, type=error_type, message=message)
    outcome = await failed_at_once(log_dir, provider, fake, failure)
    assert message in outcome.reason
    assert str(status) in outcome.reason


async def test_retries_stop_at_max_model_attempts(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    failure = HttpError(status=529, type="overloaded_error", message="Overloaded")
    outcome = await gave_up(log_dir, provider, fake, failure)
    assert "Overloaded" in outcome.reason


async def test_cancelling_a_run_stops_the_stream(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(Reply(content=[Text("a very slow answer " * 20)], chunk=3, event_delay=0.05))
    async with runtime(log_dir, provider) as rt:
        sid = await rt.create_session()
        async with aclosing(rt.events(sid)) as events:
            await rt.submit(sid, "Take your time.")
            async for event in events:
                if event.kind == "text_delta":  # the answer is streaming now
                    break
        await rt.cancel(sid)
        with trio.fail_after(10):
            outcome = await rt.wait_idle(sid)
        committed = await records(rt, sid)
        # The runtime hung up: the server's next writes fail, long before the stream's end.
        with trio.fail_after(10):
            while not fake.streams[0].aborted:  # noqa: ASYNC110 (the server is a thread)
                await trio.sleep(0.05)
    assert outcome is not None
    assert outcome.status == "cancelled"
    assert of(GenerationCompleted, committed) == []
    (stream,) = fake.streams
    assert stream.sent < stream.total, "the stream was cut, not read to its end"


# -- usage ----------------------------------------------------------------------------------


async def test_usage_is_summed_per_generation_run_and_session(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        # run 1, turn 1: a stream cut after message_start (its usage counts), then a tool call
        Reply(
            content=[Text("lost")],
            usage=FakeUsage(input_tokens=100, output_tokens=50, cache_read_input_tokens=50),
            cut_after=3,
        ),
        Reply(
            content=[ToolUse("toolu_1", "add", {"a": 1, "b": 2})],
            usage=FakeUsage(input_tokens=100, output_tokens=20, cache_creation_input_tokens=7),
        ),
        # run 1, turn 2
        Reply(
            content=[Text("3")],
            usage=FakeUsage(input_tokens=130, output_tokens=10, cache_read_input_tokens=100),
        ),
        # run 2: an HTTP error (no usage reported), then a reply
        HttpError(status=529, type="overloaded_error", message="Overloaded"),
        Reply(content=[Text("hi")], usage=FakeUsage(input_tokens=5, output_tokens=5)),
    )
    async with runtime(log_dir, provider) as rt:
        sid = await rt.create_session()
        await rt.submit(sid, "1 + 2?")
        await rt.submit(sid, "Say hi.")
        await rt.wait_idle(sid)
        state = await fold_of(rt, sid)
    first, second = (state.submissions[s] for s in ("in1", "in2"))
    g1, g2 = (state.generations[g] for g in first.generations)
    assert g1.usage == Usage(
        input_tokens=200,
        output_tokens=21,
        cache_creation_input_tokens=7,
        cache_read_input_tokens=50,
    )
    assert g2.usage == Usage(input_tokens=130, output_tokens=10, cache_read_input_tokens=100)
    (run1,) = (state.runs[r] for r in first.runs)
    (run2,) = (state.runs[r] for r in second.runs)
    assert run1.usage == g1.usage + g2.usage
    assert run2.usage == Usage(input_tokens=5, output_tokens=5)
    assert state.usage == run1.usage + run2.usage
    assert state.usage == Usage(
        input_tokens=335,
        output_tokens=36,
        cache_creation_input_tokens=7,
        cache_read_input_tokens=150,
    )


# -- ephemeral events -----------------------------------------------------------------------


async def test_deltas_are_live_ordered_and_never_stored(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(content=[Text("PARTIAL then cut")], chunk=4, cut_after=5),
        Reply(
            content=[Text("I will add them. "), ToolUse("toolu_1", "add", {"a": 40, "b": 2})],
            chunk=3,
        ),
        Reply(content=[Text("The result is 42.")], chunk=3),
    )
    async with runtime(log_dir, provider) as rt:
        sid, events = await ask_collecting(rt, "Add 40 and 2.")
        replayed = [e async for e in rt.events(sid, live=False)]
        stored = await records(rt, sid)
    ephemeral = [e for e in events if e.ephemeral]
    assert ephemeral
    assert all(e.seq is None and e.record is None for e in ephemeral)
    # attempts are marked, and each attempt's deltas come in order
    calls = [e.data["attempt"] for e in ephemeral if e.kind == "model_call"]
    assert calls == [1, 2, 1]

    def streamed(generation_id: str, attempt: int) -> str:
        return "".join(
            e.data["text"]
            for e in ephemeral
            if e.kind == "text_delta"
            and e.data["generation_id"] == generation_id
            and e.data["attempt"] == attempt
        )

    replies = of(GenerationCompleted, stored)
    assert streamed(replies[0].generation_id, 1) == "PARTIAL "  # cut: streamed, never committed
    assert streamed(replies[0].generation_id, 2) == replies[0].text == "I will add them. "
    assert streamed(replies[1].generation_id, 1) == replies[1].text == "The result is 42."
    tool_json = "".join(e.data["partial_json"] for e in ephemeral if e.kind == "tool_input_delta")
    assert tool_json == '{"a": 40, "b": 2}'
    # every delta of a reply is published before the reply's committed record
    kinds = [(e.kind, e.data.get("generation_id")) for e in events]
    for reply in replies:
        committed_at = next(
            i for i, e in enumerate(events) if e.kind == "GenerationCompleted" and e.record == reply
        )
        last_delta = max(
            i for i, (k, g) in enumerate(kinds) if k == "text_delta" and g == reply.generation_id
        )
        assert last_delta < committed_at
    # committed events carry sequence numbers, in order
    seqs = [e.seq for e in events if not e.ephemeral]
    assert seqs == sorted(seqs)
    assert None not in seqs
    # nothing ephemeral is in the log, and no partial text is in any record
    assert replayed
    assert all(not e.ephemeral for e in replayed)
    assert [e.seq for e in replayed] == seqs
    assert {type(r).__name__ for r in stored}.isdisjoint(
        {"text_delta", "tool_input_delta", "tool_use_start", "model_call"}
    )
    assert "PARTIAL" not in repr(stored)


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def sign_in(user: str, password: Annotated[str, perdure.Secret]) -> str:
    """Sign in."""
    return f"hello {user}"


async def test_a_secret_argument_is_not_streamed_live(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(
            content=[
                Text("Signing in. "),
                ToolUse("toolu_1", "sign_in", {"user": "ann", "password": "pw-51"}),
            ],
            chunk=3,
        ),
        Reply(content=[Text("Done.")], chunk=3),
    )
    async with runtime(log_dir, provider, tools=[sign_in]) as rt:
        sid, events = await ask_collecting(rt, "Sign in.")
        stored = await records(rt, sid)
    kinds = [e.kind for e in events if e.ephemeral]
    assert "tool_use_start" in kinds and "text_delta" in kinds, "the reply was streamed"
    assert "tool_input_delta" not in kinds
    assert "pw-51" not in repr([e.data for e in events if e.ephemeral])
    (reply, _) = of(GenerationCompleted, stored)
    assert reply.tool_calls[0].input["password"] == "pw-51", "the log keeps it"
