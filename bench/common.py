"""Small helpers shared by every benchmark child process (plain Python, no perdure import).

Every child prints exactly one JSON object on its last stdout line; ``emit`` adds the
process's peak RSS to it. ``start_serve`` starts the real ``perdure serve`` that the
daemon's benchmarks (SSE fan-out, time to first token) measure.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# What ``perdure serve`` (and the benchmarks' own servers) print once they accept connections.
LISTENING = re.compile(r"listening on (http://\S+)")


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    """Current resident set size, from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def rss_split_kib() -> dict[str, int]:
    """Resident memory by kind, from /proc (Linux): ``anon`` (the heap, stacks) and
    ``file`` (file pages mapped into the process: for perdure, mostly the LMDB map)."""
    out = {"anon": 0, "file": 0}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value = line.split(":", 1)
                out[key[3:].lower()] = int(value.split()[0])
    return out


def emit(result: dict[str, Any]) -> None:
    result.setdefault("peak_rss_mib", round(peak_rss_mib(), 1))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """Progress for humans, on stderr (the orchestrator passes it through)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a server a benchmark starts: perdure imported from this tree,
    no fault point armed (a test run's ``PERDURE_FAULT`` must not crash it), and ``extra``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    env.update(extra)
    return env


def wait_listening(proc: subprocess.Popen[str], what: str, seconds: float = 60) -> str:
    """The URL ``proc`` says it listens on, read from its stdout; kills it and exits
    naming ``what`` if it ends or stays silent for ``seconds``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + seconds
    for line in proc.stdout:
        found = LISTENING.search(line)
        if found:
            return found.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"{what} did not start")


def start_serve(
    workdir: Path,
    provider: Sequence[str],
    env: Mapping[str, str],
    entry: Sequence[str] = ("-m", "perdure.cli"),
) -> tuple[subprocess.Popen[str], str, str]:
    """A real ``perdure serve`` on a free port with its log in ``workdir``, the benchmark's
    ``lookup`` tool and a bearer token; ``provider`` are its model arguments
    (``--provider ...``) and ``entry`` what Python runs (the CLI, or a probe that wraps it).
    Returns the process, the URL it listens on and the token."""
    token = "bench-token"
    (workdir / "token").write_text(token)
    proc = subprocess.Popen(
        [
            sys.executable,
            *entry,
            "serve",
            "--log",
            str(workdir / "log"),
            "--port",
            "0",
            *provider,
            "--tools",
            "bench.agent:lookup",
            "--token-file",
            str(workdir / "token"),
        ],
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return proc, wait_listening(proc, "perdure serve"), token
