"""FallbackProvider: a model turn moves on to the next provider, and the log says so.

The runtime tests run a real Anthropic provider and a real OpenAI provider (each
through its SDK, against its fake server) behind one ``FallbackProvider``: the
primary overloaded or exhausted, the secondary answering, what is recorded, and a
conversation started on Anthropic and carried over, whole, to OpenAI. The choice
itself is a pure function of recorded facts; the first tests check it alone.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from perdure.providers import FallbackProvider
from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.base import (
    Emit,
    FailedAttempt,
    Message,
    ModelReply,
    ModelRequest,
    ProviderError,
    TextBlock,
    Usage,
)
from perdure.providers.openai import OpenAIProvider
from perdure.storage.records import GenerationCompleted, RetryPending, RunFinished
from perdure.timeline import render
from tests import fake_anthropic as fa
from tests import fake_openai as fo
from tests.providers._agent import ask, of, records, runtime
from tests.providers.conftest import openai_client, sdk_client

# -- the choice, alone ----------------------------------------------------------------------


class Named:
    """A provider that answers with its name, or fails as told (for the pure choice)."""

    def __init__(self, name: str, error: ProviderError | None = None) -> None:
        self.name = name
        self.error = error

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        if self.error is not None:
            raise self.error
        return ModelReply(text=f"from {self.name}")


def request(*failed: tuple[str, bool], answered_by: str = "") -> ModelRequest:
    return ModelRequest(
        system=None,
        messages=(Message("user", (TextBlock("hi"),)),),
        attempt=len(failed) + 1,
        failed=tuple(
            FailedAttempt(attempt=i + 1, provider=p, fallback=f) for i, (p, f) in enumerate(failed)
        ),
        answered_by=answered_by,
    )


def test_the_choice_is_a_function_of_the_recorded_failures() -> None:
    chain = FallbackProvider([Named("a"), Named("b"), Named("c")], after=2)
    assert chain.choose(request()) == 0
    assert chain.choose(request(("a", False))) == 0
    assert chain.choose(request(("a", False), ("a", True))) == 1
    assert chain.choose(request(("a", True), ("b", False))) == 1
    assert chain.choose(request(("a", True), ("b", True))) == 2
    assert chain.choose(request(("a", True), ("b", True), ("c", False))) == 2
    # a later turn of the same input starts where the previous one was answered
    assert chain.choose(request(answered_by="b")) == 1
    assert chain.choose(request(answered_by="gone")) == 0
    assert chain.choose(request(("", False), ("x", True))) == 0  # older logs, unknown names
    unsticky = FallbackProvider([Named("a"), Named("b")], sticky=False)
    assert unsticky.choose(request(answered_by="b")) == 0


async def test_a_failure_says_who_failed_and_whether_to_move_on() -> None:
    busy = ProviderError("busy", retryable=True, retry_after=3.0, status=529)
    chain = FallbackProvider([Named("a", busy), Named("b", busy)], after=2)
    with pytest.raises(ProviderError) as first:
        await chain.complete(request(), lambda k, d: None)
    assert (first.value.provider, first.value.fallback) == ("a", False)
    assert first.value.retry_after == 3.0  # still a's own back-off
    with pytest.raises(ProviderError) as second:
        await chain.complete(request(("a", False)), lambda k, d: None)
    assert (second.value.provider, second.value.fallback) == ("a", True)
    assert second.value.retryable
    assert "the next attempt goes to b" in second.value.message
    with pytest.raises(ProviderError) as last:  # the last provider has nowhere to go
        await chain.complete(request(("a", False), ("a", True), ("b", False)), lambda k, d: None)
    assert (last.value.provider, last.value.fallback) == ("b", False)
    reply = await FallbackProvider([Named("a"), Named("b")]).complete(
        request(("a", True)), lambda k, d: None
    )
    assert (reply.text, reply.provider) == ("from b", "b")


async def test_exhausted_moves_on_at_once_and_fatal_does_not_move() -> None:
    quota = ProviderError("quota", retryable=False, status=429, exhausted=True)
    fatal = ProviderError("bad request", retryable=False, status=400)
    chain = FallbackProvider([Named("a", quota), Named("b")], after=5)
    with pytest.raises(ProviderError) as moved:
        await chain.complete(request(), lambda k, d: None)
    assert (moved.value.retryable, moved.value.fallback) == (True, True)
    assert "a is exhausted" in moved.value.message
    chain = FallbackProvider([Named("a", fatal), Named("b")], after=1)
    with pytest.raises(ProviderError) as stayed:
        await chain.complete(request(), lambda k, d: None)
    assert (stayed.value.retryable, stayed.value.fallback) == (False, False)
    chain = FallbackProvider([Named("a"), Named("b", quota)])
    with pytest.raises(ProviderError) as end:  # exhausted, and no one left: the run fails
        await chain.complete(request(("a", True)), lambda k, d: None)
    assert (end.value.retryable, end.value.exhausted) == (False, True)


def test_providers_must_be_told_apart() -> None:
    same = (
        "two providers are named 'openai': the log could not tell them apart; "
        "give them distinct names (e.g. OpenAIProvider(name=...))"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(same)}$"):
        FallbackProvider([Named("openai"), Named("openai")])
    with pytest.raises(ValueError, match=r"^every provider of a FallbackProvider needs a name$"):
        FallbackProvider([Named("a"), Named("")])
    with pytest.raises(ValueError, match=r"^FallbackProvider needs at least one provider$"):
        FallbackProvider([])
    with pytest.raises(ValueError, match="after"):
        FallbackProvider([Named("a")], after=0)


def test_the_last_provider_keeps_the_turn_whatever_the_log_says() -> None:
    """A log written by a longer chain (a provider removed before a restart) may say that
    the last provider of this chain moved the turn on; there is nowhere to go, so the
    last provider keeps it rather than the choice pointing past the end."""
    chain = FallbackProvider([Named("a"), Named("b")])
    assert chain.choose(request(("a", True), ("b", True))) == 1
    assert chain.choose(request(("b", True))) == 1


async def test_the_default_chain_moves_on_after_two_failures_of_one_provider() -> None:
    """``after`` defaults to two retryable failures of one provider; ``after=3`` counts
    each recorded failure of that provider once."""
    busy = ProviderError("busy", retryable=True, status=529)
    default = FallbackProvider([Named("a", busy), Named("b")])
    with pytest.raises(ProviderError) as once:
        await default.complete(request(), lambda k, d: None)
    assert not once.value.fallback
    with pytest.raises(ProviderError) as twice:
        await default.complete(request(("a", False)), lambda k, d: None)
    assert twice.value.fallback
    patient = FallbackProvider([Named("a", busy), Named("b")], after=3)
    with pytest.raises(ProviderError) as second:
        await patient.complete(request(("a", False)), lambda k, d: None)
    assert not second.value.fallback, "two failures of three allowed"
    with pytest.raises(ProviderError) as third:
        await patient.complete(request(("a", False), ("a", False)), lambda k, d: None)
    assert third.value.fallback
    assert "a failed 3 time(s): the next attempt goes to b" in third.value.message


async def test_a_failure_keeps_what_the_provider_reported() -> None:
    """Whether the turn stays or moves on, the reported error keeps the failed call's
    status, usage (it is billed) and model, and whether the provider is exhausted."""
    usage = Usage(input_tokens=120, output_tokens=7)
    busy = ProviderError("busy", retryable=True, status=529, usage=usage, model="big")
    quota = ProviderError(
        "quota", retryable=False, status=429, usage=usage, model="big", exhausted=True
    )
    for error, failed, fallback, exhausted in [
        (busy, (), False, False),  # stays on a
        (busy, (("a", False),), True, False),  # moves on after two failures
        (quota, (), True, True),  # moves on at once
    ]:
        chain = FallbackProvider([Named("a", error), Named("b")])
        with pytest.raises(ProviderError) as raised:
            await chain.complete(request(*failed), lambda k, d: None)
        got = raised.value
        assert (got.status, got.usage, got.model) == (529 if error is busy else 429, usage, "big")
        assert (got.fallback, got.exhausted) == (fallback, exhausted)
    last = FallbackProvider([Named("a"), Named("b", quota)])
    with pytest.raises(ProviderError) as stuck:
        await last.complete(request(("a", True)), lambda k, d: None)
    assert (stuck.value.status, stuck.value.usage, stuck.value.model) == (429, usage, "big")


async def test_a_move_names_the_provider_that_comes_next() -> None:
    """The recorded reason names the provider after the one that failed, in a chain of
    three as well."""
    busy = ProviderError("busy", retryable=True)
    chain = FallbackProvider([Named("a"), Named("b", busy), Named("c")], after=1)
    with pytest.raises(ProviderError) as moved:
        await chain.complete(request(("a", True)), lambda k, d: None)
    assert moved.value.message == "busy [b failed 1 time(s): the next attempt goes to c]"


class Closable(Named):
    """A provider with a client to close (most SDK providers have one)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_closing_the_chain_closes_every_provider_that_can_be_closed() -> None:
    """``aclose`` (and leaving ``async with``) closes each member once; a member without
    ``aclose`` is skipped rather than failing the close of the others."""
    first, last = Closable("a"), Closable("c")
    chain = FallbackProvider([first, Named("b"), last])
    await chain.aclose()
    assert (first.closed, last.closed) == (1, 1)
    async with chain as entered:
        assert entered is chain
    assert (first.closed, last.closed) == (2, 2)


