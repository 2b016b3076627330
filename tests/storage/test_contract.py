"""The backend contract: every ``LogBackend`` (LMDB, in memory, PostgreSQL) keeps the same promises.

Each test runs once per backend, through the interface only:

* a stale guard writes nothing (no record, no summary, no session) and spares the
  other batches of its transaction; a revision earlier in the same transaction is
  in force for the batches after it;
* an unencodable batch fails alone, the others commit;
* the session summaries and the active index follow the records (inputs, finished
  runs, a parked session), checked against an oracle written here, not the
  backend's own rule;
* ``commit`` is refused off the bound writer thread and writes nothing;
* ``claim`` gives the active sessions in recovery order (last record oldest first);
* session summaries page by id (``after``, ``limit``) and filter the active ones, and
  page newest first by creation (``newest_sessions``), deletions included;
* reads page correctly (``after``, ``limit``), ``scan_frames`` holds exactly the
  frames of ``read_global``, every open is a ``LogOpened`` system record;
* through the Journal, concurrent appenders each get their own increasing seqs,
  what they were told is what every read path returns, and a subscriber hears
  every committed record once, in seq order, never a refused one; an append whose
  caller is cancelled still commits and answers;
* a takeover fences the old writer: its next batch is not written and it hears
  ``LogFenced`` (LMDB and memory: the whole log; PostgreSQL: ``SessionFenced``,
  the session's lease).

PostgreSQL runs against the throwaway server of ``tests/conftest.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure.storage import Guard, LogBackend, LogFenced, SessionInfo, StaleGoal, open_log
from perdure.storage.codec import decode
from perdure.storage.journal import open_journal
from perdure.storage.memory_log import MemoryLog
from perdure.storage.records import (
    Committed,
    CompensationFinished,
    CompensationRequested,
    GoalRevised,
    InputAccepted,
    LogOpened,
    Record,
    RunFinished,
    SessionDeleted,
    SessionParked,
    ToolCompleted,
)
from tests.support.procs import ROOT

KINDS = ("lmdb", "memory", "pg")


class Backend:
    """Opens handles on one log of one kind; closes them all after the test."""

    def __init__(self, kind: str, location: Any) -> None:
        self.kind = kind
        self.location = location
        self.first: MemoryLog | None = None
        self.opened: list[LogBackend] = []

    def open(self, *, takeover: bool = False, name: str = "a") -> LogBackend:
        log: LogBackend
        if self.kind == "memory":
            if self.first is None:
                self.first = log = MemoryLog()
            else:
                log = self.first.reopen(takeover=takeover)
        elif self.kind == "pg":
            log = open_log(self.location, takeover=takeover, node_id=name, lease_ttl=30)
        else:
            log = open_log(self.location, takeover=takeover)
        self.opened.append(log)
        return log

    def close(self) -> None:
        for log in self.opened:
            log.close()


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    location: Any = tmp_path / "log" if kind == "lmdb" else None
    if kind == "pg":
        location = request.getfixturevalue("pg_url")
    opened = Backend(kind, location)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def log(backend: Backend) -> LogBackend:
    return backend.open()


def tool_result(sid: str, call: str, at: float = 1.0) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id=call, output=f"{sid}/{call}", at=at)


def accepted(sid: str, sub: str) -> InputAccepted:
    return InputAccepted(
        session_id=sid, submission_id=sub, request_id=sub, text="t", body_hash="h", at=1.0
    )


def finished(sid: str, sub: str, status: Any = "completed") -> RunFinished:
    return RunFinished(
        session_id=sid, run_id=f"run-{sub}", submission_id=sub, status=status, at=1.0
    )


def write(log: LogBackend, *batches: list[Record], guard: Guard | None = None) -> list[Any]:
    for sid in {r.session_id for b in batches for r in b if r.session_id}:
        log.acquire(sid)
    if guard is not None:
        log.acquire(guard.session_id)
    return log.commit([(batch, guard) for batch in batches])


def expected_summaries(everything: list[Committed]) -> dict[str, SessionInfo]:
    """What each session's summary must say, folded here from the records (the oracle)."""
    out: dict[str, SessionInfo] = {}
    for c in everything:
        r, sid = c.record, c.record.session_id
        if not sid:
            continue
        old = out.get(sid)
        count = old.open_submissions if old else 0
        if isinstance(r, InputAccepted | CompensationRequested):
            count += 1
        elif (isinstance(r, RunFinished) and r.status != "interrupted") or isinstance(
            r, CompensationFinished
        ):
            count = max(0, count - 1)
        elif isinstance(r, SessionParked):
            count = 0
        out[sid] = SessionInfo(
            sid,
            first_seq=old.first_seq if old else c.seq,
            last_seq=c.seq,
            records=(old.records if old else 0) + 1,
            goal_rev=r.goal_rev if isinstance(r, GoalRevised) else (old.goal_rev if old else 0),
            open_submissions=count,
        )
    return out


