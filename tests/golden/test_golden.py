"""Every build reads the logs of every released record format and decides the same.

The fixtures under ``tests/golden/v<N>/`` are real LMDB logs left by killed
runtimes (``make_golden.py`` made them). Reading them checks the storage layout
and every record's decoding; recomputing their recovery plan checks that a new
build would continue an old log exactly as the build that wrote it would have.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.golden.plan import recovery_plan

HERE = Path(__file__).resolve().parent
FIXTURES = sorted(p for p in HERE.glob("v*/*") if (p / "data.mdb").exists())


def test_there_are_golden_logs() -> None:
    assert len(FIXTURES) >= 6


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_log_gives_the_same_recovery_plan(fixture: Path, tmp_path: Path) -> None:
    copy = tmp_path / "log"
    copy.mkdir()
    shutil.copy(fixture / "data.mdb", copy / "data.mdb")
    expected = json.loads((fixture / "expected_plan.json").read_text())
    assert recovery_plan(copy) == expected
