"""A log in this process's memory: the ``LogBackend`` for deterministic runtime tests.

``MemoryLog`` keeps what the LMDB log keeps — the CRC-framed records under
gap-free sequence numbers, each session's index, its ``SessionInfo`` summary (the
active index included), an owner epoch — in Python containers, and applies the
same rules: a batch's guard is checked in the transaction, an unencodable batch
fails alone, a ``LogOpened`` record marks every open, and a handle whose epoch is
no longer the store's is fenced (``LogFenced``). Records are stored encoded and
decoded on read, so what a test reads back went through the codec exactly as it
would on disk.

It never blocks, so it says ``inline``: the Journal commits it on the trio thread
and reads it there, with no thread at all, and a runtime over it runs under
``trio.testing.MockClock(autojump_threshold=0)`` with every back-off, heartbeat and
timeout decided by the clock alone.

A restart is simulated on the same store: ``log.reopen()`` (after ``close``) is a
new process opening the log; ``log.reopen(takeover=True)`` takes it from an owner
that is still open, which is then fenced. Nothing survives the Python process:
this backend is for tests, never a deployment.

``open_log(":memory:")`` returns a new, empty one; ``open_log(log)`` (or
``open_runtime(log)``) returns the object itself, so a test can keep it across
runtimes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import attrs

from perdure.storage.backend import (
    Batch,
    CommitResult,
    Durability,
    SessionInfo,
    recovery_order,
)
from perdure.storage.codec import CorruptRecord, decode, encode
from perdure.storage.common import SingleOwner, claim_writer
from perdure.storage.errors import LogBusy, LogError, LogFenced, SessionBusy, StaleGoal
from perdure.storage.records import Committed, LogOpened, Record, SessionDeleted

LOCATION = ":memory:"


@attrs.define
class _Store:
    """What a log holds; shared by every handle reopened on it."""

    frames: dict[int, bytes] = attrs.field(factory=dict)  # seq -> framed record
    by_session: dict[str, list[int]] = attrs.field(factory=dict)  # "" holds system records
    summaries: dict[str, SessionInfo] = attrs.field(factory=dict)
    epoch: int = 0
    owner: MemoryLog | None = None
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    last_seq: int = 0  # the highest seq written (deleted sessions leave gaps below it)

    @property
    def next_seq(self) -> int:
        return self.last_seq + 1  # a refused batch draws no number


class MemoryLog(SingleOwner):
    """A log in memory (module docstring). ``MemoryLog()`` is a new, empty log, owned."""

    inline = True
    local = False  # committed inline anyway

    def __init__(
        self,
        *,
        durability: Durability = "full",
        clock: Callable[[], float] = time.time,
        readonly: bool = False,
        takeover: bool = False,
        _store: _Store | None = None,
    ) -> None:
        if durability not in ("full", "fast"):
            raise ValueError(f"durability must be 'full' or 'fast', not {durability!r}")
        self.durability = durability
        self.readonly = readonly
        self._clock = clock
        self._store = _store if _store is not None else _Store()
        self._writers: tuple[threading.Thread, ...] = ()
        self._closed = False
        self.write_threads: set[int] = set()  # idents of threads that committed
        self.epoch = 0
        if not readonly:
            self._claim(takeover)

    def reopen(self, *, takeover: bool = False, readonly: bool = False) -> MemoryLog:
        """A new handle on this log's records, as a restarted process would open it.

        Refused with ``LogBusy`` while an owner is open, unless ``takeover`` (the old
        owner is then fenced) or ``readonly`` (a reader beside the owner).
        """
        return MemoryLog(
            durability=self.durability,
            clock=self._clock,
            readonly=readonly,
            takeover=takeover,
            _store=self._store,
        )

    def _claim(self, takeover: bool) -> None:
        store = self._store
        with store.lock:
            if store.owner is not None and not takeover:
                raise LogBusy(
                    f"the in-memory log is owned by the handle of epoch {store.owner.epoch}; "
                    "close it first, or reopen with takeover=True"
                )
            store.epoch += 1
            store.owner = self
            self.epoch = store.epoch
            seq = store.next_seq
            opened = LogOpened(
                epoch=self.epoch, pid=os.getpid(), host=socket.gethostname(), at=self._clock()
            )
            store.frames[seq] = encode(opened, seq)
            store.by_session.setdefault("", []).append(seq)
            store.last_seq = seq

    def close(self) -> None:
        with self._store.lock:
            self._closed = True
            if self._store.owner is self:
                self._store.owner = None

    # -- the LogBackend face ---------------------------------------------------------

    @property
    def location(self) -> str:
        return LOCATION

    # -- writing -----------------------------------------------------------------------

    def bind_writer(self, *threads: threading.Thread) -> None:
        """From now on, only these threads may call ``commit`` (inline: the trio thread)."""
        self._writers = threads

    def commit(self, batches: Sequence[Batch]) -> CommitResult:
        """Write every batch as one transaction; per batch, its records or why not.

        The same rules as the LMDB log: a stale guard (``StaleGoal``) or an
        unencodable record fails that batch alone; a fenced handle writes nothing.
        """
        if self.readonly:
            raise LogError("the log was opened read-only")
        claim_writer(self._writers, self.write_threads, "in-memory")
        store = self._store
        with store.lock:
            self._check_open()
            if store.epoch != self.epoch:
                raise LogFenced(
                    f"this handle (epoch {self.epoch}) no longer owns the in-memory log: it "
                    f"was taken over (epoch {store.epoch}); stopping"
                )
            results: CommitResult = []
            seq = store.next_seq
            infos: dict[str, SessionInfo] = {}  # this transaction's summaries
            frames: dict[int, bytes] = {}
            index: list[tuple[str, int]] = []

            def info_of(sid: str) -> SessionInfo:
                if sid not in infos:
                    infos[sid] = store.summaries.get(sid) or SessionInfo.empty(sid)
                return infos[sid]

            deleted: set[str] = set()

            def deleting(record: Record) -> Record:
                """A ``SessionDeleted`` removes its session at the transaction's end."""
                if not isinstance(record, SessionDeleted):
                    return record
                info = info_of(record.deleted)
                if info.open_submissions:
                    raise SessionBusy(record.deleted, info.open_submissions)
                deleted.add(record.deleted)
                infos.pop(record.deleted)
                return attrs.evolve(record, records=info.records)

            for records, guard in batches:
                if guard is not None:
                    found = info_of(guard.session_id).goal_rev
                    if found != guard.goal_rev:
                        results.append(StaleGoal(guard.session_id, guard.goal_rev, found))
                        continue
                try:
                    records = [deleting(r) for r in records]
                except SessionBusy as exc:  # nothing of this batch was written yet
                    results.append(exc)
                    continue
                try:
                    encoded = [encode(record, seq + i) for i, record in enumerate(records)]
                except Exception as exc:  # nothing of this batch was written yet
                    results.append(exc)
                    continue
                committed = []
                for record, frame in zip(records, encoded, strict=True):
                    sid = record.session_id
                    frames[seq] = frame
                    index.append((sid, seq))
                    if sid:
                        infos[sid] = info_of(sid).advanced(seq, record)
                    committed.append(Committed(seq, record))
                    seq += 1
                results.append(committed)
            # The transaction's end: everything at once, or (on an exception above) nothing.
            for sid in deleted:
                for at in store.by_session.pop(sid, []):
                    store.frames.pop(at, None)
                store.summaries.pop(sid, None)
            store.last_seq = seq - 1
            store.frames.update(frames)
            for sid, at in index:
                store.by_session.setdefault(sid, []).append(at)
            store.summaries.update(
                (sid, info) for sid, info in infos.items() if info.records
            )  # a session only guarded, never written, does not come to exist
            return results

    def _check_open(self) -> None:
        if self._closed:
            raise LogError("the in-memory log handle is closed")

    # -- reading (any thread) -------------------------------------------------------------

    def _decode(self, seq: int) -> Committed:
        frame = self._store.frames.get(seq)
        if frame is None:
            raise CorruptRecord(seq, "indexed but missing from the records")
        return Committed(seq, decode(seq, frame))

    def read_session(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> list[Committed]:
        """The session's records with seq > ``after``, in order (at most ``limit``)."""
        with self._store.lock:
            self._check_open()
            seqs = [s for s in self._store.by_session.get(session_id, ()) if s > after]
            return [self._decode(s) for s in seqs[:limit]]

    def read_system(self, after: int = 0) -> list[Committed]:
        """The system records (``LogOpened``) with seq > ``after``."""
        return self.read_session("", after)

    def read_global(self, after: int = 0, limit: int | None = None) -> list[Committed]:
        """All records with seq > ``after`` in order, system records included."""
        with self._store.lock:
            self._check_open()
            seqs = sorted(s for s in self._store.frames if s > after)  # gaps: deleted
            return [self._decode(s) for s in seqs[:limit]]

    def last_seq(self) -> int:
        with self._store.lock:
            return self._store.last_seq

    def scan_frames(self) -> Iterator[tuple[int, bytes]]:
        """Every stored frame in order, undecoded (for ``perdure check``)."""
        with self._store.lock:
            frames = sorted(self._store.frames.items())
        yield from frames

    def active_sessions(self) -> list[str]:
        with self._store.lock:
            return sorted(s for s, i in self._store.summaries.items() if i.open_submissions > 0)

    def claim(self) -> list[str]:
        """Every active session, in recovery order (``recovery_order``)."""
        with self._store.lock:
            return recovery_order(i for i in self._store.summaries.values() if i.open_submissions)

    def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        with self._store.lock:
            # Sorted by the ids' UTF-8 bytes, as LMDB keys sort.
            ids = sorted(self._store.summaries, key=str.encode)
            infos = [self._store.summaries[s] for s in ids if s.encode() > after.encode()]
        if active:
            infos = [i for i in infos if i.open_submissions]
        return infos if limit is None else infos[: max(0, limit)]

    def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[SessionInfo]:
        with self._store.lock:
            every = self._store.summaries.values()
            infos = [
                i
                for i in every
                if (not before or i.first_seq < before) and (i.open_submissions or not active)
            ]
        infos.sort(key=lambda i: i.first_seq, reverse=True)
        return infos if limit is None else infos[: max(0, limit)]

    def session_info(self, session_id: str) -> SessionInfo | None:
        with self._store.lock:
            return self._store.summaries.get(session_id)
