"""Deleting a session, on every backend: the ``SessionDeleted`` marker and the removal of
the session's records are one transaction, refused while the session has work.

Run against LMDB, the in-memory log and PostgreSQL with the backend fixtures of the
storage contract (``tests.storage.test_contract``).
"""

from __future__ import annotations

from perdure.storage import LogBackend, SessionBusy
from perdure.storage.records import SessionDeleted
from tests.storage.test_contract import (  # noqa: F401 - the fixtures
    accepted,
    backend,
    finished,
    log,
    tool_result,
    write,
)


def test_a_finished_session_goes_whole_and_a_busy_one_stays(log: LogBackend) -> None:  # noqa: F811
    write(log, [accepted("done", "in1"), tool_result("done", "c1"), finished("done", "in1")])
    write(log, [accepted("busy", "in1")])
    write(log, [tool_result("other", "c1")])
    before = log.read_session("busy")
    last = log.last_seq()
    count = len(log.read_global())

    (refused,) = log.commit([([SessionDeleted(deleted="busy", at=2.0)], None)])
    assert isinstance(refused, SessionBusy)
    assert log.read_session("busy") == before and log.last_seq() == last

    log.acquire("done")
    (result,) = log.commit([([SessionDeleted(deleted="done", reason="test", at=2.0)], None)])
    assert not isinstance(result, Exception)
    (marker,) = result
    assert isinstance(marker.record, SessionDeleted) and marker.record.records == 3
    assert marker.seq > last and log.last_seq() == marker.seq  # (PostgreSQL may skip)
    assert log.read_session("done") == [] and log.session_info("done") is None
    assert sorted(i.session_id for i in log.sessions()) == ["busy", "other"]
    assert log.active_sessions() == ["busy"]
    seqs = [c.seq for c in log.read_global()]
    assert len(seqs) == count - 3 + 1, "the deleted records are gone from the global order"
    assert [s for s, _ in log.scan_frames()] == seqs
    assert marker in log.read_system()
    # The next record gets a new number: a deleted one is never reused.
    (after,) = write(log, [tool_result("other", "c2")])
    assert after[0].seq > marker.seq
