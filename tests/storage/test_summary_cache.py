"""LMDB's cache of session summaries: always what the log holds, and it saves the reads.

The owner keeps each session's summary as it last committed it, so a commit reads the
sessions table only for sessions it has not written lately. These tests hold the cache
against the log itself (``session_info`` reads the table in a read transaction) and
against the summaries folded from the records (``check_consistent``'s oracle), through
what could make them part: refused guards, a batch that cannot be encoded, a session
deleted and created again in one transaction, a transaction retried after the map
grew, and evictions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perdure.storage import Guard, SessionBusy, StaleGoal
from perdure.storage import lmdb_log as lmdb_module
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import GoalRevised, SessionDeleted, ToolCompleted
from tests.storage.test_contract import accepted, check_consistent, finished, tool_result, write


def cache_matches_log(log: LmdbLog) -> None:
    cached = dict(log._summaries)
    assert cached, "nothing was cached"
    for sid, info in cached.items():
        assert log.session_info(sid) == info, sid


def count_reads(log: LmdbLog, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    original = log._summary

    def counted(txn: Any, session_id: str) -> Any:
        reads.append(session_id)
        return original(txn, session_id)

    monkeypatch.setattr(log, "_summary", counted)
    return reads


def test_the_cache_is_the_log_through_refusals_failures_and_deletions(log: LmdbLog) -> None:
    write(log, [accepted("a", "u1")], [accepted("b", "v1")])
    cache_matches_log(log)
    # A revision, then a stale guard beside a batch that lands.
    write(log, [GoalRevised(session_id="a", goal_rev=1, text="n", request_id="r", at=1.0)])
    stale, landed = log.commit(
        [([tool_result("a", "late")], Guard("a", 0)), ([tool_result("b", "c1")], None)]
    )
    assert isinstance(stale, StaleGoal) and isinstance(landed, list)
    cache_matches_log(log)
    # A batch that cannot be encoded fails alone; its session's summary is untouched.
    bad = [tool_result("a", "b1"), tool_result("a", "b2", at=float("nan"))]
    failed, fine = write(log, bad, [tool_result("b", "c2")])
    assert isinstance(failed, ValueError) and isinstance(fine, list)
    cache_matches_log(log)
    check_consistent(log)  # (its oracle knows no deletions: checked by hand below)
    # A busy session is not deleted; a finished one is, and is created again in the
    # same transaction: its new summary starts from nothing.
    (busy,) = write(log, [SessionDeleted(deleted="a", at=2.0)])
    assert isinstance(busy, SessionBusy)
    write(log, [finished("b", "v1")])
    gone, again = write(log, [SessionDeleted(deleted="b", at=3.0)], [accepted("b", "v2")])
    assert isinstance(gone, list) and isinstance(again, list)
    info = log.session_info("b")
    assert info is not None and (info.records, info.open_submissions) == (1, 1)
    assert log.session_info("a") is not None  # the busy one, untouched
    cache_matches_log(log)
    # Deleted alone: nothing of it stays cached, and the next one of that name is new.
    write(log, [finished("b", "v2")])
    (gone,) = write(log, [SessionDeleted(deleted="b", at=4.0)])
    assert isinstance(gone, list) and "b" not in log._summaries
    write(log, [accepted("b", "v3")])
    info = log.session_info("b")
    assert info is not None and (info.records, info.open_submissions) == (1, 1)
    cache_matches_log(log)


def test_a_transaction_retried_after_the_map_grew_caches_only_its_outcome(
    tmp_path: Path,
) -> None:
    log = LmdbLog(tmp_path / "log", map_size=64 * 4096)
    try:
        write(log, [accepted("s", "u1")])
        grown_from = log.env.info()["map_size"]
        # Big enough that the first try runs out of map inside the transaction.
        big = [
            ToolCompleted(session_id=f"s{i % 7}", call_id=f"c{i}", output="x" * 2000, at=1.0)
            for i in range(400)
        ]
        (done,) = write(log, big)
        assert isinstance(done, list)
        assert log.env.info()["map_size"] > grown_from
        cache_matches_log(log)
        check_consistent(log)
    finally:
        log.close()


def test_a_session_written_lately_is_not_read_again(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdb_module, "SUMMARY_CACHE", 2)
    reads = count_reads(log, monkeypatch)
    write(log, [accepted("a", "u1")])
    write(log, [tool_result("a", "c1")])
    write(log, [tool_result("a", "c2")], [accepted("b", "v1")])
    assert reads == ["a", "b"]  # each read once, when first written by this process
    write(log, [accepted("c", "w1")])  # a third session: the least recent (a) goes
    assert set(log._summaries) == {"b", "c"}
    write(log, [tool_result("b", "c3")], [tool_result("a", "c4")])
    assert reads == ["a", "b", "c", "a"]
    cache_matches_log(log)
    check_consistent(log)


def test_a_reopened_log_reads_its_summaries_from_the_table(tmp_path: Path) -> None:
    log = LmdbLog(tmp_path / "log")
    try:
        write(log, [accepted("a", "u1")], [tool_result("a", "c1")])
    finally:
        log.close()
    again = LmdbLog(tmp_path / "log")
    try:
        assert again._summaries == {}
        write(again, [tool_result("a", "c2")])
        info = again.session_info("a")
        assert info is not None and info.records == 3
        cache_matches_log(again)
        check_consistent(again)
    finally:
        again.close()


def test_a_page_release_drops_the_cache_and_the_next_commit_reads_again(
    log: LmdbLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the writer does once the log is quiet: a cache left from a burst is memory
    nobody uses (and its objects would keep the allocator's pages)."""
    write(log, [accepted("a", "u1")], [accepted("b", "v1")])
    assert set(log._summaries) == {"a", "b"}
    log.release_mapped_pages()
    assert log._summaries == {}
    reads = count_reads(log, monkeypatch)
    write(log, [tool_result("a", "c1")])
    assert reads == ["a"]
    info = log.session_info("a")
    assert info is not None and info.records == 2
    cache_matches_log(log)
    check_consistent(log)
