"""The one storage interface: what the Journal and everything above it need from a log.

Two backends implement ``LogBackend``:

* ``LmdbLog`` (``perdure.storage.lmdb_log``): one LMDB environment in a directory,
  owned by one process at a time (an ``flock`` plus an epoch). The zero-config
  default.
* ``PgLog`` (``perdure.storage.pg_log``): PostgreSQL, shared by several processes
  ("nodes"); each session is owned by one node at a time through a *lease* with an
  epoch, checked in every write transaction (fencing).

``open_log(location, ...)`` picks the backend from the location: a directory path
means LMDB, a ``postgresql://`` (or ``postgres://``) URL means PostgreSQL. Imports
are lazy, so ``import perdure`` never imports psycopg.

Threads: every method blocks. ``commit`` runs only on the Journal's writer thread
(bound with ``bind_writer``); everything else may run on any thread, each call in
its own short read (or, for leases, write) transaction.

Ownership hooks (the part that differs between one owner and many nodes):

``multi_node``       True when other processes may write the same log concurrently
                     (PostgreSQL); the supervisor then runs a lease heartbeat.
``acquire(sid)``     make this process the session's writer, or raise ``NotOwner``
                     naming the live node that holds it. LMDB: always granted
                     (its whole-log lock already fences).
``claim()``          the active sessions this process should run now. LMDB: every
                     active session; PostgreSQL: orphaned ones (lease free or
                     expired), up to a fair share over the live nodes.
``renew()``          extend the leases held; return the sessions whose lease was lost.
``confirm(sid)``     whether the lease is certainly still held (checked before a
                     tool is started); LMDB: always. ``is_fresh(sid)`` is its
                     non-blocking part: True when no database call is needed.
``listen(wake, stop)`` block, calling ``wake(session ids or None)`` whenever another
                     process committed records (LISTEN/NOTIFY); LMDB returns at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal, Protocol, runtime_checkable

import attrs

from perdure.storage.records import Committed, Record

Durability = Literal["full", "fast"]

_MAX_SESSION_ID: Final = 128
PG_SCHEMES: Final = ("postgresql://", "postgres://")


class LogError(Exception):
    """Base class of the log's documented errors."""


class LogBusy(LogError):
    """Another live process owns the log."""


class LogFenced(LogError):
    """This process lost ownership of the log (it was taken over); it must stop writing."""


class SessionFenced(LogFenced):
    """This node lost one session's lease (another node took it over): that session's
    actor must stop; the node's other sessions go on."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(f"session {session_id}: {detail}; nothing was written")
        self.session_id = session_id


class NotOwner(LogError):
    """The session is leased by another live node; send the command there."""

    def __init__(self, session_id: str, owner: str, expires_in: float, about: str = "") -> None:
        where = f" ({about})" if about else ""
        super().__init__(
            f"session {session_id} is owned by node {owner}{where}, whose lease runs "
            f"{expires_in:.1f} s more; send the command to that node (or retry after "
            "the lease expires if that node is gone)"
        )
        self.session_id = session_id
        self.owner = owner
        self.expires_in = expires_in


class LogUnavailable(LogError):
    """The log cannot be reached right now (a database outage, a broken connection).

    Transient: what failed did not happen, and the same call may succeed later.
    """


class CommitUnknown(LogUnavailable):
    """The connection failed while a commit was in flight: it may or may not have landed.

    The session actors concerned restart from the log (fold + recover), which is
    exactly how a crash at that point would be handled.
    """


class StorageFull(LogError):
    """The disk (or the map, beyond its limit) is full; the commit did not happen."""


class SessionBusy(LogError):
    """A session with unfinished work cannot be deleted; nothing was removed."""

    def __init__(self, session_id: str, open_submissions: int) -> None:
        super().__init__(
            f"session {session_id} has unfinished work ({open_submissions} open "
            "submissions or compensations); nothing was deleted"
        )
        self.session_id = session_id


class StaleGoal(LogError):
    """A guarded append was prepared under an older goal revision and was refused."""

    def __init__(self, session_id: str, expected: int, found: int) -> None:
        super().__init__(
            f"session {session_id}: append prepared under goal revision {expected}, "
            f"but revision {found} is in force; nothing was written"
        )
        self.expected = expected
        self.found = found


@attrs.frozen
class Guard:
    """A condition checked inside the write transaction before a batch is written."""

    session_id: str
    goal_rev: int


@attrs.frozen
class SessionInfo:
    session_id: str
    first_seq: int
    last_seq: int
    records: int
    goal_rev: int
    open_submissions: int


def check_session_id(session_id: str) -> str:
    """Session ids are short, printable and NUL-free (they are part of index keys and URLs)."""
    ok = (
        0 < len(session_id) <= _MAX_SESSION_ID
        and session_id.isascii()
        and all(c.isalnum() or c in "._:-" for c in session_id)
    )
    if not ok:
        raise ValueError(
            f"invalid session id {session_id!r}: use 1-{_MAX_SESSION_ID} characters "
            "among letters, digits and . _ : -"
        )
    return session_id


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

    def bind_writer(self, thread: threading.Thread) -> None: ...

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

    def sessions(self) -> list[SessionInfo]: ...

    def session_info(self, session_id: str) -> SessionInfo | None: ...

    def close(self) -> None: ...

    # -- ownership hooks ---------------------------------------------------------

    def acquire(self, session_id: str) -> None: ...

    def release_session(self, session_id: str) -> None:
        """Give up the session's lease now (its actor was evicted while idle)."""
        ...

    def claim(self) -> list[str]: ...

    def renew(self) -> list[str]: ...

    def confirm(self, session_id: str) -> bool: ...

    def is_fresh(self, session_id: str) -> bool: ...

    def listen(self, wake: Wake, stop: threading.Event) -> None: ...


