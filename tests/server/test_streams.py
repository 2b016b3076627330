"""Many sessions at once, event-stream resume by sequence number, slow clients, and the
frames every client of a session shares (encoded once, byte for byte what encoding
each event for each client would give)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import trio

from perdure.server.streams import FrameCache, sse_frame
from perdure.storage.bus import Event
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import LogOpened, ToolCompleted
from tests.server.conftest import WORK_SCRIPT
from tests.support.checker import check
from tests.support.daemon import Daemon, Stream, follow, is_final, parse_sse

FINAL = "All done: looked up, booked, and noted."


def expected_seqs(log: Path, session_id: str) -> list[int]:
    """What a stream from 0 must deliver: the session's records plus restart markers."""
    opened = LmdbLog(log, readonly=True)
    try:
        own = [c.seq for c in opened.read_session(session_id)]
        markers = [
            c.seq
            for c in opened.read_global()
            if isinstance(c.record, LogOpened) and c.seq > own[0]
        ]
    finally:
        opened.close()
    return sorted(own + markers)


async def test_fifty_concurrent_sessions_each_complete_a_multi_tool_run(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = await trio.to_thread.run_sync(make_daemon(WORK_SCRIPT).start)
    n = 50
    finals: dict[str, Stream] = {}
    limits = httpx.Limits(max_connections=2 * n + 10)
    async with daemon.aclient(limits=limits) as c:

        async def one(i: int) -> None:
            sid = f"c{i:02d}"
            created = await c.post("/v1/sessions", json={"session_id": sid})
            assert created.status_code == 201, created.text
            accepted = await c.post(
                f"/v1/sessions/{sid}/messages", json={"text": f"task {i}", "request_id": "t"}
            )
            assert accepted.status_code == 202, accepted.text
            finals[sid] = await follow(c, sid, after=0, limit=90)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, i)
    assert len(finals) == n
    for sid, stream in finals.items():
        last = stream.events[-1]
        assert is_final(last) and last.record["status"] == "completed", (sid, last)
        assert last.record["final_text"] == FINAL
        assert stream.seqs == sorted(set(stream.seqs)), sid  # in order, no duplicate
        executed = [e.record["tool_name"] for e in stream.events if e.event == "ToolExecuting"]
        assert sorted(executed) == ["book", "lookup", "send_note", "slow_lookup"]
    # Deltas are ephemeral (live only): a client that subscribed after a turn streamed
    # missed that turn's text, so under load only some streams can show them.
    assert any(any(e.event == "text_delta" for e in s.events) for s in finals.values())
    assert await trio.to_thread.run_sync(daemon.stop) == 0
    for sid, stream in finals.items():
        assert stream.seqs == expected_seqs(daemon.log, sid), sid  # and no gap
    report = check(daemon.log, daemon.workspace, settled=True)
    assert report.violations == []
    assert report.counts["effects"] == 4 * n
    assert report.counts["RunFinished"] == n


