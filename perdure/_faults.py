"""Test-only fault injection: make this process die with SIGKILL at a named point.

Set ``PERDURE_FAULT`` to a comma-separated list of ``point[:tool_name][@n]``:

``commit``       after the n-th ``Journal.append`` of this process is durable
                 (before its caller is woken or anything is published)
``tool.before``  the tool's ``executing`` record is durable; the tool is not yet called
``workspace.before``  a workspace call's before-snapshot is durable; the tool is not yet
                 called
``workspace.after``  a workspace call's tool returned and its after-snapshot is durable;
                 its result is not yet committed
``workspace.restore``  a rewind is durable (``WorkspaceRestoreStarted``); no file is
                 touched yet
``workspace.restored``  a rewind put the files back; that is not yet recorded
``tool.after``   the tool returned; its result is not yet committed
``model.after``  the model's reply was received; it is not yet committed
``model.early``  the model's reply was received while the commit that started its
                 call (the turn's tool results, ``GenerationStarted``) was still in
                 flight; with ``PERDURE_SLOW_COMMIT_MS`` that window is wide open
``summary.before``   a context compaction's start is durable; its summary call is not
                     yet made
``compaction.after`` a context compaction's summary is durable; the next turn's model
                     call is not yet made

``n`` counts the hits of that point (and tool name, if given) in this process,
starting at 1 (default 1). Examples: ``commit@7``, ``tool.after:append_note``,
``tool.before:book@2,commit@30``.

When the variable is unset, ``ACTIVE`` is False and every call site is a single
attribute test, so the switch costs nothing in production.

``PERDURE_SLOW_COMMIT_MS=n`` simulates a slow disk: every transaction of the
Journal's writer thread waits n milliseconds first.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

POINTS: Final = frozenset(
    {
        "commit",
        "tool.before",
        "tool.after",
        "model.after",
        "model.early",
        "workspace.before",
        "workspace.after",
        "workspace.restore",
        "workspace.restored",
        "summary.before",
        "compaction.after",
    }
)


def _parse(spec: str) -> dict[tuple[str, str | None], int]:
    plan: dict[tuple[str, str | None], int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        where, _, count = item.partition("@")
        point, _, tool = where.partition(":")
        if point not in POINTS:
            raise ValueError(f"PERDURE_FAULT: unknown point {point!r} (known: {sorted(POINTS)})")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(
                f"PERDURE_FAULT: {item!r}: the count after @ must be an integer"
            ) from None
        if n < 1:
            raise ValueError(f"PERDURE_FAULT: {item!r}: the count must be at least 1")
        plan[(point, tool or None)] = n
    return plan


_PLAN: Final = _parse(os.environ.get("PERDURE_FAULT", ""))

# A slow disk: ``PERDURE_SLOW_COMMIT_MS=n`` makes the Journal's writer thread wait n
# milliseconds before every transaction (the trio loop must not notice).
SLOW_COMMIT: float = float(os.environ.get("PERDURE_SLOW_COMMIT_MS", "0") or 0) / 1000
_HITS: dict[tuple[str, str | None], int] = {}
ACTIVE: Final = bool(_PLAN)


def hit(point: str, tool: str | None = None, count: int = 1) -> None:
    """Count ``count`` hits of ``point``; die if a planned fault is reached."""
    for key in ((point, None), (point, tool)) if tool else ((point, None),):
        target = _PLAN.get(key)
        if target is None:
            continue
        before = _HITS.get(key, 0)
        _HITS[key] = before + count
        if before < target <= before + count:
            sys.stderr.write(
                f"perdure: PERDURE_FAULT {point}{':' + tool if tool else ''}@{target}\n"
            )
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
