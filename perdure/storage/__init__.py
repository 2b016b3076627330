"""perdure's storage: the records, their codec, the log backends and the Journal.

This package's face: ``open_log`` picks a backend from a location, and the
interface (``LogBackend``, ``Guard``, ``SessionInfo``) and the errors are
re-exported here. The backends themselves (``lmdb_log``, ``pg_log``,
``memory_log``) import the interface and are imported lazily by ``open_log``, so
opening an LMDB log never imports psycopg, and nothing here imports a backend.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final

from perdure.storage.backend import (
    Batch,
    ClusterView,
    CommitResult,
    Durability,
    Guard,
    LogBackend,
    NodeLoad,
    SessionInfo,
    Wake,
)
from perdure.storage.common import check_session_id
from perdure.storage.errors import (
    CommitUnknown,
    LogBusy,
    LogError,
    LogFenced,
    LogFormatError,
    LogUnavailable,
    NotOwner,
    SessionBusy,
    SessionFenced,
    StaleGoal,
    StorageFull,
)

__all__ = [
    "MEMORY",
    "PG_SCHEMES",
    "Batch",
    "ClusterView",
    "CommitResult",
    "CommitUnknown",
    "Durability",
    "Guard",
    "LogBackend",
    "LogBusy",
    "LogError",
    "LogFenced",
    "LogFormatError",
    "LogUnavailable",
    "NodeLoad",
    "NotOwner",
    "SessionBusy",
    "SessionFenced",
    "SessionInfo",
    "StaleGoal",
    "StorageFull",
    "Wake",
    "check_session_id",
    "is_postgres",
    "open_log",
]

PG_SCHEMES: Final = ("postgresql://", "postgres://")
MEMORY: Final = ":memory:"


def is_postgres(location: object) -> bool:
    return isinstance(location, str) and location.startswith(PG_SCHEMES)


def open_log(
    location: str | os.PathLike[str] | LogBackend,
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
    """Open the log at ``location``: a directory (LMDB), a ``postgresql://`` URL, or
    ``":memory:"`` (a new, empty ``MemoryLog``).

    A backend object given as ``location`` is returned as it is (the caller opened
    it, e.g. a ``MemoryLog`` kept across a simulated restart). Blocking: call it
    from a worker thread in async code. ``readonly`` opens it for inspection beside
    a live owner (no ownership taken, nothing written). Options that belong to
    another backend are refused, so a typo in a deployment is not silently ignored.
    """
    if not isinstance(location, str | os.PathLike):
        if not isinstance(location, LogBackend):
            raise TypeError(
                f"a log is a directory, a postgresql:// URL, {MEMORY!r} or a log backend, "
                f"not {type(location).__name__}"
            )
        return location
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
            f"{', '.join(given)}: options of a PostgreSQL log; {location} is not a PostgreSQL URL"
        )
    if location == MEMORY:
        if map_size is not None:
            raise ValueError("map_size applies to an LMDB log, not to an in-memory one")
        if readonly:
            raise ValueError("an in-memory log cannot be opened read-only: it starts empty")
        from perdure.storage.memory_log import MemoryLog

        return MemoryLog(durability=durability, clock=clock)
    from perdure.storage.lmdb_log import DEFAULT_MAP_SIZE, LmdbLog

    return LmdbLog(
        location,
        durability=durability,
        takeover=takeover,
        clock=clock,
        map_size=map_size if map_size is not None else DEFAULT_MAP_SIZE,
        readonly=readonly,
    )
