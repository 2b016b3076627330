"""The PostgreSQL log on its own: the LMDB log's tests that apply, plus leases and fencing.

Against a real server (a throwaway cluster, a fresh database per test):

* group commit through the Journal: concurrent appenders share transactions, each
  gets its own increasing seqs, and what callers were told is what every read path
  returns; every write transaction runs on the writer thread;
* (guards, unencodable batches, the summaries and the active index, the writer
  thread's confinement: the backend contract of ``tests/storage/test_contract.py``,
  which runs against this backend too)
* corrupt frames (a flipped bit, a frame under another seq or another session) are
  reported by every read path, naming the seq;
* leases: a session leased by a live node is refused to another (``NotOwner`` names
  the owner); once expired it is taken with a higher epoch and the old owner's
  batches for it fail with ``SessionFenced`` while its other sessions commit;
  ``renew`` reports the loss; ``claim`` takes a fair share of orphans; ``close``
  hands leases over at once; ``takeover`` takes them from older nodes; a transaction
  of an expired owner stuck on the lease row is ended by the taker, a live one's not;
  ``confirm`` racing a renewal still answers yes; a renewal and a commit of the same
  rows never deadlock (both lock them in session id order);
* rebalancing: ``survey`` counts the active sessions each live node holds;
  ``hand_over`` fences the giver at once and names the target to its commands, the
  target takes it with ``accept``; a hand-over to a node gone is a release, one the
  target never takes lapses into an orphan; a node whose entry lapsed rejoins anew;
* a write connection killed under the log fails one call, then the log reconnects;
* the schema is created once under concurrent opens, and a newer one is refused;
* LISTEN/NOTIFY tells a node which sessions another node committed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio

from perdure.storage import (
    LogError,
    LogUnavailable,
    NotOwner,
    SessionFenced,
    SessionInfo,
)
from perdure.storage.codec import CorruptRecord
from perdure.storage.journal import open_journal
from perdure.storage.pg_log import SCHEMA_VERSION, PgLog, _log_error
from perdure.storage.records import (
    Committed,
    GoalRevised,
    InputAccepted,
    Record,
    SessionCreated,
    ToolCompleted,
    active_delta,
)

Open = Callable[..., PgLog]


@pytest.fixture
def open_pg(pg_url: str) -> Iterator[Open]:
    """Open PgLog nodes on the test's database; all closed after the test."""
    opened: list[PgLog] = []

    def make(**kw: object) -> PgLog:
        log = PgLog(pg_url, **kw)  # type: ignore[arg-type]
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def tool_result(sid: str, call: str, output: str = "ok", at: float = 1.0) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id=call, output=output, at=at)


def accepted(sid: str, sub: str) -> InputAccepted:
    return InputAccepted(
        session_id=sid, submission_id=sub, request_id=sub, text="t", body_hash="h", at=1.0
    )


def check_consistent(log: PgLog) -> list[Committed]:
    """Every read path agrees with the records (the PostgreSQL twin of ``_check``)."""
    everything = log.read_global()
    seqs = [c.seq for c in everything]
    assert seqs == sorted(set(seqs)), "global seqs must increase strictly"
    by_session: dict[str, list[Committed]] = {}
    for c in everything:
        if c.record.session_id:
            by_session.setdefault(c.record.session_id, []).append(c)
    active = []
    for sid, records in by_session.items():
        assert log.read_session(sid) == records
        goal_rev = count = 0
        for c in records:
            if isinstance(c.record, GoalRevised):
                goal_rev = c.record.goal_rev
            delta = active_delta(c.record)
            count = 0 if delta is None else max(0, count + delta)
        if count > 0:
            active.append(sid)
        assert log.session_info(sid) == SessionInfo(
            session_id=sid,
            first_seq=records[0].seq,
            last_seq=records[-1].seq,
            records=len(records),
            goal_rev=goal_rev,
            open_submissions=count,
        )
    assert sorted(i.session_id for i in log.sessions()) == sorted(by_session)
    assert log.active_sessions() == sorted(active)
    assert log.last_seq() == (seqs[-1] if seqs else 0)
    return everything


# -- group commit --------------------------------------------------------------------------


