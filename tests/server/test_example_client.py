"""examples/daemon_client.py runs as a user would run it, and cleans up after itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import ROOT


def test_daemon_client_example_survives_a_sigkilled_daemon() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "daemon_client.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "3) SIGKILL the daemon while the tool runs" in out
    assert "recovered 1 session(s) with unfinished work: weather" in out
    assert "-- the runtime restarted (epoch 2) --" in out
    assert "the report was sent 1 time(s)" in out
    assert "Let me check the forecast first." in out
    assert "final answer (completed): Done: Paris will be sunny" in out
    assert "daemon stopped with exit code 0" in out
    [log] = re.findall(r"log (\S+perdure-daemon-client-\S+)/log", out)[:1]
    assert not Path(log).exists()  # the temporary directory is gone
