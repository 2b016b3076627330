"""The log in PostgreSQL, shared by several perdure processes ("nodes"): blocking code.

Tables (created and migrated by perdure itself, under an advisory lock):

``perdure_records``  seq (from the sequence ``perdure_seq``), session id ('' for system
                     records), the same CRC-framed bytes as LMDB (``codec``: the CRC
                     covers the seq), the node that wrote it and when
``perdure_sessions`` one summary row per session: first/last seq, record count,
                     goal_rev (read by guards), open_submissions (the *active* index)
``perdure_leases``   session id -> owner node, epoch, expires_at (server clock)
``perdure_nodes``    node id -> epoch (start order), pid, host, started_at (when it
                     joined, or rejoined after its entry lapsed), expires_at (liveness)
``perdure_schema``   the schema version

Sequence numbers come from a PostgreSQL sequence: they increase but may have gaps
(a rolled-back or refused transaction consumes the numbers it drew). Per session
they increase in commit order, because one node writes a session at a time and a
commit locks the session's lease row *before* it draws its numbers, so a takeover
(which waits for that lock) always comes after. Globally, two nodes' transactions
may become visible out of seq order; follow sessions, not the global log, live.

Group commit: every ``commit`` call (all the batches the Journal took at once) is ONE
transaction on the writer connection, used only by the Journal's writer thread:
lock the lease rows of the sessions written, read their summaries, draw the seqs,
insert all records with one statement, upsert the summaries, NOTIFY, commit.

Leases and fencing: a batch commits only if, under the row lock, every session it
writes is leased to this node with the epoch this node acquired; otherwise that batch
fails with ``SessionFenced`` and the others still commit. A takeover bumps the
epoch, so an old owner that was paused or cut off can never write again, and so can
never dispatch a tool (dispatch is the commit of the ``executing`` record).
``renew`` extends this node's leases (the server's clock decides expiry, so the
nodes' clocks do not matter); ``claim`` takes orphaned active sessions (lease free
or expired) up to a fair share over the live nodes. ``close`` releases every lease
at once, so a clean shutdown hands sessions over without waiting for expiry.

Rebalancing (the decision is ``perdure.actors.balance``; the supervisor drives it):
``survey`` reports the live nodes and the active sessions each holds; ``hand_over``
gives a lease this node holds to a live peer under a bumped epoch (fencing this node
at once) with one TTL to take it; the peer's ``accept`` takes it (bumping it again).
A handed lease the peer never takes lapses like any lease: an orphan to claim.

A node stopped or cut off in the middle of a commit holds its lease rows locked;
the server ends such a transaction after half a TTL idle, and a node that wants an
expired lease whose row stays locked ends the old owner's transaction itself.

Limits: a tool already running when its node was paused may still finish its side
effect after the session moved (nothing can fence an effect in flight; the new owner
treats the call as ``executing``, i.e. by its replay policy, and a downstream
service can deduplicate by the idempotency key). ``takeover=True`` takes leases
before they expire, so that protection is void for a node taken over that way.
Ephemeral events (streamed text, tool progress) stay on the node that produced them.

``durability="fast"`` sets ``synchronous_commit = off`` on the writer connection: a
crash of the *database server* may lose the last commits (never part of one); a
killed perdure process loses nothing either way.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import attrs
import psycopg
import psycopg.errors

from perdure.storage.backend import (
    Batch,
    ClusterView,
    CommitResult,
    Durability,
    NodeLoad,
    SessionInfo,
    Wake,
)
from perdure.storage.codec import CorruptRecord, decode, encode
from perdure.storage.common import claim_writer
from perdure.storage.errors import (
    CommitUnknown,
    LogError,
    LogUnavailable,
    NotOwner,
    SessionBusy,
    SessionFenced,
    StaleGoal,
)
from perdure.storage.records import Committed, LogOpened, Record, SessionDeleted

SCHEMA_VERSION: Final = 2
CHANNEL: Final = "perdure_records"
DEFAULT_LEASE_TTL: Final = 10.0
_ADVISORY_KEY: Final = 0x70657264_75726501  # "perdure" + 1: the schema lock
_NOTIFY_MAX: Final = 7000  # bytes; PostgreSQL's payload limit is 8000
_FRESH_MARGIN: Final = 0.8  # a lease counts as certainly ours for this share of its TTL
_RETRIES: Final = 3

# Each entry brings the schema from version i to i + 1.
MIGRATIONS: Final[list[list[str]]] = [
    [
        "CREATE SEQUENCE perdure_seq",
        "CREATE SEQUENCE perdure_node_seq",
        """CREATE TABLE perdure_records (
            seq bigint PRIMARY KEY,
            session_id text NOT NULL,
            frame bytea NOT NULL,
            node text NOT NULL,
            written_at timestamptz NOT NULL DEFAULT statement_timestamp()
        )""",
        "CREATE INDEX perdure_records_by_session ON perdure_records (session_id, seq)",
        """CREATE TABLE perdure_sessions (
            session_id text PRIMARY KEY,
            first_seq bigint NOT NULL,
            last_seq bigint NOT NULL,
            records bigint NOT NULL,
            goal_rev bigint NOT NULL,
            open_submissions bigint NOT NULL
        )""",
        "CREATE INDEX perdure_sessions_active ON perdure_sessions (session_id) "
        "WHERE open_submissions > 0",
        """CREATE TABLE perdure_leases (
            session_id text PRIMARY KEY,
            owner text NOT NULL,
            epoch bigint NOT NULL,
            expires_at timestamptz NOT NULL
        )""",
        """CREATE TABLE perdure_nodes (
            node_id text PRIMARY KEY,
            epoch bigint NOT NULL,
            pid integer NOT NULL,
            host text NOT NULL,
            started_at timestamptz NOT NULL DEFAULT statement_timestamp(),
            expires_at timestamptz NOT NULL
        )""",
    ],
    # 2: the sessions by creation (``newest_sessions``: a page without a sort of all).
    ["CREATE INDEX perdure_sessions_created ON perdure_sessions (first_seq)"],
]

# Take the lease if it is free, expired, already ours, or (takeover) held by a node
# that started before this one. A takeover bumps the epoch: the old owner is fenced.
_ACQUIRE: Final = """
INSERT INTO perdure_leases AS l (session_id, owner, epoch, expires_at)
VALUES (%(sid)s, %(node)s, 1, statement_timestamp() + %(ttl)s * interval '1 second')
ON CONFLICT (session_id) DO UPDATE
   SET owner = EXCLUDED.owner, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
 WHERE l.expires_at < statement_timestamp()
    OR l.owner = %(node)s
    OR (%(takeover)s AND l.owner IN (
            SELECT node_id FROM perdure_nodes WHERE epoch < %(node_epoch)s))
