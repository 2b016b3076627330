"""The Journal over a log shared by several nodes: ownership calls, wake-ups, reads.

With a multi-node backend (PostgreSQL) the Journal adds two things to what it does
for LMDB (the module docstring of ``perdure.storage.journal``): its ownership calls
(acquire, release, claim, renew, survey, hand over, accept, confirm) go to the log
in a worker thread, since each is a database round trip, and a listener thread turns
other nodes' commits into wake-ups (events of kind ``WAKE``) for the event streams
that ``follow`` those sessions. The promises proven here:

* every ownership call reaches the log with the caller's arguments, in a worker
  thread, and its answer (or its refusal) comes back to the caller; on a single-node
  log, ``acquire`` is granted on the trio thread, there is no lease to release, and
  ``confirm`` asks nothing; on a multi-node log, ``confirm`` asks the log only when
  the lease is not known to be fresh;
* a notification of another node's commits wakes every stream that follows one of
  its sessions, and only those; a notification that may have missed some (``None``)
  wakes every follower; a notification that comes after the trio run ended is
  dropped, not raised in the listener thread;
* the listener is a named daemon thread that is gone once the Journal closes;
* reads of a log that is not local are not held to the local log's few threads.

``tests/postgres`` runs the same paths against a real PostgreSQL; this module runs
in the test process over a real LMDB log that a thin wrapper (``_Node``) presents as
one node of a cluster, so that the mutation campaign (docs/RELIABILITY.md) can switch
a mutant of ``journal.py`` on under it, and so that each answer of the cluster is
chosen by the test.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio

from perdure.storage.backend import ClusterView, NodeLoad, Wake
from perdure.storage.bus import Event, Subscription
from perdure.storage.errors import NotOwner
from perdure.storage.journal import LOCAL_READ_THREADS, WAKE, Journal, open_journal
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import ToolCompleted

VIEW = ClusterView(nodes=(NodeLoad("here", 2, 5.0), NodeLoad("there", 1, 9.0)), active=3)


class _Node:
    """A real LMDB log presented as one node of a cluster whose answers the test sets.

    Records and reads go to the LMDB log. The ownership hooks note each call (its
    name, arguments and thread) and answer as a cluster would: ``elsewhere`` maps the
    sessions another node holds to that node, ``fresh`` holds the sessions whose lease
    is known to be fresh. ``listen`` calls ``wake`` with each notification a test
    posts (``notify``) until the Journal stops it.
    """

    local = False  # a database over the network, as PostgreSQL is

    def __init__(self, log: LmdbLog, *, multi_node: bool = True) -> None:
        self.log = log
        self.multi_node = multi_node
        self.calls: list[tuple[str, tuple[Any, ...], int]] = []
        self.elsewhere: dict[str, str] = {}
        self.fresh: set[str] = set()
        self.confirmed = False  # what ``confirm`` answers
        self.lost = ["s-lost"]  # what ``renew`` answers
        self.wake: Wake | None = None  # the Journal's, once it listens
        self.listening = threading.Event()
        self.token: trio.lowlevel.TrioToken | None = None  # of the run the Journal is in
        self._notes: queue.SimpleQueue[frozenset[str] | trio.Event | None] = queue.SimpleQueue()

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)

    def _note(self, name: str, *args: Any) -> None:
        self.calls.append((name, args, threading.get_ident()))

    def acquire(self, session_id: str) -> None:
        self._note("acquire", session_id)
        if session_id in self.elsewhere:
            raise NotOwner(session_id, self.elsewhere[session_id], 3.0)

    def release_session(self, session_id: str) -> None:
        self._note("release_session", session_id)

    def claim(self) -> list[str]:
        self._note("claim")
        return ["s-orphan"]

    def renew(self) -> list[str]:
        self._note("renew")
        return self.lost

    def survey(self) -> ClusterView:
        self._note("survey")
        return VIEW

    def hand_over(self, session_id: str, target: str) -> bool:
        self._note("hand_over", session_id, target)
        return target == "there"

    def accept(self) -> list[str]:
        self._note("accept")
        return ["s-given"]

    def is_fresh(self, session_id: str) -> bool:
        self._note("is_fresh", session_id)
        return session_id in self.fresh

    def confirm(self, session_id: str) -> bool:
        self._note("confirm", session_id)
        return self.confirmed

    def listen(self, wake: Wake, stop: threading.Event) -> None:
        self.wake = wake
        self.listening.set()
        while not stop.is_set():
            try:
                note = self._notes.get(timeout=0.02)
            except queue.Empty:
                continue
            if isinstance(note, trio.Event):
                assert self.token is not None
                self.token.run_sync_soon(note.set)
            else:
                wake(note)

    def notify(self, sessions: frozenset[str] | None) -> None:
        """Another node committed records of ``sessions`` (None: some may be missed)."""
        self._notes.put(sessions)

    async def settled(self) -> None:
        """Every notification posted so far has been delivered on the trio thread.

        A marker follows them through the listener thread into the trio token's
        queue, whose callbacks from one thread run in the order they were queued.
        """
        marker = trio.Event()
        self._notes.put(marker)
        with trio.fail_after(10):
            await marker.wait()


@asynccontextmanager
async def journal_of(node: _Node) -> AsyncIterator[Journal]:
    node.token = trio.lowlevel.current_trio_token()
    async with open_journal(node) as journal:  # type: ignore[arg-type]
        if node.multi_node:
            assert await trio.to_thread.run_sync(node.listening.wait, 10), "it never listened"
        yield journal


def result(sid: str) -> ToolCompleted:
    return ToolCompleted(session_id=sid, call_id="c", output="ok", at=1.0)


# -- ownership ---------------------------------------------------------------------------


async def test_each_ownership_call_reaches_the_log_in_a_worker_thread(log: LmdbLog) -> None:
    node = _Node(log)
    node.elsewhere["s-taken"] = "there"
    async with journal_of(node) as journal:
        await journal.acquire("s1")
        with pytest.raises(NotOwner) as refused:
            await journal.acquire("s-taken")
        assert refused.value.owner == "there" and refused.value.session_id == "s-taken"
        await journal.release_session("s1")
        assert await journal.claim() == ["s-orphan"]
        assert await journal.renew() == ["s-lost"]
        assert await journal.survey() == VIEW
        assert await journal.hand_over("s1", "there") is True
        assert await journal.hand_over("s2", "gone") is False
        assert await journal.accept() == ["s-given"]
    trio_thread = threading.get_ident()
    assert [(name, args) for name, args, _ in node.calls] == [
        ("acquire", ("s1",)),
        ("acquire", ("s-taken",)),
        ("release_session", ("s1",)),
        ("claim", ()),
        ("renew", ()),
        ("survey", ()),
        ("hand_over", ("s1", "there")),
        ("hand_over", ("s2", "gone")),
        ("accept", ()),
    ]
    assert trio_thread not in {thread for _, _, thread in node.calls}


async def test_a_single_node_log_grants_at_once_and_has_nothing_to_release(
    log: LmdbLog,
) -> None:
    """One owner: ``acquire`` is answered on the trio thread (the owner's lock fences
    every session), there is no lease to give up, and nothing to confirm."""
    node = _Node(log, multi_node=False)
    async with journal_of(node) as journal:
        await journal.acquire("s1")
        await journal.release_session("s1")
        assert await journal.confirm("s1") is True
    assert node.calls == [("acquire", ("s1",), threading.get_ident())]


async def test_confirm_asks_the_log_only_for_a_lease_not_known_fresh(log: LmdbLog) -> None:
    """Before a tool starts, a fresh lease is confirmed without a database call; any
    other is confirmed by the log, in a worker thread, and its answer is the Journal's."""
    node = _Node(log)
    node.fresh.add("s-fresh")
    async with journal_of(node) as journal:
        assert await journal.confirm("s-fresh") is True
        assert await journal.confirm("s-stale") is False  # the log says it is not held
        node.confirmed = True
        assert await journal.confirm("s-stale") is True
    assert [(name, args) for name, args, _ in node.calls] == [
        ("is_fresh", ("s-fresh",)),
        ("is_fresh", ("s-stale",)),
        ("confirm", ("s-stale",)),
        ("is_fresh", ("s-stale",)),
        ("confirm", ("s-stale",)),
    ]
    confirms = {thread for name, _, thread in node.calls if name == "confirm"}
    assert threading.get_ident() not in confirms


