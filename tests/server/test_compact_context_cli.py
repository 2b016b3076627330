"""``perdure compact-context`` on a log no process owns: recorded there, made by the next
owner at start-up (a compaction in progress is unfinished work)."""

from __future__ import annotations

from pathlib import Path

import trio

import perdure
from perdure.actors.conversation import SUMMARY_SYSTEM
from perdure.providers.scripted import Reply, ScriptedProvider
from perdure.storage.records import CompactionStarted, ContextCompacted
from tests.server.test_person_commands import person, said


async def test_perdure_compact_context_on_a_log_no_process_owns(tmp_path: Path) -> None:
    log = tmp_path / "log"
    answers = ScriptedProvider([Reply(text="first answer"), Reply(text="second answer")])
    own = perdure.CompactionPolicy(keep_recent=1, auto=False)
    async with perdure.open_runtime(log, provider=answers) as rt:
        await rt.create_session("s", compaction=own)
        for n, text in enumerate(("first question", "second question")):
            await rt.submit("s", text, request_id=f"q{n}")
            await rt.wait_idle("s")

    done = await trio.to_thread.run_sync(lambda: person("compact-context", "s", log=log))
    said(done, 0, "session s: context compaction s.compaction1 started", "the next process")
    again = await trio.to_thread.run_sync(lambda: person("compact-context", "s", log=log))
    said(again, 0, "context compaction s.compaction1 is already in progress")

    summaries = ScriptedProvider([], by_system={SUMMARY_SYSTEM: [Reply(text="Two questions.")]})
    async with perdure.open_runtime(log, provider=summaries) as rt:
        assert rt.recovered_sessions == ["s"], "taken up at start-up"
        with trio.fail_after(30):
            await rt.wait_idle("s")
        stored = [c.record for c in await rt._journal.read_session("s")]
        seen = await rt.transcript("s")
    assert [type(r) for r in stored].count(CompactionStarted) == 1
    (compacted,) = [r for r in stored if isinstance(r, ContextCompacted)]
    assert (compacted.start, compacted.end, compacted.summary) == (0, 3, "Two questions.")
    assert "Two questions." in str(seen[0].content[0])
    assert len(seen) == 2 and "second answer" in str(seen[1].content[0])
