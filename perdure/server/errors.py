"""How the daemon answers an error: one JSON shape, one table from exception to status.

Routes never catch: they raise (``ApiError`` for what the HTTP layer itself
refuses, or whatever the runtime raised), and the Starlette exception handlers
registered from ``HANDLERS`` answer ``{"error": {"code", "message"[, "field"]}}``.
Starlette picks the handler of the nearest class in the exception's MRO, so a
``NotOwner`` (a ``LogError``) gets its own answer before the ``LogError`` one.

Whose fault it is decides the status: the client's (4xx: a malformed payload, a
refused command), the session's actor (503 ``session_restarting``: retry with
the same request id), the log (503 ``log_unavailable``, 500 ``corrupt_record``)
or a bug (500 ``internal``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from perdure.errors import NotOwnerRefused, Refused, SessionRestarting
from perdure.storage import LogError, NotOwner
from perdure.storage.codec import CorruptRecord

REFUSED_STATUS: Final[Mapping[str, int]] = {
    "not_found": 404,
    "conflict": 409,
    "invalid_state": 409,
    "parked": 423,
    "not_owner": 409,
    "busy": 409,
}


class ApiError(Exception):
    """A request the HTTP layer refuses before the runtime sees it (bad payload, size)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    body.update(extra)
    return JSONResponse({"error": body}, status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.field)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return error_response(REFUSED_STATUS.get(exc.code, 409), exc.code, exc.message)


async def _not_owner(request: Request, exc: Exception) -> Response:
    """Another node leases the session: say which, so the caller can go there."""
    if isinstance(exc, NotOwnerRefused):
        return error_response(409, "not_owner", exc.message, owner=exc.owner)
    assert isinstance(exc, NotOwner)
    return error_response(409, "not_owner", str(exc), owner=exc.owner)


async def _restarting(request: Request, exc: Exception) -> Response:
    # The actor crashed, not the log: the log is fine and a retry with the same
    # request id is safe (it deduplicates).
    return error_response(503, "session_restarting", str(exc), headers={"Retry-After": "1"})


async def _corrupt(request: Request, exc: Exception) -> Response:
    return error_response(500, "corrupt_record", str(exc))


async def _log_error(request: Request, exc: Exception) -> Response:
    return error_response(503, "log_unavailable", str(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return error_response(exc.status_code, code, str(exc.detail), headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route answers on this path. Starlette's own ``Allow`` names only
    the first route that matched the path, and a path here has one route per method."""
    allowed: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.matches(request.scope)[0] != Match.NONE:
            allowed.update(route.methods or ())
    return sorted(allowed)


async def _internal(request: Request, exc: Exception) -> Response:
    return error_response(500, "internal", f"{type(exc).__name__}: {exc}")


Handler = Callable[[Request, Exception], Awaitable[Response]]

HANDLERS: Final[Mapping[Any, Handler]] = {
    ApiError: _api_error,
    NotOwnerRefused: _not_owner,
    Refused: _refused,
    SessionRestarting: _restarting,
    CorruptRecord: _corrupt,
    NotOwner: _not_owner,
    LogError: _log_error,
    HTTPException: _http_error,
    Exception: _internal,
}
