"""Shared fixtures: a fresh log directory and workspace per test; a PostgreSQL server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pg import PgCluster, PgUnavailable, database_of


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL server for the whole run (skips if none can start)."""
    try:
        cluster = PgCluster().start()
    except PgUnavailable as exc:
        pytest.skip(f"PostgreSQL cannot be started here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A fresh, empty database on the session's PostgreSQL server."""
    url = pg_cluster.new_database()
    yield url
    pg_cluster.drop_database(database_of(url))


@pytest.fixture
def make_plan(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """Build a child-runtime plan (tests.support.child) on a fresh log and workspace."""
    ws = tmp_path / "ws"
    ws.mkdir()

    def build(
        script: list[dict[str, Any]], inputs: list[str] | None = None, **extra: Any
    ) -> dict[str, Any]:
        texts = inputs if inputs is not None else ["go"]
        plan: dict[str, Any] = {
            "log": str(tmp_path / "log"),
            "workspace": str(ws),
            "script": script,
            "sessions": {"s1": [{"text": t, "request_id": f"r{i}"} for i, t in enumerate(texts)]},
        }
        plan.update(extra)
        return plan

    return build


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Build real ``perdure serve`` processes (tests.support.daemon); closed at the end."""
    from tests.support.daemon import Daemon

    made: list[Daemon] = []

    def make(script: list[dict[str, Any]], name: str = "d", **kwargs: Any) -> Daemon:
        daemon = Daemon(tmp_path / name, script, **kwargs)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.close()


# The deterministic runtime fixtures: a MemoryLog on a MockClock, or LMDB in real time.
from tests.support.deterministic import clock, log_kind, where  # noqa: E402, F401
from tests.support.disk import small_disk  # noqa: E402, F401 - a fixture for every suite
