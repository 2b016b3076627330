"""GenAI spans and metrics from a real runtime, read with the OpenTelemetry SDK's in-memory readers.

The providers are the SDK's, handed to ``Tracing`` explicitly: no global provider is
ever installed (the test checks that too).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from trio.testing import MockClock

import perdure
from perdure.observability.tracing import Tracing
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import RunStarted, ToolCompleted
from tests.support.checker import read_log
from tests.support.deterministic import Where
from tests.support.fold import fold_of


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def look(ctx: perdure.ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED)
async def book(ctx: perdure.ToolContext, item: str) -> str:
    """Book an item."""
    return f"booked {item}"


SCRIPT = [
    Reply(
        text="checking",
        fail_attempts=1,  # the first attempt is refused (retryable): one model retry
        tool_uses=[ToolUse("look", {"query": "q"}), ToolUse("book", {"item": "i"})],
    ),
    Reply(text="all done"),
]


class Telemetry:
    def __init__(self, capture_content: bool = False, batch_delay: float = 0.5) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metrics])
        self.tracing = Tracing(
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            capture_content=capture_content,
            batch_delay=batch_delay,
        )

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        if data is None:  # nothing recorded yet
            return []
        return [
            point
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


async def run_once(log_dir: Path, telemetry: Telemetry, **submit: Any) -> str:
    async with perdure.open_runtime(
        log_dir,
        provider=ScriptedProvider(SCRIPT),
        tools=[look, book],
        retry_base=0.01,
        telemetry=telemetry.tracing,
    ) as rt:
        sid = await rt.create_session("s1")
        await rt.submit(sid, "go", request_id="r1", **submit)
        outcome = await rt.wait_idle(sid)
        assert outcome is not None
        assert outcome.status == "completed"
    return sid


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


async def test_a_run_is_an_invoke_agent_span_with_chat_and_tool_children(log_dir: Path) -> None:
    telemetry = Telemetry()
    sid = await run_once(log_dir, telemetry)
    spans = by_name(telemetry.finished())
    assert set(spans) == {
        "invoke_agent",
        "chat scripted",
        "chat",
        "execute_tool look",
        "execute_tool book",
    }, sorted(spans)
    (run,) = spans["invoke_agent"]
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.conversation.id"] == sid
    assert run.attributes["perdure.run.status"] == "completed"
    # Two successful replies (10 in / 5 out each) and one refused attempt (10 in).
    assert run.attributes["gen_ai.usage.output_tokens"] == 10
    assert run.parent is None
    run_ctx = run.get_span_context()
    assert run_ctx is not None

    # The recorded trace context is this span's.
    (started,) = [c.record for c in read_log(log_dir) if isinstance(c.record, RunStarted)]
    assert started.traceparent.startswith(f"00-{run_ctx.trace_id:032x}-{run_ctx.span_id:016x}-")

    # One model retry: a failed attempt (error.type, status ERROR), then two replies.
    (failed,) = spans["chat"]
    assert failed.kind == SpanKind.CLIENT
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["perdure.attempt"] == 1
    assert failed.attributes["error.type"] == "_OTHER"
    assert failed.attributes["gen_ai.provider.name"] == "scripted"
    replies = sorted(spans["chat scripted"], key=lambda s: s.start_time or 0)
    assert [s.attributes["perdure.attempt"] for s in replies if s.attributes] == [2, 1]
    first = replies[0].attributes
    assert first is not None
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "scripted"
    assert first["gen_ai.response.model"] == "scripted"
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["gen_ai.usage.input_tokens"] == 10
    assert first["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.output.messages" not in first, "content is captured only on opt-in"
    # The retry is an event of the run's span.
    assert [e.name for e in run.events] == ["gen_ai.retry"]

    # Two tool calls of one turn, each an execute_tool span under the run.
    tools = spans["execute_tool look"] + spans["execute_tool book"]
    for span in tools:
        assert span.parent is not None
        assert span.parent.span_id == run_ctx.span_id
        assert span.context is not None
        assert span.context.trace_id == run_ctx.trace_id
    attrs = {s.name: s.attributes for s in tools}
    look_attrs, book_attrs = attrs["execute_tool look"], attrs["execute_tool book"]
    assert look_attrs is not None
    assert book_attrs is not None
    assert look_attrs["gen_ai.tool.name"] == "look"
    assert look_attrs["gen_ai.tool.call.id"] == "toolu_001_1"
    assert look_attrs["perdure.replay_policy"] == "safe"
    assert book_attrs["perdure.replay_policy"] == "keyed"
    assert look_attrs["perdure.attempt"] == book_attrs["perdure.attempt"] == 1
    assert look_attrs["perdure.outcome"] == book_attrs["perdure.outcome"] == "ok"
    # Each of the children lies within the run.
    for span in tools + replies + [failed]:
        assert run.start_time is not None
        assert run.end_time is not None
        assert span.start_time is not None
        assert span.end_time is not None
        assert run.start_time <= span.start_time <= span.end_time <= run.end_time

    # No global provider was installed.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    assert len([c for c in read_log(log_dir) if isinstance(c.record, ToolCompleted)]) == 2


async def test_genai_client_metrics(log_dir: Path) -> None:
    telemetry = Telemetry()
    await run_once(log_dir, telemetry)
    tokens = telemetry.points("gen_ai.client.token.usage")
    by_type: dict[str, int] = {}
    for point in tokens:
        kind = point.attributes["gen_ai.token.type"]
        by_type[kind] = by_type.get(kind, 0) + int(point.sum)
        assert point.attributes["gen_ai.operation.name"] == "chat"
        assert point.attributes["gen_ai.provider.name"] == "scripted"
    assert by_type == {"input": 30, "output": 10}
    durations = telemetry.points("gen_ai.client.operation.duration")
    counts = {p.attributes.get("error.type"): p.count for p in durations}
    assert counts == {None: 2, "_OTHER": 1}


async def test_content_is_captured_only_when_asked(log_dir: Path) -> None:
    telemetry = Telemetry(capture_content=True)
    await run_once(log_dir, telemetry)
    spans = by_name(telemetry.finished())
    (run,) = spans["invoke_agent"]
    assert run.attributes is not None
    inputs = json.loads(str(run.attributes["gen_ai.input.messages"]))
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": "go"}]}]
    replies = [s.attributes for s in spans["chat scripted"] if s.attributes]
    outputs = [json.loads(str(a["gen_ai.output.messages"])) for a in replies]
    assert any(o[0]["parts"][0]["content"] == "all done" for o in outputs)
    (look_span,) = spans["execute_tool look"]
    assert look_span.attributes is not None
    assert look_span.attributes["gen_ai.tool.call.result"] == "found q"
    assert json.loads(str(look_span.attributes["gen_ai.tool.call.arguments"])) == {"query": "q"}


async def test_a_callers_traceparent_makes_the_run_its_child(log_dir: Path) -> None:
    telemetry = Telemetry()
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await run_once(log_dir, telemetry, traceparent=caller)
    (run,) = by_name(telemetry.finished())["invoke_agent"]
    assert run.parent is not None
    assert run.parent.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert run.parent.span_id == 0xB7AD6B7169203331


async def test_the_callers_current_span_is_the_parent(log_dir: Path) -> None:
    telemetry = Telemetry()
    tracer = telemetry.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("request") as outer:
        await run_once(log_dir, telemetry)
    (run,) = by_name(telemetry.finished())["invoke_agent"]
    assert run.parent is not None
    assert run.parent.span_id == outer.get_span_context().span_id


async def test_a_malformed_traceparent_is_refused_and_nothing_is_recorded(log_dir: Path) -> None:
    telemetry = Telemetry()
    async with perdure.open_runtime(
        log_dir, provider=ScriptedProvider(SCRIPT), telemetry=telemetry.tracing
    ) as rt:
        sid = await rt.create_session("s1")
        with pytest.raises(ValueError, match="traceparent"):
            await rt.submit(sid, "go", traceparent="00-nonsense")
        assert (await fold_of(rt, sid)).submissions == {}


async def test_sessions_with_the_same_run_ids_keep_their_own_spans(log_dir: Path) -> None:
    telemetry = Telemetry()
    async with perdure.open_runtime(
        log_dir,
        provider=ScriptedProvider(SCRIPT),
        tools=[look, book],
        retry_base=0.01,
        telemetry=telemetry.tracing,
    ) as rt:
        for sid in ("a", "b"):
            await rt.create_session(sid)
            await rt.submit(sid, "go", request_id="r1")
        for sid in ("a", "b"):
            outcome = await rt.wait_idle(sid)
            assert outcome is not None
            assert outcome.status == "completed"
    spans = telemetry.finished()
    runs = {
        s.attributes["gen_ai.conversation.id"]: s
        for s in spans
        if s.name == "invoke_agent" and s.attributes
    }
    assert set(runs) == {"a", "b"}
    assert runs["a"].attributes is not None
    assert runs["b"].attributes is not None
    assert runs["a"].attributes["perdure.run.id"] == runs["b"].attributes["perdure.run.id"]
    children = [s for s in spans if s.name != "invoke_agent"]
    assert len(children) == 2 * 5  # per session: 3 model attempts, 2 tool calls
    for span in children:
        assert span.attributes is not None
        assert span.parent is not None
        own = runs[str(span.attributes["gen_ai.conversation.id"])].get_span_context()
        assert own is not None
        assert span.parent.span_id == own.span_id


async def test_a_cancelled_run_forgets_its_unanswered_attempt_and_only_its_own(
    log_dir: Path,
) -> None:
    telemetry = Telemetry()
    slow = [Reply(text="never seen", delay=60.0)]
    async with perdure.open_runtime(
        log_dir, provider=ScriptedProvider(slow), tools=[look], telemetry=telemetry.tracing
    ) as rt:
        for sid in ("a", "b"):  # the same run and generation ids in both sessions
            await rt.create_session(sid)
            await rt.submit(sid, "go", request_id="r1")
        with trio.fail_after(10):
            while len(telemetry.tracing._attempts) < 2:  # noqa: ASYNC110 (both calls started)
                await trio.sleep(0.01)
        await rt.cancel("a")
        outcome = await rt.wait_idle("a")
        assert outcome is not None and outcome.status == "cancelled"
        # Nothing of "a" is held for an answer that will never come; "b" keeps its own.
        assert [key[0] for key in telemetry.tracing._attempts] == ["b"]
        await rt.cancel("b")
        await rt.wait_idle("b")
        assert telemetry.tracing._attempts == {}


# -- batches: when the attempts' spans reach the SDK ---------------------------------------


class Gate:
    """A tool that holds its run open until the test lets it finish."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.release = trio.Event()

    def tool(self) -> perdure.Tool:
        @perdure.tool(replay=perdure.ReplayPolicy.SAFE)
        async def hold(ctx: perdure.ToolContext) -> str:
            """Wait until released."""
            self.started.set()
            await self.release.wait()
            return "released"

        return hold


