"""The default observer and the application's global providers, installed late.

OpenTelemetry lets a process install its global providers once, so the check runs in
a fresh interpreter: a runtime whose ``Tracing`` uses the global providers (what
``telemetry="auto"`` gives) and started before any provider
exists does no tracing work (nothing kept for a live run), and once the application
installs its tracer and meter providers, the observer finds them within a second and
the next run of the same runtime is traced and measured, its ``RunStarted`` stamped
with its span's context.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.observability.test_light import python

SCRIPT = """
import json, sys
import trio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import perdure
from perdure.observability.tracing import Tracing
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

started = trio.Event()
gate = trio.Event()

@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def look(ctx: perdure.ToolContext, query: str) -> str:
    '''Look something up.'''
    started.set()
    await gate.wait()
    return "found " + query

async def main():
    script = [Reply(text="checking", tool_uses=[ToolUse("look", {"query": "q"})]),
              Reply(text="done")]
    provider = ScriptedProvider(script * 2)
    tracing = Tracing()  # what telemetry="auto" gives: the global providers
    out = {}
    async with perdure.open_runtime(
        sys.argv[1], provider=provider, tools=[look], telemetry=tracing
    ) as rt:
        out["recording_before"] = tracing.recording()
        first = await rt.create_session("before")
        await rt.submit(first, "go")
        with trio.fail_after(10):
            await started.wait()  # the run and its tool call are live
        out["kept_while_unset"] = len(tracing._runs) + len(tracing._attempts)
        gate.set()
        await rt.wait_idle(first)

        spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(tracer_provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        # Looked for at most once a second: the next look finds them.
        with trio.fail_after(5):
            while not tracing.recording():
                await trio.sleep(0.05)
        out["recording_after"] = tracing.recording()

        second = await rt.create_session("after")
        await rt.submit(second, "go")
        await rt.wait_idle(second)
        stamps = {}
        for sid in (first, second):
            # The live read model and the log agree on each run's trace context.
            live = await rt.state(sid, lambda s: [r.traceparent for r in s.run_views()])
            logged = [run.traceparent for run in (await rt._fold(sid)).runs.values()]
            assert live == logged, (live, logged)
            stamps[sid] = [bool(t) for t in live]
    out["spans"] = sorted(
        (s.name, s.attributes.get("gen_ai.conversation.id", "")) for s in spans.get_finished_spans()
    )
    out["stamped"] = stamps
    data = reader.get_metrics_data()
    out["metrics"] = sorted(
        m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    ) if data is not None else []
    print(json.dumps(out))

trio.run(main)
"""


def test_no_work_until_the_application_installs_providers_then_traced(tmp_path: Path) -> None:
    out = json.loads(python(SCRIPT, str(tmp_path / "log")))
    assert out["recording_before"] is False
    assert out["kept_while_unset"] == 0  # no span, no attempt held for the live run
    assert out["recording_after"] is True
    assert out["stamped"] == {"before": [False], "after": [True]}
    names = {name for name, _ in out["spans"]}
    assert {"invoke_agent", "execute_tool look"} <= names
    assert any(name.startswith("chat") for name in names)
    # Only the run after the providers were installed left spans.
    assert {sid for _, sid in out["spans"] if sid} == {"after"}
    assert "gen_ai.client.token.usage" in out["metrics"]
    assert "gen_ai.client.operation.duration" in out["metrics"]
