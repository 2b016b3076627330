"""Context compaction inside the runtime, through the real SDKs and the fake vendors.

What the vendor receives is the proof: the summary's own request (the covered turns
as text, no tools), then the next turn's request with the summary in place of what
it covers and the recent turns verbatim. On demand (``compact_context``), and the
transcript both as the model sees it and as the log keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perdure
from perdure import timeline
from perdure.actors.conversation import SUMMARY_SYSTEM
from perdure.observability.metrics import RuntimeMetrics
from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.openai import OpenAIProvider
from perdure.storage.records import (
    Committed,
    CompactionStarted,
    ContextCompacted,
    GenerationCompleted,
    RunStarted,
)
from tests import fake_openai as oa
from tests.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text, sent_messages
from tests.fake_openai import FakeOpenAI
from tests.observability.test_tracing import Telemetry, by_name
from tests.providers._agent import of, records, runtime

POLICY = perdure.CompactionPolicy(window=1000, keep_recent=2)


async def test_a_full_context_is_summarised_before_the_next_turn(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        Reply(content=[Text("Paris is the capital.")], usage=FakeUsage(input_tokens=900)),
        Reply(content=[Text("S: capital of France asked; Paris.")]),
        Reply(content=[Text("About 2.1 million.")], usage=FakeUsage(input_tokens=120)),
    )
    telemetry = Telemetry(batch_delay=0)
    async with runtime(log_dir, provider, compaction=POLICY, telemetry=telemetry.tracing) as rt:
        sid = await rt.create_session(system="Be brief.")
        await rt.submit(sid, "What is the capital of France, the country in Europe?")
        await rt.wait_idle(sid)
        await rt.submit(sid, "How many live there?")
        outcome = await rt.wait_idle(sid)
        committed = await records(rt, sid)
        seen = await rt.transcript(sid)
        whole = await rt.transcript(sid, history=True)
        first_run = of(RunStarted, committed)[0].run_id
        before = await rt.fork(sid, at=first_run)
        after = await rt.fork(sid)
        forked_before = await rt.transcript(before.session_id)
        forked_after = await rt.transcript(after.session_id)
    assert outcome is not None and outcome.final_text == "About 2.1 million."
    first, summary, after = (r.body for r in fake.requests)
    assert summary["system"][0]["text"] == SUMMARY_SYSTEM
    assert not summary.get("tools")
    asked = json.dumps(sent_messages(summary))
    assert "capital of France, the country in Europe" in asked
    assert "Paris is the capital." not in asked, "the last two items stay verbatim"
    assert after["system"][0]["text"] == "Be brief."
    sent = sent_messages(after)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert "S: capital of France asked; Paris." in sent[0]["content"][0]["text"]
    assert "the country in Europe" not in json.dumps(sent), "summarised away"
    assert sent[1]["content"] == [{"type": "text", "text": "Paris is the capital."}]
    assert sent[2]["content"] == [{"type": "text", "text": "How many live there?"}]
    (done,) = of(ContextCompacted, committed)
    assert (done.start, done.end, done.tokens_before) == (0, 1, 900)
    assert 0 < done.tokens_after < 900 and done.model == first["model"]
    started = of(CompactionStarted, committed)[0]
    assert committed.index(started) < committed.index(done)
    gens = of(GenerationCompleted, committed)
    assert committed.index(done) < committed.index(gens[-1])
    assert "S: capital of France" in str(seen[0].content[0])
    assert len(seen) == 4 and len(whole) == 4
    assert "the country in Europe" in str(whole[0].content[0]), "the history keeps all"
    assert forked_after == seen, "a fork after the compaction point sees the summary"
    assert forked_before == whole[:2], "a fork before it sees the turns themselves"
    # telemetry: a span for the summary call, under the run it happened in; a metric
    (span,) = by_name(telemetry.finished())["compact_context"]
    assert span.attributes is not None
    assert span.attributes["perdure.compaction.id"] == done.compaction_id
    assert span.attributes["perdure.compaction.tokens_before"] == 900
    assert span.parent is not None
    runs = [s for s in telemetry.finished() if s.name == "invoke_agent"]
    assert span.parent.span_id == runs[-1].context.span_id
    lines = [
        text for _, _, text in timeline.render(Committed(n, r) for n, r in enumerate(committed, 1))
    ]
    assert any("summarising items 0-1" in line for line in lines)
    assert any("context compacted" in line and "first 1 items" in line for line in lines)
    metrics = RuntimeMetrics()
    metrics.on_commit([Committed(n, r) for n, r in enumerate(committed, 1)], 0.0)
    assert metrics.compactions.labels("compacted")._value.get() == 1


async def test_on_demand_while_idle_and_the_next_turn_reads_the_summary(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path
) -> None:
    fake_oa.script(
        oa.Reply(content=[oa.Text("First answer with details.")]),
        oa.Reply(content=[oa.Text("Second answer.")]),
        oa.Reply(content=[oa.Text("SUM")]),
        oa.Reply(content=[oa.Text("Third answer.")]),
    )
    # The runtime's policy would compact after every reply; the session's own wins.
    eager = perdure.CompactionPolicy(window=10, keep_recent=0)
    own = perdure.CompactionPolicy(keep_recent=1, auto=False)
    async with runtime(log_dir, oa_provider, compaction=eager) as rt:
        sid = await rt.create_session(compaction=own)
        for text in ("first question", "second question"):
            await rt.submit(sid, text)
            await rt.wait_idle(sid)
        done = await rt.compact_context(sid, request_id="k-1")
        again = await rt.compact_context(sid, request_id="k-1")
        await rt.wait_idle(sid)
        with pytest.raises(perdure.Refused, match="nothing to compact"):
            await rt.compact_context(sid)
        await rt.submit(sid, "third question")
        await rt.wait_idle(sid)
        committed = await records(rt, sid)
    assert again.duplicate and again.ref == done.ref
    (compacted,) = of(ContextCompacted, committed)
    assert compacted.compaction_id == done.ref and (compacted.start, compacted.end) == (0, 3)
    last = json.dumps(fake_oa.requests[-1].body)
    assert "SUM" in last and "Second answer." in last and "third question" in last
    assert "first question" not in last and "second question" not in last