def check_consistent(log: LogBackend) -> list[Committed]:
    """Every read path agrees with the records, and the summaries with the oracle."""
    everything = log.read_global()
    seqs = [c.seq for c in everything]
    assert seqs == sorted(set(seqs)), "global seqs must increase strictly"
    assert log.last_seq() == seqs[-1]
    assert [(s, decode(s, f)) for s, f in log.scan_frames()] == [
        (c.seq, c.record) for c in everything
    ]
    assert log.read_system() == [c for c in everything if isinstance(c.record, LogOpened)]
    summaries = expected_summaries(everything)
    for sid, info in summaries.items():
        assert log.read_session(sid) == [c for c in everything if c.record.session_id == sid]
        assert log.session_info(sid) == info
    assert sorted(log.sessions(), key=lambda i: i.session_id) == sorted(
        summaries.values(), key=lambda i: i.session_id
    )
    active = sorted(sid for sid, info in summaries.items() if info.open_submissions)
    assert sorted(log.active_sessions()) == active
    return everything


# -- guards and bad batches ---------------------------------------------------------------


def test_stale_guard_writes_nothing_and_spares_its_transaction(log: LogBackend) -> None:
    (opened,) = write(
        log, [GoalRevised(session_id="s1", goal_rev=2, text="n", request_id="r", at=1.0)]
    )
    assert isinstance(opened, list)
    a = [tool_result("s1", "a1"), tool_result("s1", "a2")]
    b = [tool_result("s1", "b1")]
    c = [tool_result("s2", "c1")]
    d = [tool_result("ghost", "d1")]
    for sid in ("s1", "s2", "ghost"):
        log.acquire(sid)
    ra, rb, rc, rd = log.commit(
        [(a, Guard("s1", 2)), (b, Guard("s1", 1)), (c, None), (d, Guard("ghost", 1))]
    )
    assert isinstance(ra, list)
    assert isinstance(rc, list)
    assert isinstance(rb, StaleGoal)
    assert (rb.expected, rb.found) == (1, 2)
    assert isinstance(rd, StaleGoal)
    assert (rd.expected, rd.found) == (1, 0)
    after = opened[0].seq
    assert [x.record for x in log.read_global(after=after)] == a + c
    assert [x.record for x in log.read_session("s1", after=after)] == a
    # A session that only appeared in a refused guard must not exist afterwards.
    assert log.session_info("ghost") is None
    assert "ghost" not in {info.session_id for info in log.sessions()}
    assert log.read_session("ghost") == []
    check_consistent(log)


def test_a_revision_earlier_in_the_same_transaction_is_in_force(log: LogBackend) -> None:
    revise = [GoalRevised(session_id="s1", goal_rev=1, text="t", request_id="r1", at=1.0)]
    late = [tool_result("s1", "late")]
    fresh = [tool_result("s1", "fresh")]
    log.acquire("s1")
    r1, r2, r3 = log.commit(
        [(revise, Guard("s1", 0)), (late, Guard("s1", 0)), (fresh, Guard("s1", 1))]
    )
    assert isinstance(r1, list)
    assert isinstance(r2, StaleGoal)
    assert (r2.expected, r2.found) == (0, 1)
    assert isinstance(r3, list)
    assert [x.record for x in log.read_session("s1")] == revise + fresh
    check_consistent(log)


