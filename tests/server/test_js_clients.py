"""The Node suite of tests/js: the real ``ai`` and ``@ag-ui/client`` packages against a
live ``perdure serve`` (which the Node tests start, SIGKILL and restart themselves).

This runs ``npm ci`` (when tests/js/node_modules is missing or older than the
lockfile) and ``node --test``, and fails with the Node output if any Node test
fails. Skipped, saying so, only where Node or npm is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import ROOT

JS = ROOT / "tests" / "js"


def _installed() -> bool:
    marker = JS / "node_modules" / ".package-lock.json"
    lock = JS / "package-lock.json"
    return marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime


def test_node_clients_drive_a_live_daemon(tmp_path: Path) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js (node and npm) is not installed: the tests/js suite cannot run")
    if not _installed():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    env = dict(os.environ)
    env.update(PERDURE_PYTHON=sys.executable, PERDURE_ROOT=str(ROOT), PERDURE_TMP=str(tmp_path))
    tests = sorted(str(p.relative_to(JS)) for p in JS.glob("*.test.mjs"))
    assert tests, "no Node tests found in tests/js"
    done = subprocess.run(
        [node, "--test", *tests],
        cwd=JS,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"node --test failed:\n{done.stdout}\n{done.stderr}"
    passed = re.search(r"^# pass (\d+)$", done.stdout, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) >= len(tests), done.stdout
    assert "# fail 0" in done.stdout, done.stdout
