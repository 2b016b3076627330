"""The append-only log in one LMDB environment: blocking code, called from worker threads.

Layout (named databases in one environment, by default ``./.perdure/``):

``records``   seq (8 bytes, big-endian) -> framed record (see ``codec``); global, gap-free
``by_session``session id + NUL + seq -> empty; one session's records are a range scan
``active``    session id -> count of unfinished submissions; kept in the same transaction
              as the records that change it, so start-up reads active work, not history
``sessions``  session id -> small JSON summary (first/last seq, record count, goal_rev)
``created``   a session's first seq (8 bytes, big-endian) -> its id: the sessions in
              order of creation, so a page of the newest reads only its own summaries;
              kept in the transaction that writes a session's first record or deletes it
              (built at open, by the owner, for a log written before it existed)
``meta``      b"epoch" -> owner epoch; b"format" -> layout version

Ownership: a process owns the log while it holds an exclusive ``flock`` on
``owner.lock`` (which names the owner). At open the owner bumps ``epoch`` and
appends a ``LogOpened`` record; every later write transaction checks that the
epoch is still its own, so an owner that was stopped and then taken over can
never write again (it gets ``LogFenced``).

The ownership hooks of ``LogBackend`` are trivial here: the whole-log lock and the
epoch already make this process the only writer, so every session lease is granted.

Thread rules: ``commit`` must only be called from the Journal's writer thread (an
LMDB write transaction begins, writes and commits on one thread). Reads may run on
any thread; each read transaction begins and ends within one call.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import lmdb

from perdure._libc import dont_need
from perdure.storage.backend import (
    Batch,
    CommitResult,
    Durability,
    SessionInfo,
)
from perdure.storage.codec import CorruptRecord, decode, encode
from perdure.storage.common import SingleOwner, claim_writer
from perdure.storage.errors import (
    LogBusy,
    LogError,
    LogFenced,
    LogFormatError,
    SessionBusy,
    StaleGoal,
    StorageFull,
)
from perdure.storage.records import Committed, LogOpened, Record, SessionDeleted

LAYOUT_VERSION: Final = b"1"
DEFAULT_MAP_SIZE: Final = 256 << 20
_SEP: Final = b"\x00"
SYSTEM: Final = ""  # the index key of records that belong to no session (no session id is "")
_EPOCH: Final = b"epoch"
# Session summaries kept as last committed, for the sessions written most recently.
SUMMARY_CACHE: Final = 4096


def _seq_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def _session_key(session_id: str, seq: int) -> bytes:
    return session_id.encode() + _SEP + _seq_key(seq)


class _Gate:
    """Lets many read transactions run at once, or one map resize with none running.

    LMDB's mdb_env_set_mapsize may only be called while this process has no
    transaction open; the gate makes that true without stopping readers for long.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class _OwnerLock:
    """An exclusive flock on ``owner.lock``; the file's content names the owner."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, takeover: bool) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owner = self.describe_owner()
                if not takeover:
                    raise LogBusy(
                        f"the log {self.path.parent} is owned by {owner}; stop that process "
                        "first, or open with takeover=True if it is stopped or hung"
                    ) from None
                self._replace_lock_file()
                continue
            # A takeover may have replaced the file between our open and our lock.
            if os.fstat(fd).st_ino != _inode(self.path):
                os.close(fd)
                continue
            self._fd = fd
            return

    def _replace_lock_file(self) -> None:
        # The stuck owner keeps its lock on the old inode; we lock a new one. The epoch
        # check in every write transaction then fences the old owner.
        tmp = self.path.with_suffix(f".takeover-{os.getpid()}")
        tmp.write_text("")
        os.replace(tmp, self.path)

    def describe_owner(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if not info:
            return "another process"
        return f"pid {info.get('pid')} on {info.get('host')} (epoch {info.get('epoch')})"

    def write_owner(self, info: dict[str, Any]) -> None:
        assert self._fd is not None
        data = json.dumps(info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _inode(path: Path) -> int:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return -1


def _summary_bytes(info: SessionInfo) -> bytes:
    """A session's summary as stored: a JSON object of four integers (``_summary`` reads
    it back with ``json.loads``). Formatted directly: written once per session in every
    transaction, and ``json.dumps`` costs ten times as much for the same object."""
    return b'{"first_seq":%d,"last_seq":%d,"records":%d,"goal_rev":%d}' % (
        info.first_seq,
        info.last_seq,
        info.records,
        info.goal_rev,
    )


_LAST_SEQ: Final = re.compile(rb'"last_seq":\s*(\d+)')


def _last_seq_of(summary: bytes | memoryview) -> int:
    """The ``last_seq`` of a stored summary (``_summary_bytes``'s, or an older build's
    ``json.dumps``, whose separators have a space)."""
    found = _LAST_SEQ.search(summary)
    if found is not None:
        return int(found[1])
    return int(json.loads(bytes(summary))["last_seq"])


class LmdbLog(SingleOwner):
    """One LMDB environment holding one runtime's log. See the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = 1 << 40,
        readonly: bool = False,
        takeover: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if durability not in ("full", "fast"):
            raise ValueError(f"durability must be 'full' or 'fast', not {durability!r}")
        self.path = Path(path)
        self.readonly = readonly
        self.durability = durability
        self._max_map_size = max_map_size
        self._clock = clock
        self._gate = _Gate()
        self._lock: _OwnerLock | None = None
        self._writers: tuple[threading.Thread, ...] = ()
        self.map_releases = 0  # calls of release_mapped_pages that went through
        self.write_threads: set[int] = set()  # idents of threads that ran write txns
        self.epoch = 0
        # The summary of each session as this process last committed it (the owner is
        # the only writer, and a taken-over owner is fenced before it reads one), so a
        # commit reads the sessions table only for sessions it has not written lately.
        self._summaries: dict[str, SessionInfo] = {}
        if readonly:
            if not (self.path / "data.mdb").exists():
                raise FileNotFoundError(f"no perdure log at {self.path}")
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = _OwnerLock(self.path / "owner.lock")
            self._lock.acquire(takeover=takeover)
        try:
            self.env = self._open_env(map_size, lock=True)
            # A crashed owner leaves reader slots behind; they would pin old pages.
            if not readonly:
                self.env.reader_check()
            txn = None if readonly else self.env.begin(write=True)
            try:
                self._records = self.env.open_db(b"records", txn=txn, create=not readonly)
                self._by_session = self.env.open_db(b"by_session", txn=txn, create=not readonly)
                self._active = self.env.open_db(b"active", txn=txn, create=not readonly)
                self._sessions = self.env.open_db(b"sessions", txn=txn, create=not readonly)
                self._meta = self.env.open_db(b"meta", txn=txn, create=not readonly)
            except lmdb.NotFoundError:
                # A reader that arrives while the first owner is still creating the log.
                raise FileNotFoundError(
                    f"the perdure log at {self.path} is not initialised yet"
                ) from None
            if txn is not None:
                txn.commit()
            # None: a read-only open of a log no owner of this build has opened yet (its
            # listings by creation then sort the summaries instead).
            self._created: Any = self._open_created()
            if readonly:
                with self.env.begin() as read:
                    layout = read.get(b"format", db=self._meta)
                if layout is not None and layout != LAYOUT_VERSION:
                    raise LogFormatError(str(self.path), layout, LAYOUT_VERSION)
            self._next_seq = self._read_last_seq() + 1
            if not readonly:
                self._claim()
        except BaseException:
            self.close()
            raise

    # -- ownership -----------------------------------------------------------------

    def _claim(self) -> None:
        assert self._lock is not None
        while True:
            try:
                self._write_open_record()
                break
            except lmdb.MapFullError:
                # Reopened, the map is as large as the data when that is more than the
                # map size asked for: with no free page left, even this record needs
                # more (seen on a 900 MB log whose created index was just built).
                self._grow()
        self._lock.write_owner(
            {"pid": os.getpid(), "host": socket.gethostname(), "epoch": self.epoch}
        )

    def _write_open_record(self) -> None:
        """Bump the epoch and append the ``LogOpened`` record, in one transaction."""
        with self.env.begin(write=True) as txn:
            layout = txn.get(b"format", db=self._meta)
            if layout is not None and layout != LAYOUT_VERSION:
                raise LogFormatError(str(self.path), layout, LAYOUT_VERSION)
            txn.put(b"format", LAYOUT_VERSION, db=self._meta)
            raw = txn.get(_EPOCH, db=self._meta)
            self.epoch = (int(raw) if raw else 0) + 1
            txn.put(_EPOCH, str(self.epoch).encode(), db=self._meta)
            opened = LogOpened(
                epoch=self.epoch, pid=os.getpid(), host=socket.gethostname(), at=self._clock()
            )
            seq = self._next_seq
            txn.put(_seq_key(seq), encode(opened, seq), db=self._records)
            txn.put(_session_key(SYSTEM, seq), b"", db=self._by_session)
        self._next_seq = seq + 1

    def _open_created(self) -> Any:
        """The ``created`` index; the owner builds it if it does not hold every session
        (a log written before it existed, or by a build that did not keep it), in its
        own transaction, growing the map as a commit does (such a log's map may be
        nearly full)."""
        if self.readonly:
            try:
                created = self.env.open_db(b"created", create=False)
            except lmdb.NotFoundError:
                return None
            with self.env.begin() as read:
                whole = read.stat(created)["entries"] == read.stat(self._sessions)["entries"]
            return created if whole else None
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    created = self.env.open_db(b"created", txn=txn, create=True)
                    if txn.stat(created)["entries"] != txn.stat(self._sessions)["entries"]:
                        txn.drop(created, delete=False)
                        with txn.cursor(db=self._sessions) as cur:
                            for key, raw in cur.iternext():
                                first = int(json.loads(bytes(raw))["first_seq"])
                                txn.put(_seq_key(first), bytes(key), db=created)
                return created
            except lmdb.MapFullError:
                self._grow()

    def _open_env(self, map_size: int, *, lock: bool) -> lmdb.Environment:
        try:
            return lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=8,
                subdir=True,
                readonly=self.readonly,
                # full: fsync data and meta page on every commit. fast: one fsync per
                # commit, meta page flushed later; a power loss may undo the last commits
                # but never breaks atomicity. A killed process loses nothing either way.
                sync=True,
                metasync=self.durability == "full",
                writemap=False,
                lock=lock,
                max_readers=512,
            )
        except lmdb.Error as exc:
            # A reader that may not write the lock file (a read-only copy, another
            # user's log) reads without LMDB's reader table, as LMDB itself does on a
            # read-only file system. No process of ours can be writing such a log;
            # another user's writer could reuse pages under the read, which the
            # frames' checksums would then report.
            denied = any(str(exc).endswith(os.strerror(c)) for c in (errno.EACCES, errno.EPERM))
            if self.readonly and lock and denied:
                return self._open_env(map_size, lock=False)
            raise

    def close(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            env.close()
        if self._lock is not None:
            self._lock.release()

    # -- the LogBackend face ---------------------------------------------------------

    @property
    def location(self) -> str:
        return str(self.path)

    inline = False
    local = True

    # -- writing (writer thread only) ------------------------------------------------

    def bind_writer(self, *threads: threading.Thread) -> None:
        """From now on, only these threads may call ``commit``."""
        self._writers = threads

    def commit(self, batches: Sequence[Batch]) -> CommitResult:
        """Write every batch in ONE transaction; return, per batch, its records or why not.

        A batch whose guard fails (``StaleGoal``), or with a record that cannot be
        encoded (the encoder's exception, e.g. for a NaN), is left out and the others
        still commit: one caller's mistake must not fail the callers it shares a
        transaction with. MAP_FULL grows the map and retries the whole transaction; a
        full disk raises ``StorageFull`` and nothing of this call is committed.
        """
        if self.readonly:
            raise LogError("the log was opened read-only")
        claim_writer(self._writers, self.write_threads, "LMDB")
        adopted = False
        while True:
            try:
                return self._commit_once(batches)
            except lmdb.MapFullError:
                self._grow()
            except lmdb.MapResizedError as exc:
                # Another process grew the map past ours. Only an owner grows it, so we
                # were taken over: adopt the size, and the retry's epoch check says so.
                if adopted:
                    raise LogError(f"LMDB write failed on {self.path}: {exc}") from exc
                adopted = True
                self._adopt_map_size()
            except lmdb.Error as exc:
                if _is_disk_full(exc, self.path):
                    raise StorageFull(f"cannot write to {self.path}: disk full ({exc})") from exc
                raise LogError(f"LMDB write failed on {self.path}: {exc}") from exc

    def _commit_once(self, batches: Sequence[Batch]) -> CommitResult:
        results: CommitResult = []
        seq = self._next_seq
        infos: dict[str, SessionInfo] = {}  # read for guards, advanced for records
        stored: dict[str, SessionInfo] = {}  # as read, to write only what changed
        deleted: set[str] = set()  # by this transaction: their cached summaries are stale
        cache = self._summaries
        with self.env.begin(write=True) as txn:
            raw = txn.get(_EPOCH, db=self._meta)
            if raw is None or int(raw) != self.epoch:
                raise LogFenced(
                    f"this process (epoch {self.epoch}) no longer owns the log {self.path}: "
                    f"it was taken over (epoch {raw.decode() if raw else '?'}); stopping"
                )

            def info_of(sid: str) -> SessionInfo:
                if sid not in infos:
                    found = None if sid in deleted else cache.get(sid)
                    if found is None:
                        found = self._summary(txn, sid) or SessionInfo.empty(sid)
                    infos[sid] = stored[sid] = found
                return infos[sid]

            for records, guard in batches:
                if guard is not None:
                    found = info_of(guard.session_id).goal_rev
                    if found != guard.goal_rev:
                        results.append(StaleGoal(guard.session_id, guard.goal_rev, found))
                        continue
                if any(isinstance(r, SessionDeleted) for r in records):
                    try:
                        records = [self._deleting(txn, r) for r in records]
                    except SessionBusy as exc:  # nothing of this batch was written yet
                        results.append(exc)
                        continue
                    for gone in (r.deleted for r in records if isinstance(r, SessionDeleted)):
                        infos.pop(gone, None)  # its summary is gone: not to be written back
                        stored.pop(gone, None)
                        deleted.add(gone)
                try:
                    frames = [encode(record, seq + i) for i, record in enumerate(records)]
                except Exception as exc:  # nothing of this batch was written yet
                    results.append(exc)
                    continue
                committed = []
                put, records_db, by_session = txn.put, self._records, self._by_session
                # Run by run of one session's records (a batch is nearly always one run):
                # its index prefix encoded once, its summary advanced once.
                start, n = 0, len(records)
                while start < n:
                    sid = records[start].session_id
                    end = start + 1
                    while end < n and records[end].session_id == sid:
                        end += 1
                    # A system record (no session) is indexed under the empty session id.
                    prefix = (sid or SYSTEM).encode() + _SEP
                    first = seq
                    for i in range(start, end):
                        key = _seq_key(seq)
                        put(key, frames[i], db=records_db)
                        put(prefix + key, b"", db=by_session)
                        committed.append(Committed(seq, records[i]))
                        seq += 1
                    if sid:
                        infos[sid] = info_of(sid).advanced_all(first, records[start:end])
                    start = end
                results.append(committed)
            for sid, info in infos.items():
                before = stored[sid]
                if info.records != before.records:
                    txn.put(sid.encode(), _summary_bytes(info), db=self._sessions)
                    if not before.records:  # its first record: the session is created
                        txn.put(_seq_key(info.first_seq), sid.encode(), db=self._created)
                if info.open_submissions != before.open_submissions:
                    if info.open_submissions:
                        txn.put(sid.encode(), str(info.open_submissions).encode(), db=self._active)
                    else:
                        txn.delete(sid.encode(), db=self._active)
        # Committed: the summaries are what the log holds now (an aborted transaction
        # raised above and left the cache as the log is, untouched).
        for gone in deleted:
            cache.pop(gone, None)
        for sid, info in infos.items():
            cache.pop(sid, None)  # re-inserted last: the most recently written
            cache[sid] = info
        while len(cache) > SUMMARY_CACHE:
            del cache[next(iter(cache))]
        self._next_seq = seq
        return results

    def _deleting(self, txn: lmdb.Transaction, record: Record) -> Record:
        """For a ``SessionDeleted``: remove the session in this transaction, and return the
        record with the number of records removed. Refused (``SessionBusy``) while the
        session has unfinished work. Other records pass through."""
        if not isinstance(record, SessionDeleted):
            return record
        sid = record.deleted
        open_work = self._count(txn, sid)
        if open_work:
            raise SessionBusy(sid, open_work)
        prefix = sid.encode() + _SEP
        keys: list[bytes] = []
        with txn.cursor(db=self._by_session) as cur:
            if cur.set_range(prefix):
                for raw_key in cur.iternext(values=False):
                    key = bytes(raw_key)
                    if not key.startswith(prefix):
                        break
                    keys.append(key)
        for key in keys:
            txn.delete(key[len(prefix) :], db=self._records)
            txn.delete(key, db=self._by_session)
        summary = txn.get(sid.encode(), db=self._sessions)
        if summary is not None:
            first = int(json.loads(bytes(summary))["first_seq"])
            txn.delete(_seq_key(first), db=self._created)
        txn.delete(sid.encode(), db=self._sessions)
        txn.delete(sid.encode(), db=self._active)
        return attrs.evolve(record, records=len(keys))

    def _summary(self, txn: lmdb.Transaction, session_id: str) -> SessionInfo | None:
        raw = txn.get(session_id.encode(), db=self._sessions)
        if raw is None:
            return None
        return SessionInfo(
            session_id=session_id,
            open_submissions=self._count(txn, session_id),
            **json.loads(bytes(raw)),
        )

    def _count(self, txn: lmdb.Transaction, session_id: str) -> int:
        raw = txn.get(session_id.encode(), db=self._active)
        return int(raw) if raw else 0

    def _grow(self) -> None:
        current = self.env.info()["map_size"]
        if current >= self._max_map_size:
            raise StorageFull(f"the log {self.path} reached its maximum map size ({current} bytes)")
        with self._gate.exclusive():
            self.env.set_mapsize(min(current * 2, self._max_map_size))

    def _adopt_map_size(self) -> None:
        with self._gate.exclusive():
            self.env.set_mapsize(0)  # 0: the size the map now has on disk

    # -- reading (any thread) --------------------------------------------------------

    @contextmanager
    def _read(self) -> Iterator[lmdb.Transaction]:
        while True:
            with self._gate.shared():
                try:
                    txn = self.env.begin(write=False)
                except lmdb.MapResizedError:
                    pass
                else:
                    try:
                        yield txn
                    finally:
                        txn.abort()
                    return
            # Another process (the owner) grew the map. Adopt its size once no read
            # of ours is open: set_mapsize would invalidate them under their feet.
            self._adopt_map_size()

    def _read_last_seq(self) -> int:
        with self._read() as txn, txn.cursor(db=self._records) as cur:
            return int.from_bytes(cur.key(), "big") if cur.last() else 0

    def last_seq(self) -> int:
        return self._read_last_seq()

    def read_session(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> list[Committed]:
        """The session's records with seq > ``after``, in order (at most ``limit``)."""
        prefix = session_id.encode() + _SEP
        out: list[Committed] = []
        with self._read() as txn, txn.cursor(db=self._by_session) as cur:
            if not cur.set_range(prefix + _seq_key(after + 1)):
                return out
            for raw_key in cur.iternext(values=False):
                key = bytes(raw_key)
                if not key.startswith(prefix):
                    break
                seq = int.from_bytes(key[len(prefix) :], "big")
                out.append(Committed(seq, self._decode_at(txn, seq)))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def read_system(self, after: int = 0) -> list[Committed]:
        """The system records (runtime starts: ``LogOpened``) with seq > ``after``."""
        return self.read_session(SYSTEM, after)

    def read_global(self, after: int = 0, limit: int | None = None) -> list[Committed]:
        """All records with seq > ``after`` in order, system records included."""
        out: list[Committed] = []
        with self._read() as txn, txn.cursor(db=self._records) as cur:
            if not cur.set_range(_seq_key(after + 1)):
                return out
            for key, value in cur.iternext():
                seq = int.from_bytes(key, "big")
                out.append(Committed(seq, decode(seq, bytes(value))))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def _decode_at(self, txn: lmdb.Transaction, seq: int) -> Record:
        frame = txn.get(_seq_key(seq), db=self._records)
        if frame is None:
            raise CorruptRecord(seq, "indexed but missing from the records table")
        return decode(seq, bytes(frame))

    def active_sessions(self) -> list[str]:
        with self._read() as txn, txn.cursor(db=self._active) as cur:
            return [bytes(key).decode() for key in cur.iternext(values=False)]

    def claim(self) -> list[str]:
        """Every active session, in recovery order (``recovery_order``: by last record,
        oldest first): one scan of the active index, and of each of those sessions'
        summary only its last seq.

        Start-up waits for this before it resumes any session, so it is kept to a few
        microseconds a session: no ``SessionInfo`` built, no second lookup of the
        open count, the last seq found in the summary's bytes without parsing the rest.
        """
        waiting: list[tuple[int, str]] = []
        with self._read() as txn, txn.cursor(db=self._active) as cur:
            get, summaries = txn.get, self._sessions
            for key in cur.iternext(values=False):
                raw = get(key, db=summaries)
                if raw is not None:
                    waiting.append((_last_seq_of(raw), bytes(key).decode()))
        waiting.sort()  # (last seq, session id): recovery_order's key
        return [sid for _, sid in waiting]

    def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        out: list[SessionInfo] = []
        if limit is not None and limit <= 0:
            return out
        start = after.encode()
        with self._read() as txn:
            counts: dict[str, int] | None = None
            if limit is None and not active:
                # Every session from here on: one scan of the (small) active index
                # instead of a lookup per session.
                counts = {
                    bytes(k).decode(): int(bytes(v))
                    for k, v in txn.cursor(db=self._active).iternext()
                }

            # Keys sort as the ids' UTF-8 bytes: a page starts at the first key past
            # ``after``, and no key outside the page is read.
            cursor = txn.cursor(db=self._active if active else self._sessions)
            # An ``after`` longer than any key LMDB takes (no session id is) still
            # places the page: the search starts at its prefix, and keys up to it are
            # skipped.
            prefix = start[: self.env.max_key_size()]
            found = cursor.set_range(prefix) if prefix else cursor.first()
            while found:
                key = bytes(cursor.key())
                if key > start:
                    sid = key.decode()
                    if active:
                        summary = self._summary(txn, sid)
                        if summary is not None:
                            out.append(summary)
                    else:
                        out.append(
                            SessionInfo(
                                session_id=sid,
                                open_submissions=(
                                    self._count(txn, sid) if counts is None else counts.get(sid, 0)
                                ),
                                **json.loads(bytes(cursor.value())),
                            )
                        )
                    if limit is not None and len(out) >= limit:
                        break
                found = cursor.next()
            return out

    def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        """The sessions' summaries newest first (by creation): a reverse scan of the
        ``created`` index from ``before``, reading only the page's own summaries; with
        ``active``, the active sessions' summaries (the active index), sorted."""
        out: list[SessionInfo] = []
        if limit is not None and limit <= 0:
            return out
        if before >= 1 << 64:  # past every seq: from the newest
            before = 0
        if active or self._created is None:  # (no index: a read-only open of an old log)
            every = self.sessions(active=active)
            every.sort(key=lambda i: i.first_seq, reverse=True)
            found = [i for i in every if not before or i.first_seq < before]
            return found if limit is None else found[:limit]
        with self._read() as txn, txn.cursor(db=self._created) as cur:
            if before:
                # The last key below ``before``: the first at or past it, then back.
                at = cur.prev() if cur.set_range(_seq_key(before)) else cur.last()
            else:
                at = cur.last()
            while at:
                summary = self._summary(txn, bytes(cur.value()).decode())
                if summary is not None:
                    out.append(summary)
                    if limit is not None and len(out) >= limit:
                        break
                at = cur.prev()
        return out

    def session_info(self, session_id: str) -> SessionInfo | None:
        with self._read() as txn:
            return self._summary(txn, session_id)

    def stored_epoch(self) -> int:
        with self._read() as txn:
            raw = txn.get(_EPOCH, db=self._meta)
            return int(raw) if raw else 0

    def scan_frames(self) -> Iterator[tuple[int, bytes]]:
        """Every stored frame in order, undecoded (for ``perdure check``)."""
        with self._read() as txn, txn.cursor(db=self._records) as cur:
            for key, value in cur.iternext():
                yield int.from_bytes(key, "big"), bytes(value)

    def stat(self) -> dict[str, Any]:
        info = self.env.info()
        return {"map_size": info["map_size"], "next_seq": self._next_seq, "epoch": self.epoch}

    # -- the map's resident pages (any thread) ---------------------------------------

    def release_mapped_pages(self) -> int:
        """Drop the log's pages from this process's resident set; they stay cached.

        LMDB reads the log through a shared read-only map, and on each page fault the
        kernel also maps the neighbouring pages that are in the page cache (fault-
        around): the pages every commit has just written. So the resident set grows
        toward the size of the log although the process holds none of it. Those are
        clean page-cache pages; ``MADV_DONTNEED`` on a shared file mapping only
        removes this process's page-table entries, and the next read maps the same
        page again, unchanged. Under the shared side of the gate, so the map cannot
        move meanwhile (a resize takes the exclusive side). Linux only (elsewhere,
        and if anything fails, it does nothing); returns the bytes advised.
        """
        # The cached summaries go too: a quiet log's cache is memory nobody uses, and
        # objects left from a burst keep the allocator's pages (the next commit of each
        # session reads its summary again). Rebound, not cleared: a commit on the trio
        # thread that runs meanwhile keeps using the dict it started with.
        self._summaries = {}
        data = os.path.realpath(self.path / "data.mdb")
        with self._gate.shared():
            try:
                ranges = _mapped_ranges(data)
                advised = sum(dont_need(start, end) for start, end in ranges)
            except OSError:
                return 0
        self.map_releases += 1
        return advised


def _mapped_ranges(path: str) -> list[tuple[int, int]]:
    """The address ranges where this process maps ``path`` (from /proc/self/maps).

    Read as bytes in one go: a text-mode read left a few small objects behind per
    call, and this runs after every burst, when they pin otherwise empty arenas.
    """
    wanted = os.fsencode(path)
    found = []
    with open("/proc/self/maps", "rb") as maps:
        listing = maps.read()
    for line in listing.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == wanted:
            start, end = fields[0].split(b"-")
            found.append((int(start, 16), int(end, 16)))
    return found


# Less free space than one LMDB write (64 pages) after a short write means "full".
_NEARLY_FULL: Final = 64 * 4096


def _is_disk_full(exc: lmdb.Error, path: Path) -> bool:
    """Whether a failed LMDB write means the disk (or quota) is full.

    LMDB returns ENOSPC (py-lmdb's ``DiskError``) only when a write finds no space at
    all. A write that finds *some* space is cut short, and LMDB reports a short write
    as EIO ("short write, filesystem full?"); on a filling disk that is the usual
    case. So EIO counts as full when the filesystem has (almost) no space left.
    """
    code = getattr(exc, "code", None)
    if isinstance(exc, lmdb.DiskError) or code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    if code == errno.EIO:
        try:
            st = os.statvfs(path)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < _NEARLY_FULL
    return False
