"""MAP_FULL grows the map; nothing is lost, doubled or reordered on the way.

* A log opened with a 64 KiB map takes thousands of records, small and large (up to
  1 MiB), from concurrent appenders while readers keep reading: the map grows, and
  every record is present exactly once, in commit order, with consistent indexes;
  reopened with the same tiny map size it reads and appends on.
* At ``max_map_size`` the caller gets ``StorageFull``; what was committed stays,
  and smaller appends still fit.
* A reader process adopts a map another process grew (``MDB_MAP_RESIZED``), and the
  adoption waits for this process's open read transactions instead of
  invalidating them under their feet.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import trio

from perdure.storage import StorageFull
from perdure.storage.journal import open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Committed, Record, ToolCompleted
from tests.storage._check import LogModel, check_log
from tests.storage._procs import Child

TINY = 64 << 10
SIZES = [0, 10, 100, 1_000, 5_000, 20_000, 100_000]


def record(sid: str, call: str, size: int) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id=call, output=call[:1] * size, at=1.0)


async def test_tiny_map_grows_and_keeps_every_record_once_in_order(tmp_path: Path) -> None:
    rng = random.Random(7)
    batches: list[list[Record]] = []
    for i in range(300):
        batch: list[Record] = [
            record(f"s{i % 5}", f"{i}.{j}", rng.choice(SIZES)) for j in range(1 + i % 3)
        ]
        batches.append(batch)
    batches[150] = [record("big", "huge", 1 << 20)]
    log = await trio.to_thread.run_sync(lambda: LmdbLog(tmp_path / "log", map_size=TINY))
    committed: list[Committed] = []
    reads = 0
    try:
        async with open_journal(log) as journal:

            async def appender(mine: list[list[Record]]) -> None:
                for batch in mine:
                    committed.extend(await journal.append(batch))

            async def reader(stop: trio.Event) -> None:
                nonlocal reads
                while not stop.is_set():
                    seen = await journal.read_global()
                    assert [c.seq for c in seen] == list(range(1, len(seen) + 1))
                    reads += 1

            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader, stop)
                async with trio.open_nursery() as appenders:
                    for k in range(6):
                        appenders.start_soon(appender, batches[k::6])
                stop.set()
        grown = log.stat()["map_size"]
        assert grown >= 2 << 20, grown
        assert reads > 0
        everything = await trio.to_thread.run_sync(check_log, log, LogModel())
    finally:
        await trio.to_thread.run_sync(log.close)

    total = sum(map(len, batches))
    assert len(everything) == 1 + total  # LogOpened, then each record exactly once
    committed.sort(key=lambda c: c.seq)
    assert everything[1:] == committed
    sent = sorted(r.call_id for b in batches for r in b if isinstance(r, ToolCompleted))
    assert sorted(c.record.call_id for c in committed) == sent  # type: ignore[union-attr]

    def reopen() -> list[Committed]:
        again = LmdbLog(tmp_path / "log", map_size=TINY)
        try:
            again.commit([([record("s0", "after-reopen", 200_000)], None)])
            return check_log(again, LogModel())
        finally:
            again.close()

    reread = await trio.to_thread.run_sync(reopen)
    assert reread[: len(everything)] == everything
    assert [type(c.record).__name__ for c in reread[len(everything) :]] == [
        "LogOpened",
        "ToolCompleted",
    ]


async def test_max_map_size_is_storage_full_and_keeps_what_was_committed(
    tmp_path: Path,
) -> None:
    log = await trio.to_thread.run_sync(
        lambda: LmdbLog(tmp_path / "log", map_size=TINY, max_map_size=4 * TINY)
    )
    try:
        async with open_journal(log) as journal:
            kept = [c for i in range(5) for c in await journal.append([record("s", f"k{i}", 2000)])]
            with pytest.raises(StorageFull, match="maximum map size"):
                await journal.append([record("s", "too-big", 1 << 20)])
            assert not journal.fenced.is_set()
            after = await journal.append([record("s", "small", 100)])
        assert after[0].seq == kept[-1].seq + 1
        everything = await trio.to_thread.run_sync(check_log, log, LogModel())
        assert everything[1:] == [*kept, *after]
        assert log.stat()["map_size"] == 4 * TINY
    finally:
        await trio.to_thread.run_sync(log.close)


def test_reader_adopts_a_map_grown_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "log"
    owner = Child("owner", str(path), "--map-size", str(TINY), stderr_path=tmp_path / "owner.err")
    try:
        owner.read()
        reader = LmdbLog(path, readonly=True, map_size=TINY)
        try:
            frames = reader.scan_frames()
            assert next(frames)[0] == 1  # a read transaction stays open in this thread
            for _ in range(3):
                owner.send("append 300000")
                owner.read()
            result: list[list[Committed]] = []
            other = threading.Thread(target=lambda: result.append(reader.read_global()))
            other.start()
            other.join(0.3)
            # The other thread must adopt the grown map, but not while our read is open.
            assert other.is_alive(), "the map was swapped under an open read transaction"
            assert [seq for seq, _ in frames] == [2]  # our snapshot, read to its end
            other.join(10)
            assert not other.is_alive()
            assert [c.seq for c in result[0]] == [1, 2, 3, 4, 5]
            assert reader.stat()["map_size"] > 900_000
        finally:
            reader.close()
        owner.send("exit")
        assert owner.wait() == 0
    finally:
        owner.close()
