"""The one storage interface: what the Journal and everything above it need from a log.

This module is the interface only (the ``LogBackend`` protocol, the ``Guard`` of a
batch, the ``SessionInfo`` summary every backend keeps); it imports no backend, and
the backends import it. The errors are in ``perdure.storage.errors``; ``open_log``
is in ``perdure.storage``. Three backends implement ``LogBackend``:

* ``LmdbLog`` (``perdure.storage.lmdb_log``): one LMDB environment in a directory,
  owned by one process at a time (an ``flock`` plus an epoch). The zero-config
  default.
* ``MemoryLog`` (``perdure.storage.memory_log``): a log that lives in this process's
  memory, for deterministic tests (the Journal commits it inline on the trio thread).
* ``PgLog`` (``perdure.storage.pg_log``): PostgreSQL, shared by several processes
  ("nodes"); each session is owned by one node at a time through a *lease* with an
  epoch, checked in every write transaction (fencing).

``open_log(location, ...)`` picks the backend from the location: a directory path
means LMDB, a ``postgresql://`` (or ``postgres://``) URL means PostgreSQL, and
``":memory:"`` a fresh ``MemoryLog``. Imports are lazy, so ``import perdure`` never
imports psycopg.

Threads: every method blocks. ``commit`` runs only on the Journal's writer thread
(bound with ``bind_writer``; an ``inline`` backend's writer is the trio thread, and
a ``local`` one's may also be the trio thread while its loop is idle, never at the
same time as the writer thread);
everything else may run on any thread, each call in its own short read (or, for
leases, write) transaction.

Ownership hooks (the part that differs between one owner and many nodes):

``multi_node``       True when other processes may write the same log concurrently
                     (PostgreSQL); the supervisor then runs a lease heartbeat.
``acquire(sid)``     make this process the session's writer, or raise ``NotOwner``
                     naming the live node that holds it. LMDB: always granted
                     (its whole-log lock already fences).
``claim()``          the active sessions this process should run now, in recovery
                     order (``recovery_order``: the longest waiting first). LMDB:
                     every active session; PostgreSQL: orphaned ones (lease free or
                     expired), up to a fair share over the live nodes.
``renew()``          extend the leases held; return the sessions whose lease was lost.
``survey()``         the live nodes and how many active sessions each holds
                     (``ClusterView``), for rebalancing. LMDB: an empty view.
``hand_over(sid, to)`` give the session's lease to the live node ``to`` (it takes
                     it with ``accept``); only a multi-node log is ever asked.
``accept()``         take the leases other nodes handed to this one. LMDB: none.
``confirm(sid)``     whether the lease is certainly still held (checked before a
                     tool is started); LMDB: always. ``is_fresh(sid)`` is its
                     non-blocking part: True when no database call is needed.
``listen(wake, stop)`` block, calling ``wake(session ids or None)`` whenever another
                     process committed records (LISTEN/NOTIFY); LMDB returns at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal, Protocol, runtime_checkable

import attrs

from perdure.storage.records import Committed, GoalRevised, Record, active_delta

Durability = Literal["full", "fast"]


@attrs.frozen
class Guard:
    """A condition checked inside the write transaction before a batch is written."""

    session_id: str
    goal_rev: int


@attrs.frozen
class SessionInfo:
    """A session's summary, kept by every backend in the transaction that writes its records.

    ``open_submissions`` is the *active* index: a session with unfinished submissions
    is started again by recovery without reading any other session's history.
    """

    session_id: str
    first_seq: int
    last_seq: int
    records: int
    goal_rev: int
    open_submissions: int

    @classmethod
    def empty(cls, session_id: str) -> SessionInfo:
        """The summary of a session with no record yet."""
        return cls(session_id, first_seq=0, last_seq=0, records=0, goal_rev=0, open_submissions=0)

    def advanced(self, seq: int, record: Record) -> SessionInfo:
        """The summary once ``record`` is stored under ``seq`` (the one rule of all backends)."""
        return self.advanced_all(seq, (record,))

    def advanced_all(self, first: int, records: Sequence[Record]) -> SessionInfo:
        """The summary once ``records`` (this session's, at least one) are stored under
        ``first``, ``first + 1``, ...: ``advanced`` for each in turn, building one summary."""
        open_submissions, goal_rev = self.open_submissions, self.goal_rev
        for record in records:
            delta = active_delta(record)
            # None: the record settles every submission of the session.
            open_submissions = 0 if delta is None else max(0, open_submissions + delta)
            if isinstance(record, GoalRevised):
                goal_rev = record.goal_rev
        return SessionInfo(
            self.session_id,
            first_seq=self.first_seq if self.records else first,
            last_seq=first + len(records) - 1,
            records=self.records + len(records),
            goal_rev=goal_rev,
            open_submissions=open_submissions,
        )


def recovery_order(infos: Iterable[SessionInfo]) -> list[str]:
    """The order in which start-up resumes interrupted sessions: the one whose last
    record is oldest first (it has waited longest), ties by session id.

    Only the active sessions' summaries are read for it, never the whole history.
    """
    return [i.session_id for i in sorted(infos, key=lambda i: (i.last_seq, i.session_id))]


@attrs.frozen
class NodeLoad:
    """One live node as a survey of the log sees it."""

    node_id: str
    sessions: int  # active sessions it holds an unexpired lease on (hand-overs to it included)
    up_for: float  # seconds since it joined the cluster (or rejoined, after its entry lapsed)


@attrs.frozen
class ClusterView:
    """The live nodes and the active sessions of the log, at one moment (``survey``)."""

    nodes: tuple[NodeLoad, ...] = ()
    active: int = 0  # sessions with unfinished work, whoever holds them (or nobody)


Batch = tuple[Sequence[Record], Guard | None]
CommitResult = list[list[Committed] | Exception]
Wake = Callable[[frozenset[str] | None], None]


@runtime_checkable
class LogBackend(Protocol):
    """What a durable log offers the Journal, the supervisor and the API (module docstring)."""

    @property
    def location(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def node_id(self) -> str: ...

    @property
    def multi_node(self) -> bool: ...

    @property
    def lease_ttl(self) -> float: ...

    @property
    def poll_interval(self) -> float: ...

    @property
    def inline(self) -> bool:
        """True when ``commit`` never blocks (an in-memory log): the Journal then
        commits on the trio thread, with no writer thread."""
        ...

    @property
    def local(self) -> bool:
        """True when ``commit`` is a write to a local disk with no network or lock
        waits in it (LMDB): the Journal may then commit on its idle trio thread."""
        ...

    def bind_writer(self, *threads: threading.Thread) -> None:
        """From now on, only these threads may call ``commit`` (one at a time)."""
        ...

    def commit(self, batches: Sequence[Batch]) -> CommitResult: ...

    def read_session(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> list[Committed]: ...

    def read_global(self, after: int = 0, limit: int | None = None) -> list[Committed]: ...

    def read_system(self, after: int = 0) -> list[Committed]: ...

    def last_seq(self) -> int: ...

    def scan_frames(self) -> Iterator[tuple[int, bytes]]:
        """Every stored frame in seq order, undecoded (for ``perdure check``)."""
        ...

    def active_sessions(self) -> list[str]: ...

    def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The sessions' summaries in session-id order (LMDB and in memory: the ids'
        UTF-8 bytes; PostgreSQL: the database's collation): only ids after ``after`` (a
        page's last id; "" from the start), at most ``limit`` of them, and with
        ``active`` only the sessions with unfinished work (read from the active index,
        not from every session)."""

    def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The sessions' summaries newest first, by creation (each one's ``first_seq``):
        only those created before ``before`` (a page's last ``first_seq``; 0 from the
        newest), at most ``limit`` of them, read from an index by creation, so a page
        costs its own sessions, not every session's; with ``active`` only the sessions
        with unfinished work (read from the active index, sorted: a page costs the
        active sessions)."""
        ...

    def session_info(self, session_id: str) -> SessionInfo | None: ...

    def close(self) -> None: ...

    # -- ownership hooks ---------------------------------------------------------

    def acquire(self, session_id: str) -> None: ...

    def release_session(self, session_id: str) -> None:
        """Give up the session's lease now (its actor was evicted while idle)."""
        ...

    def claim(self) -> list[str]: ...

    def renew(self) -> list[str]: ...

    def survey(self) -> ClusterView: ...

    def hand_over(self, session_id: str, target: str) -> bool:
        """Give the session's lease to the live node ``target``; False if it was not ours."""
        ...

    def accept(self) -> list[str]: ...

    def confirm(self, session_id: str) -> bool: ...

    def is_fresh(self, session_id: str) -> bool: ...

    def listen(self, wake: Wake, stop: threading.Event) -> None: ...
