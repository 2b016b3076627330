"""examples/fastapi_app.py runs as a user would run it: kill -9 of uvicorn mid-tool, restart."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.daemon import ROOT


def test_the_fastapi_example_survives_kill_9_of_uvicorn_mid_tool() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fastapi_app.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "3) kill -9 the uvicorn process while the tool runs" in out
    assert "-- the service restarted (epoch 2) --" in out
    # The restarted service resumed the run by itself and re-ran the SAFE tool.
    assert "recovery: found executing -> re-run with the same idempotency key" in out
    assert out.count("tool fetch_forecast is executing") == 2
    assert "awaits approval: approve it" in out
    assert "the report was sent 1 time(s)" in out
    assert "final answer (completed): Done: Paris will be sunny" in out
    assert "service stopped by SIGTERM" in out