def test_the_chain_shows_its_providers_and_options() -> None:
    chain = FallbackProvider([Named("anthropic"), Named("openai")], after=3, sticky=False)
    assert repr(chain) == "FallbackProvider([anthropic, openai], after=3, sticky=False)"


# -- inside the runtime, over both SDKs -----------------------------------------------------


@pytest.fixture
def fake_a() -> Any:
    with fa.FakeAnthropic() as server:
        yield server


def chain_of(a_url: str, o_url: str, **options: Any) -> Any:
    class Chain:
        async def __aenter__(self) -> FallbackProvider:
            self.a = sdk_client(a_url)
            self.o = openai_client(o_url)
            primary = AnthropicProvider(model="claude-test", max_tokens=1024, client=self.a)
            secondary = OpenAIProvider(model="gpt-test", client=self.o)
            return FallbackProvider([primary, secondary], **options)

        async def __aexit__(self, *exc: object) -> None:
            await self.a.close()
            await self.o.close()

    return Chain()


@pytest.fixture
async def chain(fake_a: fa.FakeAnthropic, fake_oa: fo.FakeOpenAI) -> AsyncIterator[Any]:
    async with chain_of(fake_a.url, fake_oa.url, after=2) as provider:
        yield provider


OVERLOADED = fa.HttpError(
    status=529, type="overloaded_error", message="Overloaded", headers={"retry-after": "30"}
)