RETURNING epoch
"""

# Statements that lock several lease rows lock them in session id order, as a commit
# does (``FOR UPDATE ... ORDER BY``): two transactions of one node (its heartbeat's
# renewal and a commit of its writer) that took the same rows in different orders
# would deadlock, and each such wait lasts until the lock timeout.
_RENEW: Final = """
WITH mine AS (
    SELECT l.session_id
      FROM perdure_leases l
      JOIN unnest(%(sids)s::text[], %(epochs)s::bigint[]) AS h(sid, epoch)
        ON l.session_id = h.sid AND l.epoch = h.epoch
     WHERE l.owner = %(node)s
     ORDER BY l.session_id
       FOR UPDATE OF l)
UPDATE perdure_leases AS l
   SET expires_at = statement_timestamp() + %(ttl)s * interval '1 second'
  FROM mine
 WHERE l.session_id = mine.session_id
RETURNING l.session_id, l.epoch
"""


# A node's heartbeat. A node whose entry had lapsed (it was stopped or cut off for a
# TTL, and the others counted it gone) rejoins: its membership starts again, so it
# waits out the joining grace before peers hand it sessions (``perdure.actors.balance``).
_ALIVE: Final = """
UPDATE perdure_nodes
   SET started_at = CASE WHEN expires_at < statement_timestamp()
                         THEN statement_timestamp() ELSE started_at END,
       expires_at = statement_timestamp() + %s * interval '1 second'
 WHERE node_id = %s
"""

# The live nodes, how long each has been a member, and how many active sessions each
# holds an unexpired lease on (a lease handed to a node counts as its own at once).
_SURVEY: Final = """
WITH held AS (
    SELECT l.owner, count(*) AS sessions
      FROM perdure_sessions s JOIN perdure_leases l USING (session_id)
     WHERE s.open_submissions > 0 AND l.expires_at > statement_timestamp()
     GROUP BY l.owner)
SELECT n.node_id,
       extract(epoch FROM statement_timestamp() - n.started_at)::float8,
       coalesce(held.sessions, 0),
       (SELECT count(*) FROM perdure_sessions WHERE open_submissions > 0)
  FROM perdure_nodes n LEFT JOIN held ON held.owner = n.node_id
 WHERE n.expires_at > statement_timestamp()
   AND NOT (%(takeover)s AND n.epoch < %(node_epoch)s)
 ORDER BY n.node_id
"""

# Give a lease this node holds (at that epoch) to a live peer: the epoch is bumped,
# so this node is fenced from it at once, and it expires after one TTL unless the
# peer takes it (``accept``) — a hand-over to a node that dies meanwhile lapses like
# any lease, and the session is an orphan for whoever is below its share.
_HAND_OVER: Final = """
UPDATE perdure_leases
   SET owner = %(target)s, epoch = epoch + 1,
       expires_at = statement_timestamp() + %(ttl)s * interval '1 second'
 WHERE session_id = %(sid)s AND owner = %(node)s AND epoch = %(epoch)s
   AND EXISTS (SELECT 1 FROM perdure_nodes
                WHERE node_id = %(target)s AND expires_at > statement_timestamp())
RETURNING epoch
"""

# Take, in one statement, the active sessions whose unexpired lease names this node
# but that it does not hold yet: handed to it by a peer. The epoch is bumped once more,
# so the taking is this node's own (as ``_ACQUIRE`` does for a lease already its own).
_ACCEPT: Final = """
WITH handed AS (
    SELECT l.session_id
      FROM perdure_leases l JOIN perdure_sessions s USING (session_id)
     WHERE s.open_submissions > 0
       AND l.owner = %(node)s AND l.expires_at > statement_timestamp()
       AND NOT (l.session_id = ANY(%(held)s::text[]))
     ORDER BY l.session_id
       FOR UPDATE OF l)
UPDATE perdure_leases AS l
   SET epoch = l.epoch + 1, expires_at = statement_timestamp() + %(ttl)s * interval '1 second'
  FROM handed
 WHERE l.session_id = handed.session_id
