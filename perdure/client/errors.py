"""The daemon's JSON errors as Python exceptions, typed like the runtime's own.

Every error the daemon answers is ``{"error": {"code", "message"[, "field"]}}``.
``error_from`` turns one into an exception that is BOTH a ``DaemonError`` (with the
HTTP status, the code and the field) and, where the runtime has a type for the
same situation, that type: a ``NotFound`` is a ``perdure.Refused`` with code
``not_found``, a ``LogUnavailable`` is a ``perdure.LogUnavailable``, a ``Restarting``
is a ``perdure.SessionRestarting``. So code written against an embedded runtime
catches the same exceptions from a remote one.

``retryable`` says whether the same request (same request id) may simply be sent
again: the daemon could not take it *now* (log outage, a session actor restarting,
a crash) but nothing about the request is wrong.
"""

from __future__ import annotations

from typing import Any, Final

from perdure.errors import (
    NotOwnerRefused,
    PerdureError,
    RefusalCode,
    Refused,
    SessionParkedError,
    SessionRestarting,
)
from perdure.storage.errors import CorruptRecord as _CorruptRecord
from perdure.storage.errors import LogUnavailable as _LogUnavailable


class DaemonError(Exception):
    """An error answer of the daemon (or no usable answer at all)."""

    retryable: bool = False

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        # Exception.__init__, not super(): the runtime's types mixed in below have
        # constructors of their own that do not apply to an answer over HTTP.
        Exception.__init__(self, f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class BadRequest(DaemonError, ValueError):
    """400: malformed JSON or a missing or invalid field (``field`` names it)."""


class Unauthorized(DaemonError):
    """401: no token, or the wrong one."""


class Forbidden(DaemonError):
    """403: a scoped token used beyond what it opens (another session, or a write with
    a read token)."""


class TooLarge(DaemonError):
    """413: the body exceeds the daemon's limit."""


class _Refusal(DaemonError, Refused):
    """A refusal of the runtime (nothing was recorded), relayed by the daemon."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        DaemonError.__init__(self, status, code, message, field)
        self.code: RefusalCode = code  # type: ignore[assignment]


class NotFound(_Refusal):
    """404: no such session, tool call or route."""


class Conflict(_Refusal):
    """409 ``conflict``: the request id was used before with another body."""


class InvalidState(_Refusal):
    """409 ``invalid_state``: the session is not in a state that takes this command."""


class NotOwner(_Refusal, NotOwnerRefused):
    """409 ``not_owner``: another node holds the session's lease (a shared log)."""

    owner: str | None = None


class Busy(_Refusal):
    """409 ``busy``: the session cannot take the command now."""


class Parked(_Refusal, SessionParkedError):
    """423: the session is parked (its actor kept crashing); it takes no more commands."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        _Refusal.__init__(self, status, code, message, field)
        self.session_id = ""
        self.reason = message


class Restarting(DaemonError, SessionRestarting):
    """503 ``session_restarting``: the session's actor restarts; retry with the same id."""

    retryable = True

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        DaemonError.__init__(self, status, code, message, field)
        self.session_id = ""
        self.cause = message


class LogUnavailable(DaemonError, _LogUnavailable):
    """503 ``log_unavailable``: the daemon cannot write its log now (outage, full disk)."""

    retryable = True


class CorruptRecord(DaemonError, _CorruptRecord):
    """500 ``corrupt_record``: a damaged record in the daemon's log; retrying will not help."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        DaemonError.__init__(self, status, code, message, field)
        self.seq = -1
        self.reason = message


class ServerError(DaemonError):
    """Any other 5xx (a bug in the daemon, a proxy in between): retried with the same id."""

    retryable = True


class Unavailable(DaemonError, PerdureError):
    """The daemon could not be reached (or kept failing) until the client gave up."""

    retryable = True


class ProtocolError(DaemonError):
    """An answer that is not what the daemon's API promises (wrong shape, not JSON)."""


_BY_CODE: Final[dict[str, type[DaemonError]]] = {
    "not_found": NotFound,
    "conflict": Conflict,
    "invalid_state": InvalidState,
    "not_owner": NotOwner,
    "busy": Busy,
    "parked": Parked,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "too_large": TooLarge,
    "session_restarting": Restarting,
    "log_unavailable": LogUnavailable,
    "corrupt_record": CorruptRecord,
}


def error_from(status: int, body: Any) -> DaemonError:
    """The exception for an error answer: by the daemon's code, else by the HTTP status."""
    detail = body.get("error") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        detail = {}
    code = detail.get("code")
    message = detail.get("message")
    field = detail.get("field")
    code = code if isinstance(code, str) else f"http_{status}"
    message = message if isinstance(message, str) else f"HTTP status {status}"
    field = field if isinstance(field, str) else None
    kind = _BY_CODE.get(code)
    if kind is None:
        if status == 404:
            kind = NotFound
        elif status == 401:
            kind = Unauthorized
        elif 400 <= status < 500:
            kind = BadRequest
        else:
            kind = ServerError
    return kind(status, code, message, field)
