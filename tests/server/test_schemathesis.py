"""Property-based tests of the daemon from its own OpenAPI document (schemathesis).

A real ``perdure serve`` (a subprocess, scripted model, the ledger tools) is tested
by the schemathesis command line with the document it serves at ``/openapi.json``:
its examples, coverage and fuzzing phases at every operation, then its stateful
phase, which follows the document's links (create a session, then submit, approve,
read its events, fork, delete …). Every check runs (none is named, so all are): no
5xx, every status, content type, header and body as documented, schema-violating
input refused, schema-valid input accepted (except where a frontend protocol has
rules its schema cannot state: ``schemathesis.toml``). Afterwards the daemon stops
and ``perdure check`` must find the log it wrote sound.

Bounded to run in well under a minute: five examples per operation and phase, 80
stateful scenarios of up to 8 steps (``schemathesis.toml``), a fixed seed (set
``PERDURE_SCHEMATHESIS_SEED`` to explore others), no shrinking.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import SessionCreated, SessionDeleted
from tests.server.conftest import APPROVAL_SCRIPT
from tests.support.daemon import ROOT, Daemon

HERE = Path(__file__).parent
SEED = os.environ.get("PERDURE_SCHEMATHESIS_SEED", "20261206")


@pytest.fixture
def daemon(tmp_path: Path) -> Daemon:
    return Daemon(tmp_path, APPROVAL_SCRIPT)


def test_the_daemon_keeps_its_documented_contract_under_schemathesis(
    daemon: Daemon, tmp_path: Path
) -> None:
    daemon.start()
    try:
        with daemon.client() as client:
            document = client.get("/openapi.json")
        assert document.status_code == 200
        schema_file = tmp_path / "openapi.json"
        schema_file.write_text(json.dumps(document.json()))
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks",
        }
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "run",
                str(schema_file),
                "--url",
                daemon.url,
                "--header",
                f"Authorization: Bearer {daemon.token}",
                "--seed",
                SEED,
                "--no-shrink",
                "--workers",
                "1",
                "--request-timeout",
                "20",
            ],
            cwd=tmp_path,  # where schemathesis keeps its cache, not the repository
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        report = done.stdout + done.stderr
        assert done.returncode == 0, report
        counted = re.search(r"(\d+) generated, (\d+) passed", report)
        assert counted is not None and "Failures:" not in report, report
        assert counted.group(1) == counted.group(2) and int(counted.group(1)) > 500, report
        # The run reached every operation, and its stateful phase ran.
        assert re.search(r"Selected: (\d+)/\1\s+Tested: \1\b", report), report
        assert "✅ Stateful" in report, report
        scenarios = re.search(r"Scenarios:\s+(\d+)", report)
        assert scenarios is not None and int(scenarios.group(1)) >= 10, report
        with daemon.client() as client:
            assert client.get("/healthz").status_code == 200
    finally:
        stopped = daemon.stop() if daemon.proc is not None else 0
    assert stopped == 0
    # Read from the log, not the session list: the stateful phase may delete every
    # session it made (its links reach DELETE from the list's ids), and a deletion
    # removes the session's records but leaves its SessionDeleted.
    log = LmdbLog(Path(daemon.log), readonly=True)
    try:
        made = [
            c for c in log.read_global() if isinstance(c.record, SessionCreated | SessionDeleted)
        ]
    finally:
        log.close()
    assert made, "the run created no session: it never got past validation"
    check = subprocess.run(
        [sys.executable, "-m", "perdure.cli", "check", "--log", str(daemon.log)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr
