"""An asyncio host that embeds perdure is SIGKILLed mid-tool; the next one finishes the run.

The last test kills a host while one of its asyncio tools awaits on the host's loop:
the next host re-runs a KEYED call with the same key and reports a NEVER call unknown.

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
import time
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


def _asyncio_tool_host(tmp_path: Path, mode: str, tool_name: str, *, kill: bool) -> Any:
    """Run the host of asyncio tools; SIGKILL it once its tool waits on the asyncio loop."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    marker = tmp_path / "marker"
    marker.unlink(missing_ok=True)
    args = [str(tmp_path / "log"), str(tmp_path), mode, tool_name]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.embed.asyncio_tool_host", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while kill and not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if kill:
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    if kill:
        assert proc.returncode == -signal.SIGKILL, out + err
        return None
    assert proc.returncode == 0, out + err
    return json.loads(out.strip().splitlines()[-1])


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("mode", ["thread", "guest"])
def test_sigkill_while_an_asyncio_tool_awaits_on_the_host_loop_recovers_by_policy(
    mode: str, tmp_path: Path
) -> None:
    keyed, never = tmp_path / "keyed", tmp_path / "never"
    keyed.mkdir()
    never.mkdir()
    _asyncio_tool_host(keyed, mode, "keyed_note", kill=True)
    done = _asyncio_tool_host(keyed, mode, "keyed_note", kill=False)
    first, second = _ledger(keyed)
    assert first["key"] == second["key"] and (first["attempt"], second["attempt"]) == (1, 2)
    assert done["record"] == "ToolCompleted" and done["output"] == "noted x"
    assert done["runs_on"] == "asyncio" and done["status"] == "completed"

    _asyncio_tool_host(never, mode, "never_note", kill=True)
    done = _asyncio_tool_host(never, mode, "never_note", kill=False)
    assert len(_ledger(never)) == 1  # NEVER: not run a second time
    assert done["record"] == "ToolOutcomeUnknown" and done["status"] == "completed"