def test_unencodable_batch_fails_alone_in_its_transaction(log: LogBackend) -> None:
    good = [tool_result("s1", "g1")]
    bad = [tool_result("s1", "b1"), tool_result("s1", "b2", at=float("nan"))]
    also_good = [accepted("s2", "u")]
    r1, r2, r3 = write(log, good, bad, also_good)
    assert isinstance(r2, ValueError)
    assert isinstance(r1, list)
    assert isinstance(r3, list)
    assert [x.record for x in log.read_global(after=1)] == good + also_good
    assert log.active_sessions() == ["s2"]
    check_consistent(log)


# -- summaries, the active index, reads ---------------------------------------------------


def test_summaries_and_active_index_follow_the_records(log: LogBackend) -> None:
    write(log, [accepted("s", "u1"), accepted("s", "u2")], [accepted("t", "v1")])
    assert sorted(log.active_sessions()) == ["s", "t"]
    write(log, [finished("s", "u1")], [finished("t", "v1", status="interrupted")])
    info = log.session_info("s")
    assert info is not None
    assert (info.records, info.open_submissions) == (3, 1)
    assert sorted(log.active_sessions()) == ["s", "t"]  # an interrupted run is unfinished work
    write(log, [SessionParked(session_id="s", reason="crashing", at=1.0)])
    assert log.active_sessions() == ["t"]
    write(log, [accepted("s", "u3")], [finished("t", "v1")])
    assert log.active_sessions() == ["s"]
    check_consistent(log)


def test_a_batch_of_several_sessions_records_indexes_and_sums_up_each(log: LogBackend) -> None:
    # A batch is nearly always one session's; one that interleaves sessions is still
    # indexed record by record and summed up per session.
    mixed = [
        accepted("a", "u1"),
        tool_result("a", "c1"),
        accepted("b", "v1"),
        tool_result("a", "c2"),
        finished("b", "v1"),
        tool_result("b", "c3"),
    ]
    (committed,) = write(log, mixed)
    seqs = [c.seq for c in committed]
    assert [c.record for c in log.read_session("a")] == [mixed[0], mixed[1], mixed[3]]
    assert [c.record for c in log.read_session("b")] == [mixed[2], mixed[4], mixed[5]]
    a, b = log.session_info("a"), log.session_info("b")
    assert a is not None and b is not None
    assert (a.first_seq, a.last_seq, a.records, a.open_submissions) == (seqs[0], seqs[3], 3, 1)
    assert (b.first_seq, b.last_seq, b.records, b.open_submissions) == (seqs[2], seqs[5], 3, 0)
    assert log.active_sessions() == ["a"]
    check_consistent(log)


def test_claim_gives_the_active_sessions_longest_waiting_first(backend: Backend) -> None:
    """Recovery order: by each session's last record, oldest first, not by session id;
    a finished session is not claimed (PostgreSQL: by a node taking over the writer's)."""
    log = backend.open()
    write(log, [accepted("b", "u")])
    write(log, [accepted("a", "u")])
    write(log, [accepted("c", "u")])
    write(log, [accepted("d", "u")])
    write(log, [tool_result("a", "later")])  # a moved after c and d
    write(log, [finished("d", "u")])
    claimer = backend.open(takeover=True, name="new") if backend.kind == "pg" else log
    assert claimer.claim() == ["b", "c", "a"]


def test_session_summaries_page_by_id_and_filter_the_active(log: LogBackend) -> None:
    for sid in ("b", "a", "d", "c"):
        write(log, [accepted(sid, "u")])
    write(log, [finished("d", "u")])

    def ids(**page: Any) -> list[str]:
        return [i.session_id for i in log.sessions(**page)]

    assert ids() == ["a", "b", "c", "d"]
    assert ids(limit=2) == ["a", "b"]
    assert ids(after="b") == ["c", "d"]
    assert ids(after="b", limit=1) == ["c"]
    assert ids(after="bb") == ["c", "d"]  # an id that is not in the log still places the page
    assert ids(after="d") == []
    assert ids(after="b" + "z" * 2000) == ["c", "d"]  # longer than any key LMDB takes
    assert ids(limit=0) == []
    assert ids(active=True) == ["a", "b", "c"]
    assert ids(active=True, after="a", limit=1) == ["b"]
    (d,) = log.sessions(after="c", limit=1)
    assert d == log.session_info("d")  # a page holds the same summary as a lookup
    assert [i.open_submissions for i in log.sessions(limit=2)] == [1, 1]


