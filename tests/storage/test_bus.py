"""The EventBus as fed by the Journal: committed records, in seq order, only once durable.

* Every committed record is published once, in seq order, to the all-sessions
  subscribers and to its own session's; when a subscriber receives an event, the
  record is already readable from the log (it was published after the commit).
* A subscriber that overflows its buffer is dropped with ``EventStreamLagged``
  after the events it did buffer, while the other subscribers and the Journal go
  on unaffected; a subscriber that closes itself ends cleanly.
* ``drain`` takes everything waiting at once, in order, and changes nothing of the
  above; ``Runtime.event_batches`` hands a commit's records over as one batch.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest
import trio

import perdure
from perdure.providers.scripted import ScriptedProvider
from perdure.storage.bus import Event, EventBus, EventStreamLagged, Subscription
from perdure.storage.journal import open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Committed, Record, ToolCompleted


def result(sid: str, call: str) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id=call, output=f"{sid}/{call}", at=1.0)


async def collect(sub: Subscription, count: int, log: LmdbLog, out: list[Event]) -> None:
    """Receive ``count`` events; each one must already be readable from the log."""
    async for event in sub:
        assert event.seq is not None
        readable = await trio.to_thread.run_sync(log.read_global, event.seq - 1, 1)
        assert readable == [Committed(event.seq, event.record)]  # type: ignore[arg-type]
        out.append(event)
        if len(out) == count:
            return


async def drain(sub: Subscription, into: list[int | None]) -> None:
    async for event in sub:
        into.append(event.seq)


async def test_committed_records_are_published_in_seq_order_after_commit(log: LmdbLog) -> None:
    batches: list[list[Record]] = [
        [result(f"s{i % 3}", f"c{i}.{j}") for j in range(1 + i % 3)] for i in range(40)
    ]
    total = sum(map(len, batches))
    on_s1 = sum(len(b) for i, b in enumerate(batches) if i % 3 == 1)
    everything: list[Event] = []
    only_s1: list[Event] = []
    async with open_journal(log) as journal:
        all_sub = journal.bus.subscribe(None)
        s1_sub = journal.bus.subscribe("s1")
        committed: list[Committed] = []

        async def append(batch: list[Record]) -> None:
            committed.extend(await journal.append(batch))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, all_sub, total, log, everything)
            nursery.start_soon(collect, s1_sub, on_s1, log, only_s1)
            async with trio.open_nursery() as appenders:
                for batch in batches:
                    appenders.start_soon(append, batch)
        assert journal.stats.transactions < len(batches)

    committed.sort(key=lambda c: c.seq)
    assert [(e.seq, e.record) for e in everything] == [(c.seq, c.record) for c in committed]
    assert [e.seq for e in everything] == list(range(2, 2 + total))
    assert [(e.seq, e.record) for e in only_s1] == [
        (c.seq, c.record) for c in committed if c.record.session_id == "s1"
    ]
    assert all(e.kind == "ToolCompleted" and not e.ephemeral for e in everything)


async def test_slow_subscriber_lags_alone(log: LmdbLog) -> None:
    bus = EventBus(buffer=100)
    async with open_journal(log, bus) as journal:
        slow = bus.subscribe(None, buffer=3)
        fast = bus.subscribe(None)
        quitter = bus.subscribe("s")
        for i in range(10):
            await journal.append([result("s", f"c{i}")])
        got = [e.seq for e in [await fast.__anext__() for _ in range(10)]]
        assert got == list(range(2, 12))

        seen: list[int | None] = []
        with pytest.raises(EventStreamLagged, match="fell behind"):
            await drain(slow, seen)
        assert seen == [2, 3, 4]  # what it had buffered, then the truth
        assert slow.lagged
        assert not fast.lagged

        # The quitter closes itself: its iterator ends without an error.
        quitter.close()
        assert len([e async for e in quitter]) == 10

        # The Journal and the other subscriber go on.
        await journal.append([result("s", "after")])
        assert (await fast.__anext__()).seq == 12
        assert bus.has_subscribers("other")  # through the all-sessions subscriber
        slow.close()
        fast.close()
        assert not bus.has_subscribers("s")


async def test_drain_takes_what_waits_in_order_and_a_lag_still_follows(log: LmdbLog) -> None:
    bus = EventBus(buffer=100)
    async with open_journal(log, bus) as journal:
        sub = bus.subscribe("s", buffer=5)
        assert sub.drain() == []
        committed = await journal.append([result("s", f"c{i}") for i in range(3)])
        bus.publish(Event("s", "text_delta", data={"text": "hi"}))
        assert bus.backlog() == 4
        got = sub.drain()
        assert [e.seq for e in got] == [c.seq for c in committed] + [None]
        assert sub.drain() == [] and bus.backlog() == 0
        # Overflow: the five buffered events, then the lag (drain never raises it).
        await journal.append([result("s", f"d{i}") for i in range(6)])
        assert len(sub.drain()) == 5
        assert sub.drain() == []
        with pytest.raises(EventStreamLagged):
            await sub.__anext__()
        # A closed subscription keeps what was waiting, then ends.
        quitter = bus.subscribe("s")
        await journal.append([result("s", "e")])
        quitter.close()
        assert [e.kind for e in quitter.drain()] == ["ToolCompleted"]
        with pytest.raises(StopAsyncIteration):
            await quitter.__anext__()


async def test_a_commit_reaches_a_batch_reader_as_one_batch(log_dir: Path) -> None:
    async with perdure.open_runtime(log_dir, provider=ScriptedProvider([])) as rt:
        await rt.create_session("s")
        async with aclosing(rt.event_batches("s")) as batches:
            replay = await batches.__anext__()
            assert [e.kind for e in replay] == ["SessionCreated"]
            committed = await rt._journal.append([result("s", f"c{i}") for i in range(3)])
            rt._journal.bus.publish(Event("s", "text_delta", data={"text": "hi"}))
            live = await batches.__anext__()
            assert [e.seq for e in live] == [c.seq for c in committed] + [None]
            # What events() yields is the same, one at a time.
            flat = [e async for e in rt.events("s", live=False)]
            assert [e.seq for e in flat] == [replay[0].seq] + [c.seq for c in committed]