async def test_concurrent_appends_share_transactions_and_get_their_own_seqs(
    open_pg: Open,
) -> None:
    log = await trio.to_thread.run_sync(open_pg)
    sessions = [f"s{i}" for i in range(7)]
    for sid in sessions:
        await trio.to_thread.run_sync(log.acquire, sid)
    batches: dict[int, list[Record]] = {
        i: [tool_result(f"s{i % 7}", f"c{i}.{j}", f"out {i}.{j}") for j in range(1 + i % 4)]
        for i in range(100)
    }
    outcomes: dict[int, list[Committed]] = {}
    async with open_journal(log) as journal:

        async def one(key: int) -> None:
            outcomes[key] = await journal.append(batches[key])

        async with trio.open_nursery() as nursery:
            for key in batches:
                nursery.start_soon(one, key)
        stats = journal.stats
        writer = journal.writer_thread
    assert stats.appends == 100
    assert stats.transactions <= stats.appends // 2, f"barely batched: {stats}"
    assert writer is not None
    assert log.write_threads == {writer.ident}
    told = sorted((c for o in outcomes.values() for c in o), key=lambda c: c.seq)
    for key, outcome in outcomes.items():
        assert [c.record for c in outcome] == batches[key]
        assert [c.seq for c in outcome] == sorted(c.seq for c in outcome)
    everything = await trio.to_thread.run_sync(check_consistent, log)
    assert everything[1:] == told  # after the node's LogOpened


# -- corrupt frames ------------------------------------------------------------------------


def test_corrupt_frames_are_reported_by_every_read_path(open_pg: Open, pg_url: str) -> None:
    log = open_pg()
    log.acquire("s1")
    log.acquire("s2")
    (done,) = log.commit(
        [([tool_result("s1", "a"), tool_result("s1", "b"), tool_result("s2", "c")], None)]
    )
    assert isinstance(done, list)
    a, b, c = (x.seq for x in done)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # One flipped bit in a's payload.
        conn.execute(
            "UPDATE perdure_records SET frame = overlay(frame placing "
            "set_byte(substring(frame from 20 for 1), 0, get_byte(frame, 19) # 4) "
            "from 20 for 1) WHERE seq = %s",
            (a,),
        )
    with pytest.raises(CorruptRecord, match=rf"record {a} .*checksum mismatch"):
        log.read_session("s1")
    with pytest.raises(CorruptRecord, match=rf"record {a} "):
        log.read_global()
    assert [x.seq for x in log.read_session("s1", after=a)] == [b]  # the rest still reads
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # b's frame copied under c's seq: the CRC covers the seq.
        conn.execute(
            "UPDATE perdure_records SET frame = (SELECT frame FROM perdure_records "
            "WHERE seq = %s) WHERE seq = %s",
            (b, c),
        )
    with pytest.raises(CorruptRecord, match=rf"record {c} .*checksum mismatch"):
        log.read_session("s2")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # A sound frame under the wrong session.
        conn.execute("UPDATE perdure_records SET session_id = 's2' WHERE seq = %s", (b,))
    with pytest.raises(CorruptRecord, match=rf"record {b} .*belongs to 's1'"):
        log.read_session("s2")


# -- leases and fencing --------------------------------------------------------------------


def test_a_live_lease_is_refused_naming_its_owner(open_pg: Open) -> None:
    a = open_pg(node_id="node-a", lease_ttl=30)
    b = open_pg(node_id="node-b", lease_ttl=30)
    a.acquire("s1")
    with pytest.raises(NotOwner, match=r"owned by node node-a \(pid \d+ on .*\)") as caught:
        b.acquire("s1")
    assert caught.value.owner == "node-a"
    assert 25 < caught.value.expires_in <= 30
    (fenced,) = b.commit([([tool_result("s1", "intruder")], None)])
    assert isinstance(fenced, SessionFenced)
    assert "node-b holds no lease" in str(fenced)
    assert a.read_session("s1") == []


def test_expired_lease_is_taken_over_and_the_old_owner_fenced(open_pg: Open) -> None:
    a = open_pg(node_id="node-a", lease_ttl=0.5)
    b = open_pg(node_id="node-b", lease_ttl=30)
    a.acquire("s1")
    a.acquire("s2")
    (first,) = a.commit([([tool_result("s1", "before")], None)])
    assert isinstance(first, list)
    time.sleep(0.7)  # a "pauses" past its lease without renewing
    b.acquire("s1")
    assert b.held() == {"s1": 2}  # the takeover bumped the epoch
    mine, theirs = a.commit(
        [([tool_result("s2", "still mine")], None), ([tool_result("s1", "late")], None)]
    )
    assert isinstance(mine, list)
    assert isinstance(theirs, SessionFenced)
    assert theirs.session_id == "s1"
    assert "node node-b holds it at epoch 2" in str(theirs)
    assert a.held() == {"s2": 1}  # the fenced commit dropped s1 at once
    assert a.confirm("s1") is False  # so a tool of s1 would not start
    with pytest.raises(NotOwner, match="node-b"):
        a.acquire("s1")  # and a command for it is sent to its owner
    assert a.renew() == []  # s2 is renewed; s1 is no longer counted
    (theirs_ok,) = b.commit([([tool_result("s1", "new owner")], None)])
    assert isinstance(theirs_ok, list)
    assert [c.record.call_id for c in b.read_session("s1")] == ["before", "new owner"]  # type: ignore[union-attr]
    assert theirs_ok[0].seq > first[0].seq


