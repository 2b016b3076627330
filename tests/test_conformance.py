"""``perdure conformance`` finds a tool that lies about its replay policy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perdure.conformance import example_args

ROOT = Path(__file__).resolve().parents[1]


def test_example_args_satisfy_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "count": {"type": "integer"},
            "mode": {"enum": ["a", "b"], "type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "maybe": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        },
        "required": ["name", "count", "mode", "tags", "maybe"],
    }
    assert example_args(schema) == {
        "name": "conformance",
        "count": 1,
        "mode": "a",
        "tags": [],
        "maybe": 1.0,
    }


def test_conformance_flags_the_lying_tool_and_passes_the_honest_ones() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perdure.cli",
            "conformance",
            "--tools",
            "tests.support.conformance_tools:HONEST",
            "--tools",
            "tests.support.conformance_tools:LYING",
            "--tools",
            "perdure.tools.workspace:TOOLS",
            "--only",
            "write_status",
            "--only",
            "append_line_claims_safe",
            "--only",
            "append_file",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "FLAGGED: append_line_claims_safe" in out
    lying = out.split("append_line_claims_safe (safe)")[1].split("\n\n")[0]
    flagged_lines = [line for line in lying.splitlines() if "DOUBLE" in line]
    assert len(flagged_lines) == 1
    assert flagged_lines[0].strip().startswith("tool.after:append_line_claims_safe")
    for honest in ("write_status (safe)", "append_file (never + reconcile)"):
        section = out.split(honest)[1].split("\n", 8)[1:8]
        assert all("ok:" in line for line in section), section