HELD = [Reply(text="holding", tool_uses=[ToolUse("hold", {})]), Reply(text="done")]


def names(telemetry: Telemetry) -> list[str]:
    return sorted(span.name for span in telemetry.finished())


@asynccontextmanager
async def holding(
    where: Where, batch_delay: float, **options: Any
) -> AsyncIterator[tuple[perdure.Runtime, str, Telemetry, Gate]]:
    """A runtime whose one run is held inside its tool call (its model reply committed)."""
    telemetry, gate = Telemetry(batch_delay=batch_delay), Gate()
    async with perdure.open_runtime(
        where.open(),
        provider=ScriptedProvider(HELD),
        tools=[gate.tool()],
        telemetry=telemetry.tracing,
        **where.options(**options),
    ) as rt:
        sid = await rt.create_session("s1")
        await rt.submit(sid, "go", request_id="r1")
        await gate.started.wait()
        yield rt, sid, telemetry, gate


async def test_an_attempt_reaches_the_sdk_within_batch_delay_while_its_run_goes_on(
    where: Where, clock: MockClock
) -> None:
    async with holding(where, 2.0) as (rt, sid, telemetry, gate):
        # The model's reply is committed; its span waits for its batch.
        began = trio.current_time()
        assert names(telemetry) == []
        assert telemetry.points("gen_ai.client.operation.duration") == []
        # Nothing commits meanwhile: the observer's background task hands it over.
        with trio.fail_after(30):
            while not names(telemetry):  # noqa: ASYNC110 - the SDK exporter has no event to wait on
                await trio.sleep(0.05)
        waited = trio.current_time() - began
        if where.virtual:  # exact: no time passes in virtual time but the sleeps'
            assert 1.95 <= waited <= 2.05, waited
        else:
            assert waited >= 1.5, waited
        assert names(telemetry) == ["chat scripted"]
        (duration,) = telemetry.points("gen_ai.client.operation.duration")
        assert duration.count == 1
        gate.release.set()
        outcome = await rt.wait_idle(sid)
        assert outcome is not None and outcome.status == "completed"
        # The run's end hands over the rest before the run's own span ends.
        assert names(telemetry) == [
            "chat scripted",
            "chat scripted",
            "execute_tool hold",
            "invoke_agent",
        ]


