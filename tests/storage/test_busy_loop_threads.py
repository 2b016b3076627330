"""A busy trio loop still lets perdure's worker threads run (``perdure._threads``).

A loop that is never idle gives the GIL up at every poll for I/O and takes it straight
back, before a waiting thread wakes up; without the Journal's yields, a read in a
worker thread waited until the loop went idle. Here a task that is always runnable
(50 us of CPU, then a checkpoint) keeps the loop busy, and a session's read must come
back while it still spins.
"""

from __future__ import annotations

import time
from pathlib import Path

import trio

from perdure import _threads
from perdure.storage.journal import open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import ToolCompleted

READS = 20  # one after the other, while the loop spins
SPINS = 20_000  # the spinner's passes before it gives up (~1 s): far more than a read needs
STEP = 50e-6  # seconds of CPU per pass: the application's own work on the loop


async def read_while_spinning(log: LmdbLog) -> tuple[int, int]:
    """(the spinner's passes when the reads were all back, the loop's yields meanwhile)."""
    async with open_journal(log) as journal:
        await journal.append([ToolCompleted(session_id="s", call_id="c", output="ok", at=1.0)])
        spins = 0
        done_at: list[int] = []

        async def spinner() -> None:
            nonlocal spins
            while not done_at and spins < SPINS:
                began = time.thread_time()
                while time.thread_time() - began < STEP:
                    pass
                spins += 1
                await trio.lowlevel.checkpoint()

        tally = _threads.calls()
        before = tally.yields
        async with trio.open_nursery() as nursery:
            nursery.start_soon(spinner)
            await trio.lowlevel.checkpoint()
            for _ in range(READS):
                records = await journal.read_session("s")
                assert records and {c.record.call_id for c in records} == {"c"}  # type: ignore[attr-defined]
            done_at.append(spins)
        return done_at[0], tally.yields - before


async def test_reads_come_back_while_the_loop_is_busy(tmp_path: Path) -> None:
    """Without the yields (``YIELD_EVERY`` infinite) the same 20 reads usually outlast
    the spinner's 20,000 passes (~1 s), against ~320 passes with them; but a waiting
    thread sometimes wins the race for the GIL by itself, so only the side with the
    yields is asserted (the benchmark ``perdure_bench.py busy-loop`` measures both)."""
    log = LmdbLog(tmp_path / "log")
    try:
        spins, yields = await read_while_spinning(log)
    finally:
        log.close()
    assert spins < SPINS, "the reads waited for the busy loop to stop"
    assert yields >= 1
