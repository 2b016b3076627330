"""``import perdure`` loads neither OpenTelemetry nor prometheus_client; without them it runs.

Each check runs in a fresh interpreter, since this test process has both loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.procs import ROOT

PROBE = """
import json, sys
import perdure
print(json.dumps(sorted(
    m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client")
)))
"""

# The extras are "absent": any import of them fails, as in an install without them.
WITHOUT_EXTRAS = """
import importlib.abc, json, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())

import trio
import perdure
from perdure.providers.scripted import Reply, ScriptedProvider

async def main():
    provider = ScriptedProvider([Reply(text="hi")])
    async with perdure.open_runtime(sys.argv[1], provider=provider) as rt:
        sid = await rt.create_session("s1")
        await rt.submit(sid, "go")
        outcome = await rt.wait_idle(sid)
    print(json.dumps({"status": outcome.status, "loaded": sorted(
        m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client")
    )}))

trio.run(main)
"""


def python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_import_perdure_loads_no_telemetry_library() -> None:
    assert json.loads(python(PROBE)) == []


def test_without_the_extras_a_run_completes_untraced(tmp_path: Path) -> None:
    result = json.loads(python(WITHOUT_EXTRAS, str(tmp_path / "log")))
    assert result == {"status": "completed", "loaded": []}
