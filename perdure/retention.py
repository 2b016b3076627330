"""Retention: delete finished sessions, prune old ones, export and import, compact.

A deletion is one ``SessionDeleted`` system record whose commit also removes the
session's records, in one transaction that the log refuses while the session has
unfinished work (``SessionBusy``): a prune interrupted anywhere leaves every session
whole or gone, and ``perdure check`` accounts for the sequence numbers they leave
unused. A sub-agent's session is kept while the parent call that waits for it is
unfinished. Forks copy their prefix, so no session depends on the one it was forked
from.

These functions work on a Journal alone, so the command line can prune, export and
import without starting any session (``Runtime.delete_session`` / ``Runtime.prune``
also stop a resident actor first). ``compact`` rewrites an LMDB log with LMDB's
compacting copy while no process owns it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from perdure.actors.decide import sessions
from perdure.errors import Refused
from perdure.storage import SessionBusy, SessionInfo
from perdure.storage.codec import converter
from perdure.storage.journal import Journal
from perdure.storage.records import Committed, Record, SessionCreated, SessionDeleted
from perdure.storage.redact import redacted

EXPORT_FORMAT = "perdure-session/1"


@attrs.frozen
class Pruned:
    session_id: str
    last_at: float  # when its last record was written
    records: int  # how many records went (or would go, in a dry run)


async def parent_history(journal: Journal, first: list[Committed]) -> list[Committed]:
    """The log of the session whose call started this sub-agent (``first``: the
    sub-agent's first record); empty for another session, or a parent with no records.
    The core reads it (``sessions.dependency``, ``sessions.orphaned``): no fold here."""
    link = sessions.parent_call(first)
    return await journal.read_session(link[0]) if link is not None else []


async def dependency(journal: Journal, session_id: str) -> str | None:
    """Why the session must be kept for another one, or None (``sessions.dependency``:
    a sub-agent's session is kept while the parent call that runs it is unfinished)."""
    first = await journal.read_session(session_id, 0, 1)
    return sessions.dependency(first, await parent_history(journal, first))


async def delete_session(journal: Journal, session_id: str, at: float, reason: str = "") -> int:
    """Remove a finished session from the log; return how many records went.

    ``Refused("busy")`` (nothing removed) if it has unfinished work or a parent call
    still waits for it; ``UnknownSession`` if there is no such session.
    """
    info = await journal.session_info(session_id)
    why = await dependency(journal, session_id) if info is not None else None
    marker = sessions.deletion(session_id, info, why, reason, at)
    await journal.acquire(session_id)  # PostgreSQL: the deletion needs its lease
    try:
        (committed,) = await journal.append([marker])
    except SessionBusy as exc:
        raise Refused("busy", str(exc)) from None
    await journal.release_session(session_id)
    record = committed.record
    assert isinstance(record, SessionDeleted)
    return record.records


async def prunable(journal: Journal, finished_before: float) -> list[Pruned]:
    """Sessions with no unfinished work whose last record is older than the date."""
    found: list[Pruned] = []
    for info in sorted(await journal.sessions(), key=lambda i: i.first_seq):
        if info.open_submissions:
            continue
        last = await _last_at(journal, info)
        if last is not None and last < finished_before:
            found.append(Pruned(info.session_id, last, info.records))
    return found


async def _last_at(journal: Journal, info: SessionInfo) -> float | None:
    tail = await journal.read_session(info.session_id, info.last_seq - 1, 1)
    return tail[0].record.at if tail else None


async def prune(
    journal: Journal, finished_before: float, at: float, *, dry_run: bool = False
) -> tuple[list[Pruned], list[tuple[str, str]]]:
    """Delete every prunable session, one transaction each; return (deleted, kept: why)."""
    deleted: list[Pruned] = []
    kept: list[tuple[str, str]] = []
    for candidate in await prunable(journal, finished_before):
        if dry_run:
            why = await dependency(journal, candidate.session_id)
            if why is None:
                deleted.append(candidate)
            else:
                kept.append((candidate.session_id, why))
            continue
        try:
            count = await delete_session(journal, candidate.session_id, at, "pruned")
        except Refused as exc:
            kept.append((candidate.session_id, exc.message))
            continue
        deleted.append(attrs.evolve(candidate, records=count))
    return deleted, kept


# -- export and import -------------------------------------------------------------------


def export_lines(session_id: str, committed: Iterable[Committed]) -> Iterator[str]:
    """A session as JSON lines: a header, then each record with the seq it had."""
    yield json.dumps({"format": EXPORT_FORMAT, "session_id": session_id})
    for c in committed:
        # Secret tool parameters are masked: an export leaves the log (it is not a
        # backup; a call re-imported from it is history, never run again).
        data = converter.unstructure(redacted(c.record), unstructure_as=Record)
        yield json.dumps({"seq": c.seq, "record": data}, ensure_ascii=False)


def parse_export(lines: Iterable[str]) -> tuple[str, list[Record]]:
    """The session id and records of an export, or a ValueError naming the bad line."""
    session_id = ""
    records: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item: Any = json.loads(line)
            if number == 1:
                if item.get("format") != EXPORT_FORMAT:
                    raise ValueError(f"not a {EXPORT_FORMAT} export")
                session_id = str(item["session_id"])
                continue
            record: Record = converter.structure(item["record"], Record)  # type: ignore[arg-type]
        except Exception as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if record.session_id != session_id:
            raise ValueError(
                f"line {number}: a record of {record.session_id!r}, not {session_id!r}"
            )
        records.append(record)
    if not session_id or not records or not isinstance(records[0], SessionCreated):
        raise ValueError("an export starts with its header and the session's SessionCreated")
    return session_id, records


async def import_session(journal: Journal, lines: Iterable[str]) -> tuple[str, int]:
    """Restore an exported session into this log, in one commit; return (id, records).

    Refused (``conflict``) if the log already has a session of that id.
    """
    session_id, records = parse_export(lines)
    if await journal.session_info(session_id) is not None:
        raise Refused("conflict", f"this log already has a session {session_id!r}")
    await journal.acquire(session_id)
    await journal.append(records)
    return session_id, len(records)


# -- compaction --------------------------------------------------------------------------


def compact(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Rewrite the LMDB log at ``path`` into a smaller file; return (bytes before, after).

    Takes the log's ownership for the duration (``LogBusy`` if a process owns it),
    writes LMDB's compacting copy beside it, and swaps the data file. Blocking.
    """
    from perdure.storage.lmdb_log import LmdbLog

    root = Path(path)
    data = root / "data.mdb"
    before = data.stat().st_size
    target = root / "compact.tmp"
    log = LmdbLog(root)  # the owner's lock: nobody writes meanwhile
    try:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        # A copy that fails (no space, no permission) leaves the log as it was.
        log.env.copy(str(target), compact=True)
        log.env.close()  # before the swap; the lock is held until log.close()
        os.replace(target / "data.mdb", data)
        (root / "lock.mdb").unlink(missing_ok=True)  # LMDB rebuilds its reader table
    finally:
        log.close()
        shutil.rmtree(target, ignore_errors=True)
    return before, data.stat().st_size