def test_renew_reports_a_lease_taken_over(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=0.5)
    b = open_pg(node_id="b", lease_ttl=30)
    a.acquire("s1")
    a.acquire("s2")
    time.sleep(0.7)
    b.acquire("s1")
    assert a.renew() == ["s1"]  # s2 expired too, but nobody took it: still a's
    assert a.held() == {"s2": 1}
    (ok,) = a.commit([([tool_result("s2", "late but safe")], None)])
    assert isinstance(ok, list)


def test_a_renewal_and_a_commit_of_the_same_rows_never_deadlock(open_pg: Open, pg_url: str) -> None:
    """Both lock lease rows in session id order, whatever the rows' order on disk.

    A commit holding "b" (as an ordered commit of {"b", "c"} does, before it takes "c")
    while the heartbeat renews {"a", "b", "c"}: the renewal waits at "b" holding only
    "a", so the commit takes "c" and finishes, and then the renewal does. Taken in the
    table's order ("c" was written first), the renewal would hold "c" while waiting for
    "b": a deadlock, ended only by the lock timeout.
    """
    log = open_pg(node_id="n", lease_ttl=10)
    for sid in ("c", "a", "b"):  # stored in this order
        log.acquire(sid)
    renewed: list[list[str]] = []
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET lock_timeout = '5s'")
        conn.execute("SELECT 1 FROM perdure_leases WHERE session_id = 'b' FOR UPDATE")
        renewal = threading.Thread(target=lambda: renewed.append(log.renew()))
        renewal.start()
        time.sleep(0.3)  # the renewal now waits for "b"
        began = time.monotonic()
        conn.execute("SELECT 1 FROM perdure_leases WHERE session_id = 'c' FOR UPDATE")
        took = time.monotonic() - began
        conn.commit()
        renewal.join(10)
    assert took < 0.5, f"the commit waited {took:.2f}s for a row the renewal held"
    assert renewed == [[]], "the renewal failed or reported a lease lost"
    assert log.held() == {"a": 1, "b": 1, "c": 1}


def test_a_stuck_transaction_of_an_expired_owner_is_ended_by_the_taker(
    open_pg: Open, pg_url: str
) -> None:
    """A node stopped mid-commit keeps its lease rows locked; the taker ends that."""
    a = open_pg(node_id="node-a", lease_ttl=0.4)
    a.acquire("s1")
    with psycopg.connect(pg_url, application_name="perdure:node-a") as stuck:
        # Like a node stopped mid-pipeline: the row is locked, the server waits on.
        stuck.execute("SET idle_in_transaction_session_timeout = 0")
        stuck.execute("SELECT 1 FROM perdure_leases WHERE session_id = 's1' FOR UPDATE")
        live = open_pg(node_id="node-c", lease_ttl=0.4)
        with pytest.raises(LogError, match="lock timeout"):
            live.acquire("s1")  # not expired yet: nobody may end a live owner's work
        assert stuck.execute("SELECT 1").fetchone() == (1,)
        time.sleep(0.5)
        b = open_pg(node_id="node-b", lease_ttl=0.4)  # it waits half a TTL for the lock
        b.acquire("s1")
        assert b.held() == {"s1": 2}
        with pytest.raises(psycopg.OperationalError):
            stuck.execute("SELECT 1")


def test_claim_takes_a_fair_share_of_orphans(open_pg: Open) -> None:
    dead = open_pg(node_id="dead", lease_ttl=0.5)
    for i in range(10):
        dead.acquire(f"s{i}")
        dead.commit([([accepted(f"s{i}", "u")], None)])
    b = open_pg(node_id="b", lease_ttl=30)
    c = open_pg(node_id="c", lease_ttl=30)
    assert b.claim() == []  # the dead node's leases have not expired yet
    time.sleep(0.7)
    # "dead" still counts as a live node until its own row expires: share ceil(10/3)...
    first = b.claim()
    # ...once its row expired too, the two live nodes split the rest.
    time.sleep(0.1)
    second = c.claim()
    assert 1 <= len(first) <= 5
    assert set(first).isdisjoint(second)
    assert len(first) + len(second) <= 10
    more_b, more_c = b.claim(), c.claim()
    taken = set(first) | set(second) | set(more_b) | set(more_c)
    assert taken == {f"s{i}" for i in range(10)}, "every orphan is taken"
    assert max(len(b.held()), len(c.held())) == 5