async def test_batch_delay_zero_hands_each_attempt_over_as_it_commits(
    where: Where, clock: MockClock
) -> None:
    async with holding(where, 0) as (rt, sid, telemetry, gate):
        assert names(telemetry) == ["chat scripted"]
        gate.release.set()
        await rt.wait_idle(sid)


async def test_a_runtime_that_stops_hands_over_what_its_batch_still_holds(
    where: Where, clock: MockClock
) -> None:
    async with holding(where, 60.0, shutdown_grace=0.1) as (_, _, telemetry, _):
        assert names(telemetry) == []
    # The tool was still running: its attempt has no end to report, the model's has.
    assert "chat scripted" in names(telemetry)
    assert "invoke_agent" in names(telemetry)  # ended by close(), to be resumed


async def test_a_failing_sdk_call_in_a_batch_is_logged_and_the_rest_still_goes_out(
    log_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    telemetry = Telemetry(batch_delay=60.0)
    real = telemetry.tracing._span
    calls = 0

    def first_fails(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("exporter on fire")
        real(*args)

    monkeypatch.setattr(telemetry.tracing, "_span", first_fails)
    await run_once(log_dir, telemetry)
    assert calls == 5  # three model attempts and two tool calls
    spans = by_name(telemetry.finished())
    assert len(spans["chat scripted"]) + len(spans.get("chat", [])) == 2  # one was lost
    assert len(spans["execute_tool look"]) == len(spans["execute_tool book"]) == 1
    assert any("exporter on fire" in r.exc_text for r in caplog.records if r.exc_text)


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "0.5"])
def test_batch_delay_must_be_seconds(bad: Any) -> None:
    with pytest.raises(ValueError, match="batch_delay"):
        Tracing(batch_delay=bad)


