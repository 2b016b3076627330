"""Counts the reliability tests report about themselves (for docs/RELIABILITY.md).

``record_stat(kind, **counts)`` appends one JSON line to the file named by
``PERDURE_RELIABILITY_STATS`` and does nothing when it is unset, so ordinary test
runs are unaffected. ``python -m tests.reliability.report`` sets it, runs the
suites and adds the lines up.
"""

from __future__ import annotations

import json
import os


def record_stat(kind: str, **counts: int) -> None:
    path = os.environ.get("PERDURE_RELIABILITY_STATS")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"kind": kind, **counts}) + "\n")