def test_close_hands_leases_over_at_once(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=30)
    b = open_pg(node_id="b", lease_ttl=30)
    a.acquire("s1")
    a.commit([([accepted("s1", "u")], None)])
    a.close()
    assert b.claim() == ["s1"]
    assert b.held() == {"s1": 2}


def test_takeover_takes_the_leases_of_older_nodes(open_pg: Open) -> None:
    old = open_pg(node_id="old", lease_ttl=30)
    old.acquire("s1")
    old.acquire("idle")
    old.commit([([accepted("s1", "u")], None)])
    new = open_pg(node_id="new", lease_ttl=30, takeover=True)
    assert new.claim() == ["s1"]  # every active session, at once
    new.acquire("idle")  # and any other on first use
    (fenced,) = old.commit([([tool_result("s1", "zombie")], None)])
    assert isinstance(fenced, SessionFenced)
    newer = open_pg(node_id="newer", lease_ttl=30)
    with pytest.raises(NotOwner, match="node new"):
        newer.acquire("s1")  # without takeover, a younger live node is respected


# -- rebalancing: surveys and hand-overs --------------------------------------------------


def test_a_survey_counts_the_active_sessions_each_live_node_holds(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=30)
    for i in range(3):
        a.acquire(f"s{i}")
        a.commit([([accepted(f"s{i}", "u")], None)])
    a.acquire("idle")  # held, but no unfinished work: not load
    a.commit([([SessionCreated(session_id="idle", at=1.0)], None)])
    b = open_pg(node_id="b", lease_ttl=30)
    survey = a.survey()
    assert survey.active == 3
    assert [(n.node_id, n.sessions) for n in survey.nodes] == [("a", 3), ("b", 0)]
    assert all(0 <= n.up_for < 30 for n in survey.nodes)
    assert b.survey().active == 3


def test_a_hand_over_fences_the_giver_and_the_target_takes_it(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=30)
    b = open_pg(node_id="b", lease_ttl=30)
    a.acquire("s1")
    a.commit([([accepted("s1", "u")], None)])
    assert a.hand_over("s1", "b") is True
    assert a.held() == {}
    (fenced,) = a.commit([([tool_result("s1", "late")], None)])
    assert isinstance(fenced, SessionFenced)  # the giver can never write again
    with pytest.raises(NotOwner, match="owned by node b"):
        a.acquire("s1")  # a command on the old node names the new owner at once
    assert [(n.node_id, n.sessions) for n in a.survey().nodes] == [("a", 0), ("b", 1)]
    assert a.claim() == [], "a lease handed over is not an orphan"
    assert b.accept() == ["s1"]
    assert b.held() == {"s1": 3}  # 1 (a), 2 (handed to b), 3 (taken by b)
    assert b.accept() == []
    (ok,) = b.commit([([tool_result("s1", "mine now")], None)])
    assert isinstance(ok, list)
    assert a.hand_over("s1", "b") is False  # not a's to give any more


def test_a_hand_over_to_a_node_gone_releases_the_lease(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=30)
    gone = open_pg(node_id="gone", lease_ttl=30)
    gone.close()
    a.acquire("s1")
    a.commit([([accepted("s1", "u")], None)])
    assert a.hand_over("s1", "gone") is False
    assert a.held() == {}
    c = open_pg(node_id="c", lease_ttl=30)
    assert c.claim() == ["s1"]  # released: an orphan for whoever claims it


def test_a_hand_over_the_target_never_takes_lapses_into_an_orphan(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=0.5)
    target = open_pg(node_id="target", lease_ttl=0.5)  # it will never accept
    c = open_pg(node_id="c", lease_ttl=30)
    a.acquire("s1")
    a.commit([([accepted("s1", "u")], None)])
    assert a.hand_over("s1", "target")
    assert c.claim() == []
    time.sleep(0.7)  # one TTL: the offer lapses (and so do a and target)
    assert c.claim() == ["s1"]
    assert target.accept() == [], "too late: the lease is c's"


