"""The Node suite of tests/js: the real ``ai`` and ``@ag-ui/client`` packages, and the
TypeScript client generated from the daemon's OpenAPI document (openapi-typescript's
types, openapi-fetch), against a live ``perdure serve`` (which the Node tests start,
SIGKILL and restart themselves).

This runs ``npm ci`` (when tests/js/node_modules is missing or older than the
lockfile), writes the current document and the types openapi-typescript makes of it
into tests/js/generated (not kept in git), ``tsc`` (the generated client's calls
must type-check against those types: a route or field the document lost fails
here) and ``node --test``, and fails with the output if any of them fails.
Skipped, saying so, only where Node or npm is not installed.
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
# What `npm run generate` runs (tests/js/package.json), from tests/js.
GENERATE_ARGS = (
    "generated/openapi.json",
    "-o",
    "generated/perdure-api.d.ts",
    "--default-non-nullable=false",
)


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


def _generate_client(node: str) -> str:
    """Write the daemon's document and the TypeScript types openapi-typescript makes of
    it into tests/js/generated (not kept in git: always those of the current code)."""
    app = create_app(None, token="t", closing=trio.Event())  # type: ignore[arg-type]
    routes = app.app.routes  # type: ignore[attr-defined]
    GENERATED.mkdir(exist_ok=True)
    (GENERATED / "openapi.json").write_text(json.dumps(openapi_document(routes), indent=2))
    done = subprocess.run(
        [node, str(JS / "node_modules" / ".bin" / "openapi-typescript"), *GENERATE_ARGS],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"openapi-typescript failed:\n{done.stdout}\n{done.stderr}"
    return (GENERATED / "perdure-api.d.ts").read_text()


def test_the_typescript_types_cover_every_operation_of_the_document() -> None:
    node, _ = _node_and_npm()
    types = _generate_client(node)
    document = json.loads((GENERATED / "openapi.json").read_text())
    for path, operations in document["paths"].items():
        assert f'"{path}": {{' in types, f"{path} has no type"
        for method in operations:
            assert f"{method}: operations[" in types or f"{method}: {{" in types, (path, method)
    for name in document["components"]["schemas"]:
        assert re.search(rf"\b{re.escape(name)}: {{", types), f"schema {name} has no type"


def test_node_clients_drive_a_live_daemon(tmp_path: Path) -> None:
    node, _ = _node_and_npm()
    _generate_client(node)
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
