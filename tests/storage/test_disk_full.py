"""A full disk is ``StorageFull`` for the caller; what was committed stays; space comes back.

Runs on a real, small tmpfs mounted for the test (root only: otherwise the tests
are skipped, saying why) and unmounted afterwards:

* appending until the filesystem is full surfaces ``StorageFull`` to the Journal's
  caller (not a generic ``LogError``: LMDB reports most out-of-space writes as a
  short write, i.e. EIO), the Journal is not fenced, every earlier commit reads
  back intact, and once space is freed the same process appends again;
* ``_is_disk_full`` classifies what py-lmdb raises: ``DiskError`` (ENOSPC) always,
  EIO only on a filesystem that has no space left.
"""

from __future__ import annotations

import errno
from pathlib import Path

import lmdb
import pytest
import trio

from perdure.storage import LogError, StorageFull
from perdure.storage.journal import open_journal
from perdure.storage.lmdb_log import LmdbLog, _is_disk_full
from perdure.storage.records import Committed, ToolCompleted
from tests.storage._check import LogModel, check_log
from tests.support.disk import fill

BALLAST = 256 << 10


def result(i: int, size: int) -> ToolCompleted:
    return ToolCompleted(session_id=f"s{i % 3}", call_id=f"c{i}", output="r" * size, at=1.0)


async def test_full_disk_is_storage_full_and_recoverable(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    await trio.to_thread.run_sync(ballast.write_bytes, b"b" * BALLAST)
    log = await trio.to_thread.run_sync(LmdbLog, small_disk / "log")
    try:
        kept: list[Committed] = []
        async with open_journal(log) as journal:
            error: Exception | None = None
            for i in range(200):
                try:
                    kept += await journal.append([result(i, 20_000), result(i + 1000, 3_000)])
                except LogError as exc:
                    error = exc
                    break
            assert isinstance(error, StorageFull), f"expected StorageFull, got {error!r}"
            assert "disk full" in str(error)
            assert len(kept) >= 10  # it did fill up by appending
            assert not journal.fenced.is_set()

            # Committed before the disk filled: all there, all consistent.
            everything = await trio.to_thread.run_sync(check_log, log, LogModel())
            assert everything[1:] == kept
            # Still full: still a clear error, still nothing half-written.
            with pytest.raises(StorageFull):
                await journal.append([result(500, 20_000)])

            await trio.to_thread.run_sync(ballast.unlink)
            after = await journal.append([result(600, 20_000), result(601, 10)])
            model = LogModel()
            everything = await trio.to_thread.run_sync(check_log, log, model)
            assert everything[1:] == [*kept, *after]
            assert after[0].seq == kept[-1].seq + 1
    finally:
        await trio.to_thread.run_sync(log.close)

    def reopen() -> list[Committed]:
        again = LmdbLog(small_disk / "log")
        try:
            return check_log(again, LogModel())
        finally:
            again.close()

    assert (await trio.to_thread.run_sync(reopen))[: len(everything)] == everything


def test_what_counts_as_disk_full(small_disk: Path, tmp_path: Path) -> None:
    short_write = lmdb.Error("mdb_txn_commit: Input/output error")
    short_write.code = errno.EIO  # type: ignore[misc]  # py-lmdb sets it on raised errors
    no_space = lmdb.DiskError("mdb_txn_commit: No space left on device")
    no_space.code = errno.ENOSPC  # type: ignore[misc]
    other = lmdb.Error("mdb_txn_commit: Permission denied")
    other.code = errno.EACCES  # type: ignore[misc]

    # A filesystem with plenty of room: EIO is a real I/O error, not "full".
    assert not _is_disk_full(short_write, tmp_path)
    assert _is_disk_full(no_space, tmp_path)
    assert not _is_disk_full(other, tmp_path)
    fill(small_disk / "filler")
    assert _is_disk_full(short_write, small_disk)
    assert not _is_disk_full(other, small_disk)
