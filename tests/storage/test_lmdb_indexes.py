"""LMDB's indexes for start-up and the list: what ``claim`` and ``newest_sessions`` read.

* ``claim`` orders the active sessions by the last seq found in each summary's bytes,
  whichever way the summary was formatted (this build's, or ``json.dumps``'s, with
  spaces, as older builds wrote it);
* the ``created`` index: a log written before it existed (or by a build that did not
  keep it) is read by creation all the same, by a read-only reader (from the
  summaries) and by an owner, which builds the index once at open;
* an owner builds the index on a log whose map is full (it grows the map, as a
  commit does);
* start-up reads the interrupted sessions in batches of 1, then 10, then 100.
"""

from __future__ import annotations

import json
from pathlib import Path

import lmdb

from perdure.actors.supervisor.ownership import BOOT_READ_BATCH, boot_batches
from perdure.storage.lmdb_log import LmdbLog
from tests.storage.test_contract import accepted, finished, tool_result, write


def newest(log: LmdbLog) -> list[str]:
    return [i.session_id for i in log.newest_sessions()]


def test_claim_reads_the_last_seq_of_either_summary_format(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path / "log")
    try:
        for sid in ("a", "b", "c"):
            write(log, [accepted(sid, "u")])
        write(log, [tool_result("a", "later")])
        assert log.claim() == ["b", "c", "a"]
        # b's summary as an older build wrote it; its last seq moved past a's.
        info = log.session_info("b")
        assert info is not None
        old = {"first_seq": info.first_seq, "last_seq": 10_000, "records": 1, "goal_rev": 0}
        with log.env.begin(write=True) as txn:
            txn.put(b"b", json.dumps(old).encode(), db=log._sessions)
        log._summaries.clear()
        assert log.claim() == ["c", "a", "b"]
    finally:
        log.close()


def _without_created(path: Path, *, drop_one: str | None = None) -> None:
    """The log as a build without the ``created`` index left it (or, with ``drop_one``,
    as one that did not index that session)."""
    env = lmdb.open(str(path), max_dbs=8, subdir=True)
    try:
        created = env.open_db(b"created")
        with env.begin(write=True) as txn:
            if drop_one is None:
                txn.drop(created, delete=True)
            else:
                with txn.cursor(db=created) as cur:
                    for key, value in cur.iternext():
                        if bytes(value) == drop_one.encode():
                            txn.delete(bytes(key), db=created)
                            break
    finally:
        env.close()


def test_a_log_without_the_creation_index_is_listed_and_indexed_at_open(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = LmdbLog(path)
    for sid in ("b", "a", "c"):
        write(log, [accepted(sid, "u")])
    write(log, [finished("a", "u")])
    log.close()
    _without_created(path)

    reader = LmdbLog(path, readonly=True)
    try:
        assert reader._created is None
        assert newest(reader) == ["c", "a", "b"]  # from the summaries
        (first,) = reader.newest_sessions(limit=1)
        assert [i.session_id for i in reader.newest_sessions(before=first.first_seq)] == ["a", "b"]
    finally:
        reader.close()

    owner = LmdbLog(path)  # builds the index
    try:
        assert owner._created is not None
        assert newest(owner) == ["c", "a", "b"]
        write(owner, [accepted("d", "u")])
        assert newest(owner) == ["d", "c", "a", "b"]
    finally:
        owner.close()
    reader = LmdbLog(path, readonly=True)
    try:
        assert reader._created is not None  # the index, whole: read from it now
        assert newest(reader) == ["d", "c", "a", "b"]
    finally:
        reader.close()


def test_an_index_missing_a_session_is_rebuilt_by_the_next_owner(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = LmdbLog(path)
    for sid in ("a", "b", "c"):
        write(log, [accepted(sid, "u")])
    log.close()
    _without_created(path, drop_one="b")
    reader = LmdbLog(path, readonly=True)
    try:
        assert reader._created is None  # not whole: not trusted
        assert newest(reader) == ["c", "b", "a"]
    finally:
        reader.close()
    owner = LmdbLog(path)
    try:
        assert newest(owner) == ["c", "b", "a"]
    finally:
        owner.close()


def test_the_index_is_built_on_a_log_whose_map_is_full(tmp_path: Path) -> None:
    """A log written before the index, its map full: the owner grows the map to build
    the index, as a commit would (found on a benchmark's log of 100,000 sessions)."""
    path = tmp_path / "log"
    log = LmdbLog(path, map_size=1 << 20)
    for i in range(300):
        write(log, [accepted(f"s{i:03d}", "u")])
    size = log.env.info()["map_size"]
    log.close()
    _without_created(path)
    _fill_the_map(path, size)
    owner = LmdbLog(path, map_size=size)
    try:
        assert owner.env.info()["map_size"] > size
        assert newest(owner)[:2] == ["s299", "s298"] and len(newest(owner)) == 300
    finally:
        owner.close()


def _fill_the_map(path: Path, size: int) -> None:
    """Fill what is left of the log's map, to the last page, with another table."""
    env = lmdb.open(str(path), max_dbs=8, subdir=True, map_size=size)
    try:
        junk, n = env.open_db(b"junk"), 0
        for batch, value in ((64, 2000), (1, 2000), (1, 100)):
            while True:
                try:
                    with env.begin(write=True) as txn:
                        for _ in range(batch):
                            txn.put(n.to_bytes(8, "big"), b"x" * value, db=junk)
                            n += 1
                except lmdb.MapFullError:
                    break
        assert env.info()["map_size"] == size
    finally:
        env.close()


def test_start_up_reads_the_first_session_alone_then_ten_then_full_batches() -> None:
    assert boot_batches(0) == []
    assert boot_batches(1) == [(0, 1)]
    assert boot_batches(5) == [(0, 1), (1, 5)]
    n = 11 + 2 * BOOT_READ_BATCH + 3
    assert boot_batches(n) == [
        (0, 1),
        (1, 11),
        (11, 11 + BOOT_READ_BATCH),
        (11 + BOOT_READ_BATCH, 11 + 2 * BOOT_READ_BATCH),
        (11 + 2 * BOOT_READ_BATCH, n),
    ]
