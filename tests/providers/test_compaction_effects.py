"""What a summary may never drop, end to end: through the real Anthropic SDK, the
request the model gets after a compaction still states a call whose outcome is unknown
(its arguments and its UNKNOWN result), and a call waiting for approval stays verbatim
with its turn until it is decided. The test fails if either is summarised away.
An export of the compacted session, imported into another log, reads the same.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path

import pytest
import trio

import perdure
from perdure import ReplayPolicy
from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.base import ToolUseBlock
from perdure.storage.records import ContextCompacted
from tests.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text, ToolUse, sent_messages
from tests.providers._agent import of, records, runtime


async def until(rt: perdure.Runtime, sid: str, kind: str, count: int) -> None:
    """Follow the session's records (from its start) until the ``count``-th ``kind``."""
    seen = 0
    with trio.fail_after(30):
        async with aclosing(rt.events(sid)) as events:
            async for event in events:
                if event.record is not None and type(event.record).__name__ == kind:
                    seen += 1
                    if seen == count:
                        return


@perdure.tool(replay=ReplayPolicy.NEVER)
async def wire(amount: int, to: str) -> str:
    """Wire money (the bank's answer never comes back here)."""
    raise perdure.OutcomeUnknown("the bank did not answer")


@perdure.tool(replay=ReplayPolicy.NEVER, requires_approval=True)
async def deploy(target: str) -> str:
    """Deploy (needs approval)."""
    return f"deployed {target}"


async def test_an_unknown_outcome_and_a_pending_approval_survive_compaction(
    fake: FakeAnthropic, provider: AnthropicProvider, log_dir: Path, tmp_path: Path
) -> None:
    fake.script(
        Reply(content=[Text("Wiring."), ToolUse("t1", "wire", {"amount": 700, "to": "ACME"})]),
        Reply(content=[Text("The wire may have gone.")], usage=FakeUsage(input_tokens=900)),
        Reply(content=[Text("S1: a wire was attempted.")]),  # the first summary
        Reply(content=[Text("Deploying."), ToolUse("t2", "deploy", {"target": "prod"})]),
        Reply(content=[Text("Deployed.")], usage=FakeUsage(input_tokens=900)),
        Reply(content=[Text("S2: a deploy.")]),  # the second summary
        Reply(content=[Text("The wire is still to be checked.")]),
    )
    policy = perdure.CompactionPolicy(window=1000, keep_recent=0)
    async with runtime(log_dir, provider, compaction=policy, tools=[wire, deploy]) as rt:
        sid = await rt.create_session(system="You move money.")
        await rt.submit(sid, "Wire 700 to ACME.")
        await rt.wait_idle(sid)
        await rt.submit(sid, "Now deploy.")
        await until(rt, sid, "ToolAwaitingApproval", 1)
        # the waiting turn is not settled: there is nothing a summary may take
        with pytest.raises(perdure.Refused, match="nothing to compact"):
            await rt.compact_context(sid)
        waiting = await rt.transcript(sid)
        await rt.approve(sid, "t2", approved=True)
        await rt.wait_idle(sid)
        await rt.submit(sid, "Anything left?")
        await rt.wait_idle(sid)
        committed = await records(rt, sid)
        seen = await rt.transcript(sid)
        exported = await rt.export_session(sid)
    summaries = of(ContextCompacted, committed)
    assert [(c.start, c.end, c.summary) for c in summaries] == [
        (0, 4, "S1: a wire was attempted."),
        (4, 7, "S2: a deploy."),
    ]
    assert ToolUseBlock("t2", "deploy", {"target": "prod"}) in [
        b for m in waiting for b in m.content
    ], "a call waiting for approval stays verbatim"
    # every request after a summary states the unknown wire: its arguments, UNKNOWN
    after_first = sent_messages(fake.requests[3].body)
    last = sent_messages(fake.requests[-1].body)
    for request, summary in ((after_first, "S1: a wire"), (last, "S2: a deploy.")):
        head = request[0]["content"][0]["text"]
        assert summary in head
        assert "wire (t1)" in head and '"amount": 700' in head and "UNKNOWN" in head, head
    assert "Wiring." not in json.dumps(last), "the wire's turn itself was summarised"
    # export, import into another log: the same view
    async with runtime(tmp_path / "other", provider) as other:
        copied = await other.import_session(exported)
        assert await other.transcript(copied) == seen
