"""Context compaction from the outside: ``perdure compact-context`` on a log no process
owns (recorded there, made by the next owner at start-up: a compaction in progress is
unfinished work), and the daemon (``perdure serve`` with a context window, the route,
the summary's ``context``, the transcript with and without its history)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

import perdure
from perdure.actors.conversation import SUMMARY_SYSTEM
from perdure.providers.scripted import Reply, ScriptedProvider
from perdure.storage.records import CompactionStarted, ContextCompacted
from tests.server.test_person_commands import person, said
from tests.support.daemon import Daemon, idle, wait_for


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


def test_the_daemon_compacts_automatically_and_on_demand(tmp_path: Path) -> None:
    """``perdure serve --context-window --keep-recent``: a full context is summarised
    before the next turn; ``POST .../compact-context`` starts one on demand; the summary
    says so, and ``GET .../transcript?history=1`` still has every message."""
    daemon = Daemon(tmp_path, [], extra_args=("--context-window", "1000", "--keep-recent", "1"))
    # The scripted model answers by the number of model turns it is sent; a summary has
    # its own script (its system prompt): 900 input tokens fill the window.
    daemon.script_path.write_text(
        json.dumps(
            {
                "replies": [
                    {"text": "first answer", "usage": {"input_tokens": 900, "output_tokens": 5}}
                ],
                "by_system": {SUMMARY_SYSTEM: [{"text": "S."}]},
            }
        )
    )
    daemon.start()
    try:
        with daemon.client() as c:
            assert c.post("/v1/sessions", json={"session_id": "d"}).status_code in (200, 201)
            for n in range(2):
                sent = c.post(
                    "/v1/sessions/d/messages", json={"text": f"question {n}", "request_id": f"m{n}"}
                )
                assert sent.status_code == 202, sent.text
                wait_for(c, "d", lambda s, n=n: idle(s) and len(s["runs"]) == n + 1)
            summary = wait_for(c, "d", lambda s: bool(s["context"]["compactions"]))
            (auto,) = summary["context"]["compactions"]
            assert auto["items"] == [0, 2] and auto["tokens_before"] == 900
            asked = c.post("/v1/sessions/d/compact-context", json={"request_id": "k1"})
            assert asked.status_code == 200, asked.text
            body = asked.json()
            assert body["compaction_id"] == "d.compaction2" and body["recorded"]
            again = c.post("/v1/sessions/d/compact-context", json={"request_id": "k1"}).json()
            assert again["duplicate"] and again["compaction_id"] == "d.compaction2"
            done = wait_for(c, "d", lambda s: len(s["context"]["compactions"]) == 2)
            assert done["context"]["summarised"] == 3
            seen = c.get("/v1/sessions/d/transcript").json()["messages"]
            whole = c.get("/v1/sessions/d/transcript?history=1").json()["messages"]
            nothing = c.post("/v1/sessions/d/compact-context", json={"request_id": "k2"})
            assert nothing.status_code == 409 and "nothing to compact" in nothing.text
    finally:
        daemon.close()
    assert "S." in json.dumps(seen[0]) and len(seen) == 2
    assert "question 0" in json.dumps(whole) and "question 0" not in json.dumps(seen)


async def test_a_command_on_an_unowned_log_is_decided_under_the_settings_given(
    tmp_path: Path,
) -> None:
    """``owning(settings=...)``: the limits reach the core's decision, as a runtime's do.
    Two questions and answers are four items: the default policy keeps six verbatim
    (nothing to compact), a policy that keeps one starts a compaction of three."""
    from perdure._unowned import owning
    from perdure.actors import protocol
    from perdure.errors import Refused
    from perdure.settings import Limits, Settings

    log = tmp_path / "log"
    answers = ScriptedProvider([Reply(text="first answer"), Reply(text="second answer")])
    async with perdure.open_runtime(log, provider=answers) as rt:
        await rt.create_session("s")
        for n, text in enumerate(("first question", "second question")):
            await rt.submit("s", text, request_id=f"q{n}")
            await rt.wait_idle("s")

    async with owning(log, {}, settings=Settings()) as unowned:
        with pytest.raises(Refused, match="nothing"):
            await unowned.apply(await unowned.state("s"), protocol.CompactContext("k0"))
    keep_one = Settings(limits=Limits(compaction=perdure.CompactionPolicy(keep_recent=1)))
    async with owning(log, {}, settings=keep_one) as unowned:
        done = await unowned.apply(await unowned.state("s"), protocol.CompactContext("k1"))
        stored = [c.record for c in await unowned.journal.read_session("s")]
    assert done.seq and not done.duplicate
    (started,) = [r for r in stored if isinstance(r, CompactionStarted)]
    assert (started.start, started.end) == (0, 3)
