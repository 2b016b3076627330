"""Small rules every backend applies: what a session id may be, who may write.

Kept apart from ``backend`` (the interface) so that module stays declarations only.
"""

from __future__ import annotations

import threading
from typing import Final

_MAX_SESSION_ID: Final = 128


def check_session_id(session_id: str) -> str:
    """Session ids are short, printable and NUL-free (they are part of index keys and URLs)."""
    ok = (
        0 < len(session_id) <= _MAX_SESSION_ID
        and session_id.isascii()
        and all(c.isalnum() or c in "._:-" for c in session_id)
    )
    if not ok:
        raise ValueError(
            f"invalid session id {session_id!r}: use 1-{_MAX_SESSION_ID} characters "
            "among letters, digits and . _ : -"
        )
    return session_id


def claim_writer(writers: tuple[threading.Thread, ...], seen: set[int], what: str) -> None:
    """Refuse a write transaction outside the writer thread; note the thread that wrote.

    A write transaction must begin, write and commit on one thread (LMDB demands it;
    the PostgreSQL backend keeps one connection for writes the same way).
    """
    current = threading.current_thread()
    if writers and current not in writers:
        raise RuntimeError(
            f"{what} write transaction attempted on thread {current.name!r}; "
            "only the journal's writer thread may write"
        )
    seen.add(current.ident or 0)
