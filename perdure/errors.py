"""The errors a caller of the runtime can meet, named by whose fault they are.

Three families, so that a caller (and the daemon, which maps them to HTTP) never has
to guess:

* ``Refused`` — the command cannot be carried out as asked; **nothing was recorded**.
  Its ``code`` says why (``not_found``, ``conflict``, ``invalid_state``, ``parked``,
  ``not_owner``, ``busy``). Retrying the same command will be refused again until
  something changes.
* ``SessionRestarting`` — the session's actor crashed while the command was pending;
  the supervisor restarts it from the log. Whether the command was recorded is not
  known to this caller: retry it with the same ``request_id`` (deduplication makes
  that safe).
* ``perdure.storage.LogError`` and its subclasses — the log itself (outage,
  full disk, lost ownership, damaged record). Defined with the storage layer, which
  knows nothing of sessions or commands.

This module is a leaf: it imports nothing of perdure.
"""

from __future__ import annotations

from typing import Literal, TypeVar

E = TypeVar("E", bound=BaseException)
RefusalCode = Literal["not_found", "conflict", "invalid_state", "parked", "not_owner", "busy"]


class PerdureError(Exception):
    """Base class of the errors the runtime raises to its callers (not the log's)."""


class Refused(PerdureError):
    """A command that cannot be carried out; nothing was recorded."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code: RefusalCode = code
        self.message = message


class UnknownSession(Refused):
    """There is no session of that id in the log."""

    def __init__(self, session_id: str) -> None:
        super().__init__("not_found", f"no session {session_id!r} in this log")
        self.session_id = session_id


class SessionParkedError(Refused):
    """The session is parked: its actor kept crashing, and it takes no more commands."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__("parked", f"session {session_id} is parked: {reason}")
        self.session_id = session_id
        self.reason = reason


class NotOwnerRefused(Refused):
    """Another node holds the session's lease (a multi-node log); ask that node."""

    def __init__(self, message: str, owner: str | None = None) -> None:
        super().__init__("not_owner", message)
        self.owner = owner


class SessionRestarting(PerdureError):
    """The session's actor crashed while this request was pending; it restarts from the log.

    The request may or may not have been recorded: retry it with the same request id.
    """

    def __init__(self, session_id: str, cause: str) -> None:
        super().__init__(
            f"session {session_id}: its actor crashed ({cause}) and restarts from the log; "
            "retry with the same request_id"
        )
        self.session_id = session_id
        self.cause = cause


def find_exception(exc: BaseException, kind: type[E]) -> E | None:
    """``exc`` itself or the first exception of type ``kind`` inside (nested) groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_exception(inner, kind)
            if found is not None:
                return found
    return None
