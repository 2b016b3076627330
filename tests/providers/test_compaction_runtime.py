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
from perdure.actors.conversation import SUMMARY_SYSTEM
from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.openai import OpenAIProvider
from perdure.storage.records import CompactionStarted, ContextCompacted, GenerationCompleted
from tests import fake_openai as oa
from tests.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text, sent_messages
from tests.fake_openai import FakeOpenAI
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
    async with runtime(log_dir, provider, compaction=POLICY) as rt:
        sid = await rt.create_session(system="Be brief.")
        await rt.submit(sid, "What is the capital of France, the country in Europe?")
        await rt.wait_idle(sid)
        await rt.submit(sid, "How many live there?")
        outcome = await rt.wait_idle(sid)
        committed = await records(rt, sid)
        seen = await rt.transcript(sid)
        whole = await rt.transcript(sid, history=True)
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


async def test_on_demand_while_idle_and_the_next_turn_reads_the_summary(
    fake_oa: FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path
) -> None:
    fake_oa.script(
        oa.Reply(content=[oa.Text("First answer with details.")]),
        oa.Reply(content=[oa.Text("Second answer.")]),
        oa.Reply(content=[oa.Text("SUM")]),
        oa.Reply(content=[oa.Text("Third answer.")]),
    )
    policy = perdure.CompactionPolicy(keep_recent=1, auto=False)
    async with runtime(log_dir, oa_provider, compaction=policy) as rt:
        sid = await rt.create_session()
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
