"""The LMDB map's pages leave the resident set once the log is quiet, and nothing changes.

Commits fault pages of the map in (and the kernel maps their cached neighbours
with them), so without a release the process's RSS grows toward the log's size.
``LmdbLog.release_mapped_pages`` drops them from the resident set; the Journal's
writer thread calls it once the log has been quiet for ``RELEASE_QUIET`` seconds.
Reads and commits after a release see exactly what was there before.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import trio

from perdure.storage.journal import RELEASE_QUIET, open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import ToolCompleted

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (Linux)"
)


def mapped_kib(log: LmdbLog) -> int:
    """Resident KiB of this process's mapping of the log's data file."""
    data = os.path.realpath(log.path / "data.mdb")
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                inside = len(fields) >= 6 and fields[5] == data
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def result(i: int) -> ToolCompleted:
    return ToolCompleted(session_id=f"s{i % 7}", call_id=f"c{i}", output="x" * 900, at=1.0)


def test_a_release_drops_the_maps_pages_and_changes_nothing(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path / "log")
    try:
        for start in range(0, 3000, 100):
            log.commit([([result(i) for i in range(start, start + 100)], None)])
        before = [log.read_session(f"s{k}") for k in range(7)]
        assert mapped_kib(log) > 1024  # ~3 MB of records, read back through the map

        advised = log.release_mapped_pages()
        assert advised >= 3 << 20 and log.map_releases == 1
        assert mapped_kib(log) < 64  # only what the release itself touched

        assert [log.read_session(f"s{k}") for k in range(7)] == before
        last = log.last_seq()
        (more,) = log.commit([([result(3000)], None)])
        assert isinstance(more, list) and more[0].seq == last + 1
        assert log.read_session("s4")[-1].record == result(3000)
    finally:
        log.close()


async def test_the_writer_releases_the_pages_once_the_log_is_quiet(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log, commit_on_loop=False) as journal:
            for start in range(0, 2000, 50):
                await journal.append([result(i) for i in range(start, start + 50)])
            await journal.read_session("s1")
            busy = mapped_kib(log)
            assert busy > 512 and log.map_releases == 0
            deadline = time.monotonic() + RELEASE_QUIET + 5
            while log.map_releases == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert log.map_releases == 1, "the writer did not release a quiet log's pages"
            assert mapped_kib(log) < busy // 4
            await trio.sleep(RELEASE_QUIET * 1.5)
            assert log.map_releases == 1  # nothing committed since: nothing to release
            await journal.append([result(2000)])
            assert (await journal.read_session("s5"))[-1].record == result(2000)
    finally:
        log.close()


async def test_commits_on_the_loop_keep_the_log_from_counting_as_quiet(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path / "log")
    try:
        async with open_journal(log, commit_on_loop=True) as journal:
            i = 0
            until = time.monotonic() + RELEASE_QUIET * 2.5
            while time.monotonic() < until:  # one session's commits, one after another
                await journal.append([result(i)])
                i += 1
            assert journal.stats.loop_transactions > 0  # the writer thread saw none of them
            assert log.map_releases == 0  # not quiet, and RELEASE_EVERY has not passed
            deadline = time.monotonic() + RELEASE_QUIET * 3 + 5
            while log.map_releases == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert log.map_releases == 1
    finally:
        log.close()


def test_a_release_leaves_nothing_behind(tmp_path: Path) -> None:
    """It runs after every burst, when a survivor would pin an otherwise empty arena
    of the allocator: a libc handle made per call and a text-mode read of
    /proc/self/maps each left small objects alive."""
    log = LmdbLog(tmp_path / "log")
    try:
        log.commit([([result(i) for i in range(100)], None)])
        log.release_mapped_pages()  # first-call costs (the libc lookup) paid here
        gc.collect()
        tracemalloc.start()
        try:
            kept = tracemalloc.get_traced_memory()[0]
            for _ in range(300):
                assert log.release_mapped_pages() > 0
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - kept
        finally:
            tracemalloc.stop()
        assert kept < 300 * 4, f"{kept} bytes kept by 300 releases"
    finally:
        log.close()
