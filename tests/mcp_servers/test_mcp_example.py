"""``examples/mcp_tools.py`` runs as a user would run it: killed mid-booking, recovered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_mcp_example_books_exactly_once_after_a_kill() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PERDURE_FAULT"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mcp_tools.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(summary["workdir"], ignore_errors=True)
    assert summary == {**summary, "ok": True, "bookings": 1, "cancelled": ["BK-0"]}
    out = proc.stdout
    assert "(exit status -9)" in out
    assert "recovery: toolu_002_1: re-run with the same idempotency key (policy keyed)" in out
    assert "  -> already booked: BK-1" in out  # the server deduplicated by the _meta key
    assert "toolu_003_1 needs approval: approving" in out
    assert "run completed: Room 12 in Lisbon is booked for Ada" in out