RETURNING l.session_id, l.epoch
"""


def _log_error(message: str, exc: psycopg.Error) -> LogError:
    """``LogUnavailable`` for what may pass (a lost connection, a server shutting down,
    a timeout, a conflict); a plain ``LogError`` for what will not (a schema mismatch,
    a missing privilege, bad data): retrying those would only hide them."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return LogUnavailable(message)
    return LogError(message)


# End the transactions of a lease's owner that hold its row past the lock limit, when
# the lease may be taken (expired, or takeover of an older node). Its connections are
# found by application_name, which perdure sets to "perdure:<node id>".
_EVICT: Final = """
SELECT pg_terminate_backend(a.pid)
  FROM perdure_leases l
  JOIN pg_stat_activity a ON a.application_name = left('perdure:' || l.owner, 63)
 WHERE l.session_id = %(sid)s
   AND l.owner <> %(node)s
   AND (l.expires_at < statement_timestamp()
        OR (%(takeover)s AND l.owner IN (
                SELECT node_id FROM perdure_nodes WHERE epoch < %(node_epoch)s)))
   AND a.xact_start < statement_timestamp() - %(wait_ms)s * interval '1 millisecond'
   AND a.pid <> pg_backend_pid()
"""


@attrs.frozen
class _Held:
    epoch: int
    fresh_until: float  # time.monotonic(): until then the lease is certainly ours


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class PgLog:
    """A perdure log in PostgreSQL, written by this node. See the module docstring."""

    multi_node = True
    inline = False
    local = False

    def __init__(
        self,
        url: str,
        *,
        durability: Durability = "full",
        takeover: bool = False,
        clock: Callable[[], float] = time.time,
        node_id: str | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        poll_interval: float = 1.0,
        readonly: bool = False,
        read_connections: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        if durability not in ("full", "fast"):
            raise ValueError(f"durability must be 'full' or 'fast', not {durability!r}")
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be positive, not {lease_ttl!r}")
        self.url = url
        self.durability = durability
        self.readonly = readonly
        self.takeover = takeover
        self._clock = clock
        self._node_id = node_id or _default_node_id()
        self._lease_ttl = float(lease_ttl)
        self._lock_limit_ms = max(100, int(self._lease_ttl * 500))  # half a TTL
        self._poll_interval = poll_interval
        self._connect_timeout = connect_timeout
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._pool: list[psycopg.Connection[Any]] = []
        self._pool_size = read_connections
        self._writers: tuple[threading.Thread, ...] = ()
        self._wconn: psycopg.Connection[Any] | None = None
        self._writer_pid: int | None = None
        self.write_threads: set[int] = set()
        self.epoch = 0
        self._closed = False
        try:
            if readonly:
                with self._reader() as conn:
                    found = conn.execute("SELECT to_regclass('perdure_schema')").fetchone()
                if found is None or found[0] is None:
                    raise FileNotFoundError(f"no perdure log at {self.location}")
            else:
                self._migrate()
                self._register()
        except BaseException:
            self.close()
            raise

    # -- the LogBackend face ---------------------------------------------------------

    @property
    def location(self) -> str:
        return redact(self.url)

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def lease_ttl(self) -> float:
        return self._lease_ttl

    @property
    def poll_interval(self) -> float:
        return self._poll_interval

    def held(self) -> dict[str, int]:
        """The sessions this node holds, with their lease epochs."""
        with self._lock:
            return {sid: h.epoch for sid, h in self._held.items()}

    # -- connections -----------------------------------------------------------------

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        """A connection whose lock waits are bounded by half a lease TTL.

        A node paused (or cut off) in the middle of a transaction holds the lease rows
        it locked; ``idle_in_transaction_session_timeout`` makes the server end that
        transaction, so a takeover waits at most that long instead of forever. A node
        stopped while the server still waits for the rest of a request (mid-pipeline,
        mid-message) is not "idle"; a taker whose lock wait times out then ends that
        node's transaction itself (``_EVICT``), once its lease has expired.
        """
        limit_ms = self._lock_limit_ms
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(1, math.ceil(self._connect_timeout)),
                application_name=f"perdure:{self._node_id}"[:63],
            )
            conn.execute(f"SET lock_timeout = {limit_ms}")
            conn.execute(f"SET idle_in_transaction_session_timeout = {limit_ms}")
            conn.autocommit = autocommit
            return conn
        except psycopg.Error as exc:
            raise LogUnavailable(f"cannot connect to {self.location}: {exc}") from exc

    @contextlib.contextmanager
    def _reader(self) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit connection from the small pool (each statement its own snapshot)."""
        with self._lock:
            conn = self._pool.pop() if self._pool else None
        if conn is None:
            conn = self._connect(autocommit=True)
        try:
            yield conn
        except psycopg.Error as exc:
            conn.close()
            raise _log_error(f"{self.location}: {exc}", exc) from exc
        except BaseException:
            conn.close()
            raise
        pooled = False
        with self._lock:
            if not conn.broken and len(self._pool) < self._pool_size and not self._closed:
                self._pool.append(conn)
                pooled = True
        if not pooled:
            conn.close()

    def _writer_conn(self) -> psycopg.Connection[Any]:
        conn = self._wconn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._wconn = self._connect(autocommit=False)
            if self.durability == "fast":
                conn.execute("SET synchronous_commit = off")
                conn.commit()
            self._writer_pid = conn.info.backend_pid
        return conn

    # -- schema and node registration ------------------------------------------------

    def _migrate(self) -> None:
        conn = self._writer_conn()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
            conn.execute("CREATE TABLE IF NOT EXISTS perdure_schema (version integer NOT NULL)")
            row = conn.execute("SELECT max(version) FROM perdure_schema").fetchone()
            version = row[0] if row and row[0] is not None else 0
            if version > SCHEMA_VERSION:
                raise LogError(
                    f"the log at {self.location} has schema version {version}; this perdure "
                    f"understands up to {SCHEMA_VERSION}: upgrade perdure"
                )
            for step in MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute("DELETE FROM perdure_schema")
            conn.execute("INSERT INTO perdure_schema VALUES (%s)", (SCHEMA_VERSION,))
        conn.commit()

    def _register(self) -> None:
        """Join as a live node (its epoch orders node starts) and log a ``LogOpened``."""
        conn = self._writer_conn()
        with conn.transaction():
            row = conn.execute("SELECT nextval('perdure_node_seq')").fetchone()
            assert row is not None
            self.epoch = int(row[0])
            taken = conn.execute(
                """INSERT INTO perdure_nodes (node_id, epoch, pid, host, expires_at)
                   VALUES (%s, %s, %s, %s, statement_timestamp() + %s * interval '1 second')
                   ON CONFLICT (node_id) DO NOTHING RETURNING node_id""",
                (self._node_id, self.epoch, os.getpid(), socket.gethostname(), self._lease_ttl),
            ).fetchone()
            if taken is None:
                raise LogError(f"node id {self._node_id!r} is already registered in this log")
            opened = LogOpened(
                epoch=self.epoch, pid=os.getpid(), host=socket.gethostname(), at=self._clock()
            )
            row = conn.execute("SELECT nextval('perdure_seq')").fetchone()
            assert row is not None
            seq = int(row[0])
            conn.execute(
                "INSERT INTO perdure_records (seq, session_id, frame, node) "
                "VALUES (%s, '', %s, %s)",
                (seq, encode(opened, seq), self._node_id),
            )
        conn.commit()

    def close(self) -> None:
        """Release every lease at once (others take them at their next heartbeat)."""
        if self._closed:
            return
        self._closed = True
        conn = self._wconn
        if conn is not None and not self.readonly:
            with contextlib.suppress(psycopg.Error):
                if not conn.closed and not conn.broken:
                    conn.rollback()
                    conn.execute(
                        "UPDATE perdure_leases SET expires_at = '-infinity' WHERE owner = %s",
                        (self._node_id,),
                    )
                    conn.execute("DELETE FROM perdure_nodes WHERE node_id = %s", (self._node_id,))
                    conn.commit()
        with self._lock:
            self._held.clear()
            pool, self._pool = self._pool, []
        for c in [*pool, conn]:
            if c is not None:
                with contextlib.suppress(psycopg.Error):
                    c.close()
        self._wconn = None

    # -- writing (writer thread only) ------------------------------------------------

    def bind_writer(self, *threads: threading.Thread) -> None:
        """From now on, only these threads may call ``commit``."""
        self._writers = threads

    def commit(self, batches: Sequence[Batch]) -> CommitResult:
        """Write every batch in ONE transaction; return, per batch, its records or why not.

        A batch fails alone (the others commit) when one of its sessions is not leased
        to this node at the epoch it acquired (``SessionFenced``), when its guard
        fails (``StaleGoal``) or when a record cannot be encoded. A lost connection
        before COMMIT fails the whole call (``LogError``: nothing was written); during
        COMMIT it raises ``CommitUnknown`` unless the outcome can be read back.
        """
        if self.readonly:
            raise LogError("the log was opened read-only")
        claim_writer(self._writers, self.write_threads, "PostgreSQL")
        for attempt in range(_RETRIES):
            try:
                return self._commit_once(batches)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if attempt == _RETRIES - 1:
                    raise LogError("commit kept conflicting with lease changes") from None
            except psycopg.Error as exc:
                raise _log_error(f"PostgreSQL write failed on {self.location}: {exc}", exc) from exc
        raise AssertionError("unreachable")

    def _commit_once(self, batches: Sequence[Batch]) -> CommitResult:
        conn = self._writer_conn()
        written: set[str] = set()
        for records, guard in batches:
            written.update(r.session_id for r in records if r.session_id)
            # A deletion locks the deleted session's lease row (held by this node).
            written.update(r.deleted for r in records if isinstance(r, SessionDeleted))
            if guard is not None:
                written.add(guard.session_id)
        sessions = sorted(written)
        with self._lock:
            held = {sid: self._held[sid].epoch for sid in sessions if sid in self._held}
        total = sum(len(records) for records, _ in batches)
        leases: dict[str, tuple[str, int]] = {}
        infos: dict[str, SessionInfo] = {}
        try:
            # Round trip 1 (pipelined): lock the lease rows (with the summaries), THEN
            # draw the seqs; the server runs them in this order.
            with conn.pipeline():
                locked = conn.execute(
                    """SELECT l.session_id, l.owner, l.epoch, s.first_seq, s.last_seq,
                              s.records, s.goal_rev, s.open_submissions
                         FROM perdure_leases l
                         LEFT JOIN perdure_sessions s USING (session_id)
                        WHERE l.session_id = ANY(%s)
                        ORDER BY l.session_id FOR UPDATE OF l""",
                    (sessions,),
                )
                drawn = conn.execute(
                    "SELECT nextval('perdure_seq') FROM generate_series(1, %s)", (total,)
                )
            for sid, owner, epoch, *summary in locked.fetchall():
                leases[sid] = (owner, epoch)
                if summary[0] is not None:
                    infos[sid] = SessionInfo(sid, *summary)
            seqs = sorted(int(row[0]) for row in drawn.fetchall())
            deleted: set[str] = set()
            results, rows, touched = self._apply(batches, seqs, held, leases, infos, deleted)
            self._forget_fenced(results, held)
            if not rows:
                conn.rollback()
                return results
            order = sorted(touched)
            payload = ",".join(order)
            if len(payload.encode()) > _NOTIFY_MAX:
                payload = "*"
            # Round trip 2 (pipelined): the records, the summaries, the notification.
            with conn.pipeline():
                if deleted:
                    gone = sorted(deleted)
                    conn.execute("DELETE FROM perdure_records WHERE session_id = ANY(%s)", (gone,))
                    conn.execute("DELETE FROM perdure_sessions WHERE session_id = ANY(%s)", (gone,))
                conn.execute(
                    "INSERT INTO perdure_records (seq, session_id, frame, node) "
                    "SELECT s, sid, f, %s FROM unnest(%s::bigint[], %s::text[], %s::bytea[]) "
                    "AS t(s, sid, f)",
                    (
                        self._node_id,
                        [r[0] for r in rows],
                        [r[1] for r in rows],
                        [r[2] for r in rows],
                    ),
                )
                if order:
                    conn.execute(
                        """INSERT INTO perdure_sessions AS s (session_id, first_seq, last_seq,
                               records, goal_rev, open_submissions)
                           SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[],
                               %s::bigint[], %s::bigint[], %s::bigint[])
                           ON CONFLICT (session_id) DO UPDATE SET
                               first_seq = EXCLUDED.first_seq, last_seq = EXCLUDED.last_seq,
                               records = EXCLUDED.records, goal_rev = EXCLUDED.goal_rev,
                               open_submissions = EXCLUDED.open_submissions""",
                        (
                            order,
                            [infos[s].first_seq for s in order],
                            [infos[s].last_seq for s in order],
                            [infos[s].records for s in order],
                            [infos[s].goal_rev for s in order],
                            [infos[s].open_submissions for s in order],
                        ),
                    )
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
            raise
        first = rows[0][0]
        try:
            conn.commit()
        except psycopg.Error as exc:
            landed = self._landed(first, sorted(touched))
            if landed:
                return results
            if landed is False:
                raise LogUnavailable(f"COMMIT failed on {self.location}: {exc}") from exc
            raise CommitUnknown(
                f"the connection to {self.location} failed during COMMIT ({exc}); whether "
                "the records landed could not be read back"
            ) from exc
        return results

    def _landed(self, seq: int, sessions: list[str]) -> bool | None:
        """After a failed COMMIT: whether the transaction that drew ``seq`` landed.

        The lost transaction held its sessions' lease rows locked until it ended, so
        once we hold those locks its fate is settled and the record's presence says
        which. ``None``: it cannot be told (no session to lock, or no connection).
        """
        if not sessions:
            return None
        try:
            with self._reader() as conn, conn.transaction():
                conn.execute(
                    "SELECT 1 FROM perdure_leases WHERE session_id = ANY(%s) "
                    "ORDER BY session_id FOR UPDATE",
                    (sessions,),
                )
                found = conn.execute("SELECT 1 FROM perdure_records WHERE seq = %s", (seq,))
                return found.fetchone() is not None
        except (psycopg.Error, LogError):
            return None

    def _apply(
        self,
        batches: Sequence[Batch],
        seqs: list[int],
        held: dict[str, int],
        leases: dict[str, tuple[str, int]],
        infos: dict[str, SessionInfo],
        deleted: set[str],
    ) -> tuple[CommitResult, list[tuple[int, str, bytes]], set[str]]:
        """Decide each batch in order (a revision earlier in the transaction is in force).

        Sessions a batch deletes are added to ``deleted``: their rows go in the same
        transaction."""
        results: CommitResult = []
        rows: list[tuple[int, str, bytes]] = []
        touched: set[str] = set()
        next_seq = iter(seqs)
        for records, guard in batches:
            batch_sessions = {r.session_id for r in records if r.session_id}
            batch_sessions.update(r.deleted for r in records if isinstance(r, SessionDeleted))
            if guard is not None:
                batch_sessions.add(guard.session_id)
            fenced = self._fence_reason(sorted(batch_sessions), held, leases)
            if fenced is not None:
                results.append(fenced)
                continue
            if guard is not None:
                info = infos.get(guard.session_id)
                found = info.goal_rev if info else 0
                if found != guard.goal_rev:
                    results.append(StaleGoal(guard.session_id, guard.goal_rev, found))
                    continue
            try:
                records = [self._deleting(r, infos, deleted) for r in records]
            except SessionBusy as exc:  # nothing of this batch was written yet
                results.append(exc)
                continue
            try:
                numbered = [(next(next_seq), record) for record in records]
                frames = [encode(record, seq) for seq, record in numbered]
            except Exception as exc:  # nothing of this batch was written yet
                results.append(exc)
                continue
            committed = []
            for (seq, record), frame in zip(numbered, frames, strict=True):
                sid = record.session_id
                rows.append((seq, sid, frame))
                if sid:
                    touched.add(sid)
                    info = infos.get(sid) or SessionInfo.empty(sid)
                    infos[sid] = info.advanced(seq, record)
                committed.append(Committed(seq, record))
            results.append(committed)
        return results, rows, touched

    @staticmethod
    def _deleting(record: Record, infos: dict[str, SessionInfo], deleted: set[str]) -> Record:
        """For a ``SessionDeleted``: note the session to delete in this transaction and
        count its records; ``SessionBusy`` while it has unfinished work."""
        if not isinstance(record, SessionDeleted):
            return record
        info = infos.pop(record.deleted, None)
        if info is not None and info.open_submissions > 0:
            infos[record.deleted] = info
            raise SessionBusy(record.deleted, info.open_submissions)
        deleted.add(record.deleted)
        return attrs.evolve(record, records=info.records if info is not None else 0)

    def _forget_fenced(self, results: CommitResult, held: dict[str, int]) -> None:
        """A fenced session is no longer ours: drop it, so nothing here uses it again."""
        with self._lock:
            for result in results:
                if isinstance(result, SessionFenced):
                    current = self._held.get(result.session_id)
                    if current is not None and current.epoch == held.get(result.session_id):
                        del self._held[result.session_id]

    def _fence_reason(
        self, sessions: list[str], held: dict[str, int], leases: dict[str, tuple[str, int]]
    ) -> SessionFenced | None:
        for sid in sessions:
            epoch = held.get(sid)
            row = leases.get(sid)
            if epoch is not None and row == (self._node_id, epoch):
                continue
            if epoch is None:
                detail = f"node {self._node_id} holds no lease on it"
            elif row is None:
                detail = f"its lease (epoch {epoch}) is gone"
            else:
                detail = (
                    f"node {self._node_id} lost its lease (epoch {epoch}); node {row[0]} "
                    f"holds it at epoch {row[1]}"
                )
            return SessionFenced(sid, detail)
        return None

    # -- reading (any thread) --------------------------------------------------------

    def _rows(self, rows: Sequence[tuple[Any, ...]]) -> list[Committed]:
        out = []
        for seq, sid, frame in rows:
            record: Record = decode(seq, bytes(frame))
            if record.session_id != sid:
                raise CorruptRecord(
                    seq, f"stored under session {sid!r}, but it belongs to {record.session_id!r}"
                )
            out.append(Committed(seq, record))
        return out

    def read_session(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> list[Committed]:
        """The session's records with seq > ``after``, in order (at most ``limit``)."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT seq, session_id, frame FROM perdure_records "
                "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
                (session_id, after, limit),
            ).fetchall()
        return self._rows(rows)

    def read_system(self, after: int = 0) -> list[Committed]:
        """The system records (node starts: ``LogOpened``) with seq > ``after``."""
        return self.read_session("", after)

    def read_global(self, after: int = 0, limit: int | None = None) -> list[Committed]:
        """All records with seq > ``after`` in seq order (gaps allowed), system ones included."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT seq, session_id, frame FROM perdure_records "
                "WHERE seq > %s ORDER BY seq LIMIT %s",
                (after, limit),
            ).fetchall()
        return self._rows(rows)

    def last_seq(self) -> int:
        with self._reader() as conn:
            row = conn.execute("SELECT coalesce(max(seq), 0) FROM perdure_records").fetchone()
        return int(row[0]) if row else 0

    def active_sessions(self) -> list[str]:
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT session_id FROM perdure_sessions WHERE open_submissions > 0 "
                "ORDER BY session_id"
            ).fetchall()
        return [r[0] for r in rows]

    _INFO: Final = (
        "SELECT session_id, first_seq, last_seq, records, goal_rev, open_submissions "
        "FROM perdure_sessions"
    )

    def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        # In the database's order of text (its collation), which its primary key index
        # serves: a page is read from the index, not sorted from every session.
        query = self._INFO + " WHERE session_id > %(after)s"
        if active:
            query += " AND open_submissions > 0"
        query += " ORDER BY session_id LIMIT %(limit)s"
        with self._reader() as conn:
            rows = conn.execute(
                query, {"after": after, "limit": None if limit is None else max(0, limit)}
            ).fetchall()
        return [SessionInfo(*row) for row in rows]

    def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        # The index on first_seq (schema version 2) serves the page, newest first.
        query = self._INFO + " WHERE (%(before)s = 0 OR first_seq < %(before)s)"
        if active:
            query += " AND open_submissions > 0"
        query += " ORDER BY first_seq DESC LIMIT %(limit)s"
        params = {
            "before": min(before, (1 << 63) - 1),  # bigint's largest: below it is everything
            "limit": None if limit is None else max(0, limit),
        }
        with self._reader() as conn:
            rows = conn.execute(query, params).fetchall()
        return [SessionInfo(*row) for row in rows]

    def session_info(self, session_id: str) -> SessionInfo | None:
        with self._reader() as conn:
            row = conn.execute(self._INFO + " WHERE session_id = %s", (session_id,)).fetchone()
        return None if row is None else SessionInfo(*row)

    def scan_frames(self) -> Iterator[tuple[int, bytes]]:
        """Every stored frame in order, undecoded (for ``perdure check``)."""
        with self._reader() as conn:
            for seq, frame in conn.execute("SELECT seq, frame FROM perdure_records ORDER BY seq"):
                yield seq, bytes(frame)

    # -- ownership: leases -----------------------------------------------------------

    def _hold(self, sid: str, epoch: int, asked_at: float) -> None:
        with self._lock:
            current = self._held.get(sid)
            # Two takers on this node at once (a command, the heartbeat): the later
            # epoch is the one in the database.
            if current is None or current.epoch <= epoch:
                self._held[sid] = _Held(epoch, asked_at + self._lease_ttl * _FRESH_MARGIN)

    def acquire(self, session_id: str) -> None:
        """Lease the session to this node, or raise ``NotOwner`` naming its live owner."""
        with self._lock:
            if session_id in self._held:
                return
        for _ in range(_RETRIES):
            asked_at = time.monotonic()
            with self._reader() as conn:
                epoch = self._try_acquire(conn, session_id)
                if epoch is not None:
                    self._hold(session_id, epoch, asked_at)
                    return
                row = conn.execute(
                    """SELECT l.owner,
                              extract(epoch FROM l.expires_at - statement_timestamp()),
                              n.pid, n.host
                         FROM perdure_leases l LEFT JOIN perdure_nodes n ON n.node_id = l.owner
                        WHERE l.session_id = %s""",
                    (session_id,),
                ).fetchone()
            if row is not None and row[1] is not None and float(row[1]) > 0:
                owner, left, pid, host = row
                about = f"pid {pid} on {host}" if pid is not None else ""
                raise NotOwner(session_id, owner, float(left), about)
        raise LogError(f"session {session_id}: could not take its lease (it kept changing hands)")

    def _try_acquire(self, conn: psycopg.Connection[Any], session_id: str) -> int | None:
        params = {
            "sid": session_id,
            "node": self._node_id,
            "ttl": self._lease_ttl,
            "takeover": self.takeover,
            "node_epoch": self.epoch,
            "wait_ms": self._lock_limit_ms,
        }
        try:
            row = conn.execute(_ACQUIRE, params).fetchone()
        except psycopg.errors.LockNotAvailable:
            # The lease row is locked by a transaction that does not end. If it is the
            # (expired) owner's, that node is stopped or cut off mid-commit: end its
            # transaction, whose commit could only be fenced anyway, and try once more.
            conn.execute(_EVICT, params)
            row = conn.execute(_ACQUIRE, params).fetchone()
        return None if row is None else int(row[0])

    def claim(self) -> list[str]:
        """Take orphaned active sessions (lease free or expired) up to a fair share.

        The share is ceil(active sessions / live nodes), so as long as any session is
        orphaned, at least one live node is below its share and takes it. With
        ``takeover``, nodes that started before this one count as gone.
        """
        asked_at = time.monotonic()
        params = {"node": self._node_id, "takeover": self.takeover, "node_epoch": self.epoch}
        with self._reader() as conn:
            row = conn.execute(
                """SELECT count(*) FROM perdure_nodes
                    WHERE expires_at > statement_timestamp()
                      AND NOT (%(takeover)s AND epoch < %(node_epoch)s)""",
                params,
            ).fetchone()
            live = max(1, int(row[0]) if row else 1)
            rows = conn.execute(
                """SELECT s.session_id, s.last_seq, l.owner,
                          l.owner IS NULL OR l.expires_at < statement_timestamp()
                          OR (%(takeover)s AND n.epoch < %(node_epoch)s)
                     FROM perdure_sessions s
                     LEFT JOIN perdure_leases l USING (session_id)
                     LEFT JOIN perdure_nodes n ON n.node_id = l.owner
                    WHERE s.open_submissions > 0""",
                params,
            ).fetchall()
            held = self.held()
            mine = sum(1 for sid, _, _, _ in rows if sid in held)
            want = math.ceil(len(rows) / live) - mine
            last_seqs = {sid: int(last) for sid, last, _, _ in rows}
            candidates = [sid for sid, _, owner, free in rows if free and sid not in held]
            random.shuffle(candidates)
            gained: list[str] = []
            for sid in candidates:
                if len(gained) >= want:
                    break
                epoch = self._try_acquire(conn, sid)
                if epoch is not None:
                    self._hold(sid, epoch, asked_at)
                    gained.append(sid)
        # Which ones this node takes is random (fair between nodes); the order it
        # resumes them in is the recovery order.
        return sorted(gained, key=lambda sid: (last_seqs[sid], sid))

    def renew(self) -> list[str]:
        """Extend this node's liveness and leases; return the sessions whose lease was lost."""
        asked_at = time.monotonic()
        with self._lock:
            items = [(sid, h.epoch) for sid, h in self._held.items()]
        with self._reader() as conn:
            conn.execute(_ALIVE, (self._lease_ttl, self._node_id))
            kept: set[tuple[str, int]] = set()
            if items:
                rows = conn.execute(
                    _RENEW,
                    {
                        "ttl": self._lease_ttl,
                        "sids": [sid for sid, _ in items],
                        "epochs": [epoch for _, epoch in items],
                        "node": self._node_id,
                    },
                ).fetchall()
                kept = {(sid, int(epoch)) for sid, epoch in rows}
        lost = []
        fresh = asked_at + self._lease_ttl * _FRESH_MARGIN
        with self._lock:
            for sid, epoch in items:
                current = self._held.get(sid)
                if current is None or current.epoch != epoch:
                    continue  # re-acquired or dropped meanwhile
                if (sid, epoch) in kept:
                    self._held[sid] = _Held(epoch, fresh)
                else:
                    del self._held[sid]
                    lost.append(sid)
        return sorted(lost)

    def is_fresh(self, session_id: str) -> bool:
        """Whether the lease is certainly ours without asking the database (non-blocking)."""
        with self._lock:
            held = self._held.get(session_id)
        return held is not None and time.monotonic() < held.fresh_until

    def confirm(self, session_id: str) -> bool:
        """Whether the lease is certainly still ours: locally fresh, or renewed right now."""
        with self._lock:
            held = self._held.get(session_id)
        if held is None:
            return False
        if time.monotonic() < held.fresh_until:
            return True
        asked_at = time.monotonic()
        with self._reader() as conn:
            row = conn.execute(
                _RENEW,
                {
                    "ttl": self._lease_ttl,
                    "sids": [session_id],
                    "epochs": [held.epoch],
                    "node": self._node_id,
                },
            ).fetchone()
        fresh = asked_at + self._lease_ttl * _FRESH_MARGIN
        with self._lock:
            current = self._held.get(session_id)
            if current is None or current.epoch != held.epoch:
                return False  # given up or lost meanwhile (or taken again, under a new epoch)
            if row is None:
                del self._held[session_id]
                return False
            # The heartbeat may have renewed it meanwhile: that is no reason to say no.
            if current.fresh_until < fresh:
                self._held[session_id] = _Held(held.epoch, fresh)
        return True

    def release_session(self, session_id: str) -> None:
        """Give the session's lease up now (another node may take it at once)."""
        with self._lock:
            held = self._held.pop(session_id, None)
        if held is None:
            return
        with self._reader() as conn:
            conn.execute(
                "UPDATE perdure_leases SET expires_at = '-infinity' "
                "WHERE session_id = %s AND owner = %s AND epoch = %s",
                (session_id, self._node_id, held.epoch),
            )

    # -- rebalancing: surveys and hand-overs ----------------------------------------

    def survey(self) -> ClusterView:
        """The live nodes (as ``claim`` counts them) and the active sessions each holds."""
        params = {"takeover": self.takeover, "node_epoch": self.epoch}
        with self._reader() as conn:
            rows = conn.execute(_SURVEY, params).fetchall()
        if not rows:
            return ClusterView()
        nodes = tuple(NodeLoad(node, int(held), float(up)) for node, up, held, _ in rows)
        return ClusterView(nodes, int(rows[0][3]))

    def hand_over(self, session_id: str, target: str) -> bool:
        """Give the session's lease to the live node ``target``, which takes it with
        ``accept``; from now on this node is fenced from the session. True once
        ``target`` holds it; False if the lease was not ours any more, or if ``target``
        is no longer live (then the lease is released, for whoever claims it)."""
        with self._lock:
            held = self._held.pop(session_id, None)
        if held is None:
            return False
        params = {
            "sid": session_id,
            "target": target,
            "node": self._node_id,
            "epoch": held.epoch,
            "ttl": self._lease_ttl,
        }
        with self._reader() as conn:
            if conn.execute(_HAND_OVER, params).fetchone() is not None:
                return True
            conn.execute(
                "UPDATE perdure_leases SET expires_at = '-infinity' "
                "WHERE session_id = %(sid)s AND owner = %(node)s AND epoch = %(epoch)s",
                params,
            )
        return False

    def accept(self) -> list[str]:
        """Take the active sessions other nodes handed to this one (``hand_over``)."""
        asked_at = time.monotonic()
        params = {"node": self._node_id, "ttl": self._lease_ttl, "held": sorted(self.held())}
        with self._reader() as conn:
            rows = conn.execute(_ACCEPT, params).fetchall()
        for sid, epoch in rows:
            self._hold(sid, int(epoch), asked_at)
        return sorted(sid for sid, _ in rows)

    def lease_rows(self) -> list[dict[str, Any]]:
        """Every lease as stored (for tests and ``perdure`` diagnostics)."""
        with self._reader() as conn:
            rows = conn.execute(
                """SELECT session_id, owner, epoch,
                          extract(epoch FROM expires_at - statement_timestamp())
                     FROM perdure_leases ORDER BY session_id"""
            ).fetchall()
        return [
            {"session_id": sid, "owner": owner, "epoch": epoch, "expires_in": float(left)}
            for sid, owner, epoch, left in rows
        ]

    # -- listening -------------------------------------------------------------------

    def listen(self, wake: Wake, stop: threading.Event) -> None:
        """Until ``stop`` is set: call ``wake`` with the sessions other nodes committed.

        After (re)connecting, ``wake(None)``: notifications may have been missed while
        not listening, so every follower re-reads. Followers poll anyway, so a lost
        connection delays streaming, it never loses records.
        """
        backoff = 0.1
        while not stop.is_set():
            try:
                with psycopg.connect(
                    self.url, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    wake(None)
                    backoff = 0.1
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            if note.pid == self._writer_pid:
                                continue  # our own commits reach followers through the bus
                            if note.payload == "*":
                                wake(None)
                            else:
                                wake(frozenset(note.payload.split(",")))
            except psycopg.Error:
                stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
