"""An asyncio host that embeds perdure is SIGKILLed mid-tool; the next one finishes the run.

The host is a real child process (``tests.embed.asyncio_host``) that dies by SIGKILL
at a fault point (``PERDURE_FAULT``): after the slow tool returned, before its
result is committed. A new host on the same log recovers the session (the SAFE
tool runs again), the re-sent input is deduplicated, and the log passes the checker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.checker import check, read_log
from tests.support.daemon import ROOT
from tests.support.ledger_tools import effects


def host(log: Path, workspace: Path, mode: str, fault: str | None) -> tuple[int, list[Any]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    if fault is not None:
        env["PERDURE_FAULT"] = fault
    proc = subprocess.run(
        [sys.executable, "-m", "tests.embed.asyncio_host", str(log), str(workspace), mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode in (0, -signal.SIGKILL), proc.stdout + proc.stderr
    return proc.returncode, lines


@pytest.mark.parametrize("mode", ["thread", "guest"])
def test_sigkill_of_the_asyncio_host_mid_tool_then_restart_completes_the_run(
    mode: str, tmp_path: Path, workspace: Path
) -> None:
    log = tmp_path / "log"
    code, lines = host(log, workspace, mode, fault="tool.after:slow_lookup")
    assert code == -signal.SIGKILL
    assert lines == [{"started": True, "recovered": []}]  # it died before any outcome

    code, lines = host(log, workspace, mode, fault=None)
    assert code == 0
    started, outcome = lines
    assert started == {"started": True, "recovered": ["s1"]}
    assert outcome["status"] == "completed" and outcome["duplicate"] is True
    assert outcome["final_text"] == "All done: looked up, booked, and noted."
    assert outcome["ticks"] > 0  # the asyncio loop ran while the runtime worked

    records = [c.record for c in read_log(log)]
    kinds = [type(r).__name__ for r in records]
    assert kinds.count("InputAccepted") == 1
    slow_runs = [
        r for r in records if type(r).__name__ == "ToolExecuting" and r.tool_name == "slow_lookup"
    ]
    assert len(slow_runs) == 2  # SAFE: run again after the crash
    assert [e["tool"] for e in effects(workspace)].count("send_note") == 1  # NEVER: once
    report = check(log, workspace, settled=True)
    assert report.ok, report
