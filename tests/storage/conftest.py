"""Fixtures of the storage tests: a real LMDB log in a fresh temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perdure.storage.lmdb_log import LmdbLog


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LmdbLog]:
    """A fresh log (seq 1 is its ``LogOpened`` record), closed after the test."""
    opened = LmdbLog(tmp_path / "log")
    try:
        yield opened
    finally:
        opened.close()
