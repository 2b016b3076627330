"""Structured logs: one ``perdure.*`` logger hierarchy, JSON lines that carry the ids.

Every module logs under ``perdure`` (``perdure.session``, ``perdure.supervisor``,
``perdure.http``, ...). The actors bind the ids of what they work on (``bind``):
the session actor its session id, a model call its run and generation, a tool
attempt its run and call, in trio's context variables, which child tasks inherit.
``JsonFormatter`` writes them on every line that was logged inside that work,
alongside the level, the logger and the message; ``use_json_logs`` installs it on
the ``perdure`` logger (``perdure serve --log-format json``). The ids also reach a
text formatter as ``%(session_id)s`` etc. through ``ContextFilter``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["ContextFilter", "JsonFormatter", "bind", "bound", "use_json_logs"]

IDS = ("session_id", "run_id", "generation_id", "call_id")
_ids: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "perdure_log_ids", default=None
)


def bind(**ids: str) -> None:
    """Attach ids to every line logged from now on in this task (and tasks it starts)."""
    current = _ids.get()
    _ids.set({**current, **ids} if current else dict(ids))


def bound(**ids: str) -> _Bound:
    """``bind`` for the duration of a ``with`` block."""
    return _Bound(ids)


class _Bound:
    # A plain class, not ``@contextmanager``: the session enters one for every effect
    # it performs, and a generator-based manager costs several times as much.
    __slots__ = ("_ids", "_token")

    def __init__(self, ids: dict[str, str]) -> None:
        self._ids = ids
        self._token: contextvars.Token[dict[str, str] | None] | None = None

    def __enter__(self) -> None:
        self._token = _ids.set({**(_ids.get() or {}), **self._ids})

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _ids.reset(self._token)


def current_ids() -> dict[str, str]:
    return dict(_ids.get() or {})


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (an explicit ``extra=`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_ids.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, ids, and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = _ids.get() or {}
        for key in IDS:
            value = getattr(record, key, None) or ids.get(key)
            if value:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def use_json_logs(stream: TextIO | None = None, level: int = logging.INFO) -> logging.Handler:
    """Send the ``perdure`` loggers' lines to ``stream`` (stderr) as JSON, and only there."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger("perdure")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False  # not twice through the root logger's text handler
    return handler