# -- wake-ups from other nodes -------------------------------------------------------------


@contextmanager
def following(journal: Journal, *sessions: str) -> Iterator[list[Subscription]]:
    """A subscription per session in ``sessions``, each followed for the block."""
    with ExitStack() as stack:
        subs = [stack.enter_context(journal.bus.subscribe(sid)) for sid in sessions]
        for sub, sid in zip(subs, sessions, strict=True):
            stack.enter_context(journal.follow(sid, sub))
        yield subs


async def test_another_nodes_commits_wake_the_streams_that_follow_those_sessions(
    log: LmdbLog,
) -> None:
    node = _Node(log)
    a, b = Event("a", WAKE), Event("b", WAKE)
    async with journal_of(node) as journal:
        with following(journal, "a", "a", "b") as subs:

            async def delivered() -> list[list[Event]]:
                await node.settled()
                return [sub.drain() for sub in subs]

            node.notify(frozenset({"a", "z"}))  # z: a session nobody here follows
            assert await delivered() == [[a], [a], []]
            node.notify(None)  # notifications may have been missed: wake every follower
            assert await delivered() == [[a], [a], [b]]
            node.notify(frozenset({"b"}))
            node.notify(frozenset({"z"}))
            assert await delivered() == [[], [], [b]]
    assert journal._followers == {}