def test_the_newest_sessions_page_by_creation_and_follow_deletions(log: LogBackend) -> None:
    """Newest first by each session's first record, not by id nor by its latest record;
    a page starts below the previous page's last ``first_seq``; a deleted session leaves
    the order, and one created again under its id comes back as the newest."""
    for sid in ("b", "a", "d", "c"):
        write(log, [accepted(sid, "u")])
    write(log, [tool_result("b", "later")])  # b's latest record is the newest: no matter
    write(log, [finished("d", "u")])

    def ids(**page: Any) -> list[str]:
        return [i.session_id for i in log.newest_sessions(**page)]

    assert ids() == ["c", "d", "a", "b"]
    assert ids(limit=2) == ["c", "d"]
    (_, last) = log.newest_sessions(limit=2)
    assert ids(before=last.first_seq) == ["a", "b"]
    assert ids(before=last.first_seq, limit=1) == ["a"]
    assert ids(before=log.session_info("b").first_seq) == []  # type: ignore[union-attr]
    assert ids(before=1 << 70) == ["c", "d", "a", "b"]  # past every seq: from the newest
    assert ids(limit=0) == []
    (c,) = log.newest_sessions(limit=1)
    assert c == log.session_info("c")  # a page holds the same summary as a lookup

    assert ids(active=True) == ["c", "a", "b"]  # d's run finished
    assert ids(active=True, before=log.session_info("a").first_seq) == ["b"]  # type: ignore[union-attr]
    assert ids(active=True, limit=1) == ["c"]

    (deleted,) = log.commit([([SessionDeleted(deleted="d", at=2.0)], None)])
    assert isinstance(deleted, list)
    assert ids() == ["c", "a", "b"]
    write(log, [accepted("d", "again")])
    assert ids() == ["d", "c", "a", "b"]


def test_reads_page_by_after_and_limit(log: LogBackend) -> None:
    for i in range(6):
        write(log, [tool_result("s", f"c{i}"), tool_result("other", f"o{i}")])
    mine = log.read_session("s")
    assert [c.record.call_id for c in mine] == [f"c{i}" for i in range(6)]  # type: ignore[union-attr]
    assert log.read_session("s", after=mine[1].seq, limit=2) == mine[2:4]
    assert log.read_session("s", after=mine[-1].seq) == []
    everything = log.read_global()
    assert log.read_global(after=everything[2].seq, limit=3) == everything[3:6]
    assert log.read_session("nobody") == []
    assert log.session_info("nobody") is None
    check_consistent(log)


def test_commit_is_refused_off_the_writer_thread(log: LogBackend) -> None:
    log.acquire("s")
    last = log.last_seq()
    log.bind_writer(threading.Thread(target=lambda: None))
    with pytest.raises(RuntimeError, match="only the journal's writer thread may write"):
        log.commit([([tool_result("s", "rogue")], None)])
    assert log.read_session("s") == []
    assert log.last_seq() == last


# -- through the Journal -------------------------------------------------------------------