def test_metric_attributes_are_shared_per_combination_and_their_cache_is_bounded() -> None:
    from perdure.observability.tracing import METRIC_ATTRIBUTE_SETS

    tracing = Tracing(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))
    duration, inputs, outputs = tracing._metric_attributes("acme", "m1", "m1-0613", "")
    asked = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "acme",
        "gen_ai.request.model": "m1",
    }
    assert duration == {**asked, "gen_ai.response.model": "m1-0613"}
    assert inputs == {**duration, "gen_ai.token.type": "input"}
    assert outputs == {**duration, "gen_ai.token.type": "output"}
    # The same combination: the very same dicts (the SDK only reads them).
    assert tracing._metric_attributes("acme", "m1", "m1-0613", "")[0] is duration
    failed, failed_inputs, _ = tracing._metric_attributes("acme", "m1", "", "RateLimited")
    assert failed == {**asked, "error.type": "RateLimited"}  # no response: no response model
    assert "error.type" not in failed_inputs  # token counts carry no error type
    # Models come from outside: past the bound, sets are still right, only not kept.
    for i in range(2 * METRIC_ATTRIBUTE_SETS):
        got, _, _ = tracing._metric_attributes("acme", f"model-{i}", "", "")
        assert got["gen_ai.request.model"] == f"model-{i}"
    assert len(tracing._metric_attrs) == METRIC_ATTRIBUTE_SETS