def is_postgres(location: str | os.PathLike[str]) -> bool:
    return isinstance(location, str) and location.startswith(PG_SCHEMES)


def open_log(
    location: str | os.PathLike[str],
    *,
    durability: Durability = "full",
    takeover: bool = False,
    clock: Callable[[], float] = time.time,
    map_size: int | None = None,
    node_id: str | None = None,
    lease_ttl: float | None = None,
    readonly: bool = False,
    **options: Any,
) -> LogBackend:
    """Open the log at ``location``: a directory (LMDB) or a ``postgresql://`` URL.

    Blocking: call it from a worker thread in async code. ``readonly`` opens it for
    inspection beside a live owner (no ownership taken, nothing written). Options
    that belong to the other backend are refused, so a typo in a deployment is not
    silently ignored.
    """
    if is_postgres(location):
        if map_size is not None:
            raise ValueError("map_size applies to an LMDB log, not to PostgreSQL")
        from perdure.storage.pg_log import PgLog

        extra: dict[str, Any] = dict(options)
        if lease_ttl is not None:
            extra["lease_ttl"] = lease_ttl
        return PgLog(
            str(location),
            durability=durability,
            takeover=takeover,
            clock=clock,
            node_id=node_id,
            readonly=readonly,
            **extra,
        )
    named = (("node_id", node_id), ("lease_ttl", lease_ttl))
    given = [name for name, value in named if value is not None] + sorted(options)
    if given:
        raise ValueError(
            f"{', '.join(given)}: options of a PostgreSQL log; {location} is an LMDB directory"
        )
    from perdure.storage.lmdb_log import DEFAULT_MAP_SIZE, LmdbLog

    return LmdbLog(
        location,
        durability=durability,
        takeover=takeover,
        clock=clock,
        map_size=map_size if map_size is not None else DEFAULT_MAP_SIZE,
        readonly=readonly,
    )


def claim_writer(writer: threading.Thread | None, seen: set[int], what: str) -> None:
    """Refuse a write transaction outside the writer thread; note the thread that wrote.

    A write transaction must begin, write and commit on one thread (LMDB demands it;
    the PostgreSQL backend keeps one connection for writes the same way).
    """
    current = threading.current_thread()
    if writer is not None and current is not writer:
        raise RuntimeError(
            f"{what} write transaction attempted on thread {current.name!r}; "
            "only the journal's writer thread may write"
        )
    seen.add(current.ident or 0)