async def test_journal_appends_get_their_own_seqs_and_are_published_once(
    log: LogBackend,
) -> None:
    sessions = [f"s{i}" for i in range(5)]
    for sid in sessions:
        await trio.to_thread.run_sync(log.acquire, sid)
    batches: dict[int, list[Record]] = {
        i: [tool_result(f"s{i % 5}", f"c{i}.{j}") for j in range(1 + i % 3)] for i in range(40)
    }
    outcomes: dict[int, list[Committed]] = {}
    heard: list[int | None] = []
    async with open_journal(log) as journal:
        everyone = journal.bus.subscribe(None)
        (revision,) = await journal.append(
            [GoalRevised(session_id="s0", goal_rev=1, text="t", request_id="r", at=1.0)]
        )

        async def one(key: int) -> None:
            outcomes[key] = await journal.append(batches[key])

        async def stale() -> None:
            with pytest.raises(StaleGoal):
                await journal.append([tool_result("s0", "stale")], guard=Guard("s0", 0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stale)
            for key in batches:
                nursery.start_soon(one, key)
        everyone.close()
        heard = [event.seq async for event in everyone]
    told = sorted((c for o in outcomes.values() for c in o), key=lambda c: c.seq)
    for key, outcome in outcomes.items():
        assert [c.record for c in outcome] == batches[key]
        assert [c.seq for c in outcome] == sorted(c.seq for c in outcome)
    everything = await trio.to_thread.run_sync(check_consistent, log)
    assert everything[-len(told) - 1 :] == [revision, *told]
    assert heard == [revision.seq] + [c.seq for c in told]  # once each, in order, none refused
    assert all(c.record.call_id != "stale" for c in told)  # type: ignore[union-attr]


async def test_an_append_whose_caller_is_cancelled_still_commits(log: LogBackend) -> None:
    # Once an append is made its caller learns the outcome: the commit is not undone
    # by a cancellation, in the threaded Journal and in the inline one alike.
    await trio.to_thread.run_sync(log.acquire, "s")
    record = tool_result("s", "c1")
    async with open_journal(log) as journal:
        with trio.CancelScope() as scope:
            scope.cancel()
            done = await journal.append([record])
            told = [c.record for c in done]
            await trio.lowlevel.checkpoint()  # here the cancellation is delivered
            told.append(tool_result("s", "never reached"))
        assert scope.cancelled_caught
        assert told == [record]
        assert [c.record for c in await journal.read_session("s")] == [record]


# -- fencing --------------------------------------------------------------------------------


def test_a_takeover_fences_the_old_writer(backend: Backend) -> None:
    old = backend.open(name="old")
    (before,) = write(old, [accepted("s1", "u")])
    assert isinstance(before, list)
    if backend.kind == "lmdb":
        # py-lmdb opens an environment once per process: another process takes it over.
        where = str(backend.location)
        take = f"from perdure.storage import open_log; open_log({where!r}, takeover=True).close()"
        subprocess.run([sys.executable, "-c", take], cwd=ROOT, check=True)
    else:
        new = backend.open(takeover=True, name="new")
        assert new.claim() == ["s1"]
    try:
        results = old.commit([([tool_result("s1", "zombie")], None)])
    except LogFenced as exc:  # the whole log was taken (LMDB, memory)
        fenced: Exception = exc
    else:  # the session's lease was taken (PostgreSQL)
        (fenced,) = results
    assert isinstance(fenced, LogFenced)
    if backend.kind == "lmdb":
        old.close()
        new = backend.open(name="new")
        assert new.claim() == ["s1"]
    assert new.epoch > old.epoch
    new.acquire("s1")
    (after,) = new.commit([([tool_result("s1", "mine")], None)])
    assert isinstance(after, list)
    calls = [getattr(c.record, "call_id", None) for c in new.read_session("s1")]
    assert calls == [None, "mine"]  # the input, then the new owner's record; no zombie
    check_consistent(new)


def test_open_log_selects_each_backend(tmp_path: Path) -> None:
    memory = open_log(":memory:")
    try:
        assert isinstance(memory, MemoryLog)
        assert isinstance(memory, LogBackend)
        assert memory.inline and not memory.multi_node
        assert open_log(memory) is memory  # an opened backend is used as it is
        assert [type(c.record) for c in memory.read_global()] == [LogOpened]
        assert open_log(":memory:") is not memory  # each ":memory:" is a new, empty log
    finally:
        memory.close()
    with pytest.raises(ValueError, match="map_size"):
        open_log(":memory:", map_size=1 << 20)
    with pytest.raises(TypeError, match="not int"):
        open_log(42)  # type: ignore[arg-type]
