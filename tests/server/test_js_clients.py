"""The Node suite of tests/js: the real ``ai`` and ``@ag-ui/client`` packages, and the
TypeScript client generated from the daemon's OpenAPI document (openapi-typescript's
types, openapi-fetch), against a live ``perdure serve`` (which the Node tests start,
SIGKILL and restart themselves).

This runs ``npm ci`` (when tests/js/node_modules is missing or older than the
lockfile), ``tsc`` (the generated client's calls must type-check against the
document's types) and ``node --test``, and fails with the output if any of them
fails. The generated files in tests/js/generated must be those of the current
document: ``PERDURE_REGENERATE=1`` rewrites them. Skipped, saying so, only where
Node or npm is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from perdure.server.app import create_app
from perdure.server.openapi import openapi_document
from tests.support.daemon import ROOT

JS = ROOT / "tests" / "js"
GENERATED = JS / "generated"


def _installed() -> bool:
    marker = JS / "node_modules" / ".package-lock.json"
    lock = JS / "package-lock.json"
    return marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime


def _node_and_npm() -> tuple[str, str]:
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
    return node, npm


def test_the_typescript_client_is_generated_from_the_current_document(tmp_path: Path) -> None:
    node, _ = _node_and_npm()
    app = create_app(None, token="t", closing=trio.Event())  # type: ignore[arg-type]
    document = json.dumps(openapi_document(app.app.routes), indent=2) + "\n"  # type: ignore[attr-defined]
    if os.environ.get("PERDURE_REGENERATE"):
        (GENERATED / "openapi.json").write_text(document)
    assert (GENERATED / "openapi.json").read_text() == document, (
        "tests/js/generated/openapi.json is not the daemon's document: "
        "run PERDURE_REGENERATE=1 pytest tests/server/test_js_clients.py"
    )
    out = (
        GENERATED / "perdure-api.d.ts"
        if os.environ.get("PERDURE_REGENERATE")
        else tmp_path / "api.d.ts"
    )
    done = subprocess.run(
        [
            node,
            str(JS / "node_modules" / ".bin" / "openapi-typescript"),
            str(GENERATED / "openapi.json"),
            "-o",
            str(out),
            "--default-non-nullable=false",
        ],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"openapi-typescript failed:\n{done.stdout}\n{done.stderr}"
    assert out.read_text() == (GENERATED / "perdure-api.d.ts").read_text(), (
        "tests/js/generated/perdure-api.d.ts is stale: "
        "run PERDURE_REGENERATE=1 pytest tests/server/test_js_clients.py"
    )


def test_node_clients_drive_a_live_daemon(tmp_path: Path) -> None:
    node, _ = _node_and_npm()
    typed = subprocess.run(
        [node, str(JS / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert typed.returncode == 0, (
        f"the generated client's calls do not type-check:\n{typed.stdout}\n{typed.stderr}"
    )
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