async def test_primary_overloaded_the_secondary_answers_and_it_is_recorded(
    fake_a: fa.FakeAnthropic, fake_oa: fo.FakeOpenAI, chain: FallbackProvider, log_dir: Path
) -> None:
    fake_a.script(
        fa.HttpError(status=529, type="overloaded_error", message="Overloaded"), OVERLOADED
    )
    fake_oa.script(fo.Reply(content=[fo.Text("Answered by the secondary.")]))
    async with runtime(log_dir, chain, retry_base=0.05) as rt:
        sid, outcome = await ask(rt, "Anyone there?")
        stored = await rt._journal.read_session(sid)
    committed = [c.record for c in stored]
    assert outcome.status == "completed"
    assert outcome.final_text == "Answered by the secondary."
    first, second = of(RetryPending, committed)
    assert (first.provider, first.fallback) == ("anthropic", False)
    assert (second.provider, second.fallback) == ("anthropic", True)
    assert "the next attempt goes to openai" in second.error
    # the switch does not wait out the failed provider's retry-after (30 s)
    assert second.not_before == second.at
    (reply,) = of(GenerationCompleted, committed)
    assert (reply.provider, reply.model, reply.attempt) == ("openai", "gpt-test", 3)
    assert reply.response_id == "chatcmpl-fake-0001"
    assert len(fake_a.requests) == 2
    assert len(fake_oa.requests) == 1
    lines = [text for _, _, text in render(stored)]
    assert any("model attempt 2 on anthropic failed" in line for line in lines)
    assert any("model (openai gpt-test) replied" in line for line in lines)


