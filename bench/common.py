"""Small helpers shared by every benchmark child process (plain Python, no perdure import).

Every child prints exactly one JSON object on its last stdout line; ``emit`` adds the
process's peak RSS to it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any


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