def test_a_notification_after_the_run_ended_is_dropped(log: LmdbLog) -> None:
    """The listener thread may hear of a commit while the trio run ends: that wake-up
    has no one left to wake, and must not raise in the listener thread."""
    node = _Node(log)

    async def run() -> None:
        async with journal_of(node):
            pass

    trio.run(run)
    assert node.wake is not None
    node.wake(frozenset({"a"}))  # the run is over: dropped
    node.wake(None)


async def test_the_listener_is_a_named_daemon_thread_gone_once_closed(log: LmdbLog) -> None:
    node = _Node(log)
    async with journal_of(node) as journal:
        listeners = [t for t in threading.enumerate() if t.name == "perdure-listener"]
        assert listeners == [journal._listener]
        assert listeners[0].daemon is True
        assert await journal.append([result("s")])  # records still go to the log
    assert not listeners[0].is_alive()
    single = _Node(log, multi_node=False)
    async with journal_of(single) as journal:
        assert journal._listener is None  # one owner: nobody else commits
        assert "perdure-listener" not in {t.name for t in threading.enumerate()}


async def test_reads_of_a_log_that_is_not_local_are_not_held_to_the_local_threads(
    log: LmdbLog,
) -> None:
    """A local log's reads are CPU-bound, so at most ``LOCAL_READ_THREADS`` run at once;
    a remote log's reads wait on the network, so more than that may be under way."""
    node = _Node(log)
    together = threading.Barrier(LOCAL_READ_THREADS + 1, timeout=10)
    real_read = log.read_session

    def read_session(session_id: str, *args: Any) -> Any:
        together.wait()  # every read waits until all of them are under way
        return real_read(session_id, *args)

    node.read_session = read_session  # type: ignore[method-assign]
    async with journal_of(node) as journal:
        await journal.append([result(f"s{i}") for i in range(LOCAL_READ_THREADS + 1)])
        got: dict[str, int] = {}

        async def read(sid: str) -> None:
            got[sid] = len(await journal.read_session(sid))

        async with trio.open_nursery() as nursery:
            for i in range(LOCAL_READ_THREADS + 1):
                nursery.start_soon(read, f"s{i}")
    assert got == {f"s{i}": 1 for i in range(LOCAL_READ_THREADS + 1)}
