"""Shared fixtures: a fresh log directory and workspace per test; a PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