def test_a_node_whose_entry_lapsed_rejoins_as_a_new_member(open_pg: Open) -> None:
    a = open_pg(node_id="a", lease_ttl=0.5)
    time.sleep(0.3)
    a.renew()  # in time: still the same membership
    (before,) = a.survey().nodes
    assert before.up_for >= 0.3
    time.sleep(0.7)  # cut off past its TTL: the others counted it gone
    assert a.survey().nodes == ()
    a.renew()
    (after,) = a.survey().nodes
    assert after.up_for < 0.2, "it waits out the joining grace again"


def test_confirm_is_not_fooled_by_a_renewal_meanwhile(
    open_pg: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = open_pg(node_id="a", lease_ttl=0.5)
    a.acquire("s1")
    time.sleep(0.45)  # no longer certainly fresh: confirm asks the database
    real = a._reader
    lost: list[list[str]] = []

    @contextlib.contextmanager
    def renewing_meanwhile() -> Iterator[psycopg.Connection[Any]]:
        if not lost:  # the heartbeat renews while confirm waits for the database
            lost.append([])
            lost[0] = a.renew()
        with real() as conn:
            yield conn

    monkeypatch.setattr(a, "_reader", renewing_meanwhile)
    assert a.confirm("s1") is True, "a renewal is no reason to say the lease is lost"
    assert lost == [[]]
    assert a.held() == {"s1": 1}


# -- connections, schema, notifications ----------------------------------------------------


def test_a_killed_write_connection_fails_one_call_then_reconnects(
    open_pg: Open, pg_url: str
) -> None:
    log = open_pg()
    log.acquire("s")
    log.commit([([tool_result("s", "a")], None)])
    assert log._wconn is not None
    pid = log._wconn.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(LogError):
        log.commit([([tool_result("s", "lost")], None)])
    (again,) = log.commit([([tool_result("s", "b")], None)])
    assert isinstance(again, list)
    assert [c.record.call_id for c in log.read_session("s")] == ["a", "b"]  # type: ignore[union-attr]


def test_schema_is_created_once_under_concurrent_opens(pg_url: str) -> None:
    logs: list[PgLog] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            logs.append(PgLog(pg_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert sorted(log.epoch for log in logs) == [1, 2, 3, 4, 5, 6]
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT version FROM perdure_schema").fetchall() == [
                (SCHEMA_VERSION,)
            ]
    finally:
        for log in logs:
            log.close()


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    PgLog(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE perdure_schema SET version = version + 1")
    with pytest.raises(LogError, match="upgrade perdure"):
        PgLog(pg_url)


def test_readonly_open_of_an_empty_database_says_so(pg_url: str) -> None:
    with pytest.raises(FileNotFoundError, match="no perdure log"):
        PgLog(pg_url, readonly=True)


def test_another_nodes_commit_wakes_the_listener(open_pg: Open) -> None:
    reader = open_pg(node_id="reader")
    writer = open_pg(node_id="writer")
    writer.acquire("s1")
    woken: list[frozenset[str] | None] = []
    stop = threading.Event()
    ready = threading.Event()

    def wake(sessions: frozenset[str] | None) -> None:
        woken.append(sessions)
        ready.set()

    listener = threading.Thread(target=reader.listen, args=(wake, stop))
    listener.start()
    try:
        assert ready.wait(10)  # wake(None) once listening
        writer.commit([([tool_result("s1", "x")], None)])
        deadline = time.monotonic() + 10
        while frozenset({"s1"}) not in woken:
            assert time.monotonic() < deadline, f"no notification: {woken}"
            time.sleep(0.02)
    finally:
        stop.set()
        listener.join()
    assert woken[0] is None


def test_session_created_needs_the_lease_too(open_pg: Open) -> None:
    log = open_pg()
    (refused,) = log.commit([([SessionCreated(session_id="new", at=1.0)], None)])
    assert isinstance(refused, SessionFenced)
    log.acquire("new")
    (ok,) = log.commit([([SessionCreated(session_id="new", at=1.0)], None)])
    assert isinstance(ok, list)


def test_only_errors_that_may_pass_count_as_an_outage() -> None:
    """An outage is waited out; a schema mismatch or a missing privilege is not."""
    for passing in (
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown(),
        psycopg.errors.LockNotAvailable(),
        psycopg.InterfaceError("the connection is closed"),
    ):
        assert isinstance(_log_error("x", passing), LogUnavailable), passing
    for lasting in (
        psycopg.errors.UndefinedTable(),
        psycopg.errors.InsufficientPrivilege(),
        psycopg.errors.UniqueViolation(),
    ):
        error = _log_error("x", lasting)
        assert isinstance(error, LogError) and not isinstance(error, LogUnavailable), lasting
