"""Small rules every backend applies: what a session id may be, who may write; and
the ownership hooks of a log with one owner.

Kept apart from ``backend`` (the interface) so that module stays declarations only.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Final

from perdure.storage.backend import ClusterView, Wake

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


class SingleOwner:
    """The ownership hooks of a log one process owns whole (LMDB, ``MemoryLog``): the
    owner's lock (or epoch) already fences every session, so each session is always
    this process's, there is nothing to renew, balance, hand over or listen to."""

    multi_node = False
    lease_ttl = float("inf")
    poll_interval = float("inf")

    @property
    def node_id(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    def active_sessions(self) -> list[str]:
        raise NotImplementedError

    def acquire(self, session_id: str) -> None:
        """Every session is this owner's already."""

    def release_session(self, session_id: str) -> None:
        """Nothing to give up: ownership covers every session."""

    def claim(self) -> list[str]:
        return self.active_sessions()

    def renew(self) -> list[str]:
        return []

    def survey(self) -> ClusterView:
        """One owner: there is nothing to balance."""
        return ClusterView()

    def hand_over(self, session_id: str, target: str) -> bool:
        """One owner: no other node to hand a session to."""
        return False

    def accept(self) -> list[str]:
        return []

    def confirm(self, session_id: str) -> bool:
        return True

    def is_fresh(self, session_id: str) -> bool:
        return True

    def listen(self, wake: Wake, stop: threading.Event) -> None:
        """Nobody else writes this log: there is nothing to listen to."""