async def test_an_exhausted_primary_is_left_at_once(
    fake_a: fa.FakeAnthropic, fake_oa: fo.FakeOpenAI, chain: FallbackProvider, log_dir: Path
) -> None:
    fake_a.script(
        fa.HttpError(
            status=429,
            type="rate_limit_error",
            message="You have reached your spend limit.",
            error_code="enforced_spend_limit_reached",
        )
    )
    fake_oa.script(fo.Reply(content=[fo.Text("Still here.")]))
    async with runtime(log_dir, chain) as rt:
        sid, outcome = await ask(rt, "Go.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    (pending,) = of(RetryPending, committed)  # one failure was enough: after=2 not waited for
    assert (pending.provider, pending.fallback) == ("anthropic", True)
    assert "spend limit" in pending.error
    assert "anthropic is exhausted" in pending.error
    (reply,) = of(GenerationCompleted, committed)
    assert (reply.provider, reply.attempt) == ("openai", 2)


async def test_a_fatal_error_fails_the_run_without_falling_back(
    fake_a: fa.FakeAnthropic, fake_oa: fo.FakeOpenAI, chain: FallbackProvider, log_dir: Path
) -> None:
    fake_a.script(
        fa.HttpError(status=400, type="invalid_request_error", message="prompt is too long")
    )
    async with runtime(log_dir, chain) as rt:
        _, outcome = await ask(rt, "Go.")
    assert outcome.status == "failed"
    assert "prompt is too long" in outcome.reason
    assert fake_oa.requests == []


async def test_the_last_provider_keeps_the_turn_until_attempts_run_out(
    fake_a: fa.FakeAnthropic, fake_oa: fo.FakeOpenAI, chain: FallbackProvider, log_dir: Path
) -> None:
    fake_a.set_default(fa.HttpError(status=529, type="overloaded_error", message="Overloaded"))
    fake_oa.set_default(fo.HttpError(status=503, message="The engine is currently overloaded"))
    async with runtime(log_dir, chain, max_model_attempts=5) as rt:
        sid, outcome = await ask(rt, "Go.")
        committed = await records(rt, sid)
    assert outcome.status == "failed"
    assert "5 attempts" in outcome.reason
    assert [(p.provider, p.fallback) for p in of(RetryPending, committed)] == [
        ("anthropic", False),
        ("anthropic", True),
        ("openai", False),
        ("openai", False),
    ]
    assert (len(fake_a.requests), len(fake_oa.requests)) == (2, 3)


async def test_a_conversation_started_on_anthropic_continues_on_openai_whole(
    fake_a: fa.FakeAnthropic, fake_oa: fo.FakeOpenAI, log_dir: Path
) -> None:
    """The conformance of the provider-neutral conversation: tool calls and results made
    with one vendor arrive complete at the other after a fallback, and the fake OpenAI
    server (like the API) refuses a request whose calls and results do not pair up."""
    fake_a.script(
        fa.Reply(
            content=[
                fa.Thinking("Two things to do."),
                fa.Text("Adding, and deploying."),
                fa.ToolUse("toolu_1", "add", {"a": 2, "b": 3}),
                fa.ToolUse("toolu_2", "deploy", {"service": "api"}),
            ]
        ),
        OVERLOADED,
        fa.Reply(content=[fa.Text("Back on the primary for a new input.")]),
    )
    fake_oa.script(
        fo.Reply(
            content=[
                fo.Text("Looking alpha up."),
                fo.ToolCall("call_3", "lookup", {"key": "alpha"}),
            ]
        ),
        fo.Reply(content=[fo.Text("5; the deploy failed; alpha is the first letter.")]),
    )
    task = "Add 2 and 3, deploy api, look up alpha."
    chain = chain_of(fake_a.url, fake_oa.url, after=1)
    async with chain as provider, runtime(log_dir, provider) as rt:
        sid, outcome = await ask(rt, task, system="Be exact.")
        await rt.submit(sid, "Anything else?")
        second = await rt.wait_idle(sid)
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    assert outcome.final_text == "5; the deploy failed; alpha is the first letter."
    assert second is not None and second.final_text == "Back on the primary for a new input."
    replies = of(GenerationCompleted, committed)
    assert [r.provider for r in replies] == ["anthropic", "openai", "openai", "anthropic"]
    assert [r.attempt for r in replies] == [1, 2, 1, 1]
    assert len(fake_a.requests) == 3  # turn 3 of the first input went straight to openai

    history = [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": task},
        {
            "role": "assistant",
            "content": "Adding, and deploying.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "deploy", "arguments": '{"service": "api"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
        {
            "role": "tool",
            "tool_call_id": "toolu_2",
            "content": "Error: The tool raised RuntimeError: cluster for api is unreachable",
        },
    ]
    first, last = (r.body["messages"] for r in fake_oa.requests)
    assert first == history
    assert last == [
        *history,
        {
            "role": "assistant",
            "content": "Looking alpha up.",
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "alpha"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "first letter"},
    ]
    # back on the primary, the turns OpenAI answered arrive there whole as well
    messages = fa.sent_messages(fake_a.requests[2].body)
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages[3]["content"] == [
        {"type": "text", "text": "Looking alpha up."},
        {"type": "tool_use", "id": "call_3", "name": "lookup", "input": {"key": "alpha"}},
    ]
    assert messages[4]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_3", "content": "first letter"}
    ]
    assert of(RunFinished, committed)[-1].status == "completed"