async def test_resume_with_last_event_id_has_no_gap_and_no_duplicate(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = await trio.to_thread.run_sync(make_daemon(WORK_SCRIPT).start)
    async with daemon.aclient() as c:
        sid = (await c.post("/v1/sessions", json={})).json()["session_id"]
        await c.post(f"/v1/sessions/{sid}/messages", json={"text": "go", "request_id": "r"})
        # Leave in the middle of the run (the first tool is executing) ...
        first = await follow(c, sid, after=0, until=lambda e: e.event == "ToolExecuting")
        await trio.sleep(0.3)  # ... while records keep being committed ...
        # ... and come back the way EventSource does: the same URL plus Last-Event-ID.
        second = await follow(c, sid, after=0, last_event_id=first.seqs[-1])
        # A third client resumes from a seq in the middle with ?after=.
        middle = first.seqs[len(first.seqs) // 2]
        third = await follow(c, sid, after=middle)
    assert is_final(second.events[-1])
    assert second.seqs[0] > first.seqs[-1]
    joined = first.seqs + second.seqs
    assert joined == sorted(set(joined))  # no duplicate, in order
    assert joined == expected_seqs(daemon.log, sid)  # no gap
    assert third.seqs == [s for s in joined if s > middle]


async def test_a_slow_client_is_dropped_and_never_blocks_the_runtime(
    make_daemon: Callable[..., Daemon],
) -> None:
    # One reply of 3 MB streams ~190,000 text deltas: far more than the bus buffers
    # for a subscriber (4096 events) plus what the sockets hold.
    script = [{"text": "0123456789abcdef" * 190_000}]
    daemon = await trio.to_thread.run_sync(make_daemon(script).start)
    async with daemon.aclient() as c, daemon.aclient() as reader:
        sid = (await c.post("/v1/sessions", json={})).json()["session_id"]
        stream = Stream()
        async with reader.stream("GET", f"/v1/sessions/{sid}/events", params={"after": 0}) as slow:
            assert slow.status_code == 200
            # The slow client reads nothing while the run goes on.
            await c.post(f"/v1/sessions/{sid}/messages", json={"text": "go", "request_id": "r"})
            with trio.fail_after(60):
                while True:
                    summary = (await c.get(f"/v1/sessions/{sid}")).json()
                    if summary["status"] == "idle" and summary["runs"]:
                        break
                    await trio.sleep(0.1)
            assert summary["runs"][0]["status"] == "completed"
            # Now it reads: what was buffered, then the server ends the response.
            async for event in parse_sse(slow.aiter_lines(), stream):
                stream.events.append(event)
    assert "lagged behind; reconnect with Last-Event-ID" in stream.comments
    assert not any(is_final(e) for e in stream.events)
    deltas = sum(e.event == "text_delta" for e in stream.events)
    assert 0 < deltas < 190_000
    async with daemon.aclient() as c:
        rest = await follow(c, sid, last_event_id=stream.seqs[-1])
    assert is_final(rest.events[-1])
    assert stream.seqs + rest.seqs == expected_seqs(daemon.log, sid)


def test_a_shared_frame_is_the_bytes_each_client_would_have_encoded() -> None:
    cache = FrameCache(size=2, live=4)
    record = ToolCompleted(session_id="s", call_id="c1", output="é\nö", at=1.5)
    committed = Event("s", "ToolCompleted", 7, record)
    delta = Event("s", "text_delta", data={"text": "line one\nline two", "n": 1})
    for event in (committed, delta):
        shared = cache.frame(event)
        assert shared == sse_frame(event)
        assert cache.frame(event) is shared  # encoded once, then the same bytes
    # Another client replays the record from the log: another object, the same frame.
    assert cache.frame(Event("s", "ToolCompleted", 7, record)) is cache.frame(committed)
    # Events come and go (each one freed once the cache lets go of it, so a new
    # event may get a freed one's id): every frame is still that event's own.
    for i in range(300):
        event = Event("s", "text_delta", data={"text": f"delta {i}"})
        assert cache.frame(event) == sse_frame(event)
        later = Event("s", "ToolCompleted", 100 + i, record)
        assert cache.frame(later) == sse_frame(later)


async def test_the_clients_of_one_session_get_identical_bytes(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = await trio.to_thread.run_sync(make_daemon(WORK_SCRIPT, heartbeat=60.0).start)
    bodies: dict[int, bytes] = {}
    async with daemon.aclient() as c:
        sid = (await c.post("/v1/sessions", json={})).json()["session_id"]

        async def read(i: int, task_status: trio.TaskStatus[None]) -> None:
            async with c.stream("GET", f"/v1/sessions/{sid}/events") as resp:
                body, told = b"", False
                async for chunk in resp.aiter_raw():
                    body += chunk
                    if not told and b"event: SessionCreated" in body:
                        told = True  # subscribed (the replay follows the subscription)
                        task_status.started()
                    end = body.find(b"event: RunFinished")
                    if end >= 0 and body.find(b"\n\n", end) >= 0:
                        break
            bodies[i] = body

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    await nursery.start(read, i)
                await c.post(f"/v1/sessions/{sid}/messages", json={"text": "go", "request_id": "r"})
    assert await trio.to_thread.run_sync(daemon.stop) == 0
    assert len(set(bodies.values())) == 1  # four clients, one stream of bytes
    frames = bodies[0].split(b"\n\n")[1:-1]  # after the opening, to RunFinished
    assert any(f.startswith(b"event: text_delta\n") for f in frames)  # deltas too
    # Each committed record's frame is what encoding it alone, as read back from the
    # log, gives.
    opened = LmdbLog(daemon.log, readonly=True)
    try:
        stored = {c.seq: c.record for c in opened.read_global()}
    finally:
        opened.close()
    committed = [f for f in frames if f.startswith(b"id: ")]
    assert len(committed) == len([r for r in stored.values() if r.session_id == sid])
    for frame in committed:
        seq = int(frame.split(b"\n", 1)[0].removeprefix(b"id: "))
        record = stored[seq]
        assert frame + b"\n\n" == sse_frame(Event(sid, type(record).__name__, seq, record))
