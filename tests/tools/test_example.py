"""``examples/parallel_tools.py`` runs, kills its agent mid-turn, recovers and checks itself."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.tools._harness import ROOT


def test_parallel_tools_example_runs_and_passes_its_own_checks() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "parallel_tools.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the booking was re-run with the same key and made once" in done.stdout
    assert "toolu_001_3: executing -> report outcome unknown" in done.stdout
