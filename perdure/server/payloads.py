"""The daemon's JSON, both ways: request bodies in, answers out, through one converter.

Every request body is an attrs class structured by ``converter`` (strict: a string
field takes only a string, a flag only ``true``/``false``; unknown keys are
ignored, ``null`` counts as absent); a bad body raises an ``ApiError`` naming the
field. Every answer is an attrs class unstructured by the same converter, so a
route says *what* it answers and this module says *how* it looks on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar, Final, Literal, TypeVar

import cattrs
from attrs import Attribute, field, frozen
from cattrs.errors import ClassValidationError
from starlette.requests import Request

from perdure.answers import IF_BUSY, check_if_busy
from perdure.providers.base import Message as ModelMessage
from perdure.providers.base import (
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.server.errors import ApiError
from perdure.server.tokens import MAX_TTL, SCOPES
from perdure.storage import SessionInfo, check_session_id
from perdure.storage.common import _MAX_SESSION_ID as MAX_SESSION_ID
from perdure.storage.records import ResolutionAction
from perdure.stuck import StuckRun

MAX_BODY: Final = 1 << 20
DRAIN_FACTOR: Final = 16
MAX_REQUEST_ID: Final = 200
ACTIONS: Final[dict[str, ResolutionAction]] = {"retry": "retry", "skip": "skip", "fail": "fail"}

T = TypeVar("T")


class FieldError(ValueError):
    """A field that is present but not acceptable (raised by the validators below)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


# -- validators ----------------------------------------------------------------------------


def _nonempty(instance: object, attribute: Attribute[str], value: str) -> None:
    if not value.strip():
        raise FieldError(attribute.name, f"the field {attribute.name!r} must be a non-empty string")


def _request_id(instance: object, attribute: Attribute[str], value: str) -> None:
    _nonempty(instance, attribute, value)
    if len(value) > MAX_REQUEST_ID:
        raise FieldError(
            attribute.name,
            f"the field {attribute.name!r} must be at most {MAX_REQUEST_ID} characters",
        )


def _session_id(instance: object, attribute: Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    try:
        check_session_id(value)
    except ValueError as exc:
        why = f"the field {attribute.name!r} is invalid: {exc}"
        raise FieldError(attribute.name, why) from None


def _if_busy(instance: object, attribute: Attribute[str | None], value: str | None) -> None:
    try:
        check_if_busy(value)
    except ValueError as exc:
        raise FieldError(attribute.name, str(exc)) from None


def _scope(instance: object, attribute: Attribute[str], value: str) -> None:
    if value not in SCOPES:
        raise FieldError(attribute.name, "the field 'scope' must be read or write")


def _ttl(instance: object, attribute: Attribute[int], value: int) -> None:
    if not 1 <= value <= MAX_TTL:
        raise FieldError(
            attribute.name,
            f"the field 'ttl_s' must be a whole number of seconds from 1 to {MAX_TTL}",
        )


def _action(instance: object, attribute: Attribute[str], value: str) -> None:
    if value not in ACTIONS:
        raise FieldError(attribute.name, "the field 'action' must be retry, skip or fail")


# What each validator accepts, as JSON Schema (``perdure.server.openapi`` reads it).
_TEXT: Final = {"schema": {"minLength": 1, "pattern": r"\S"}}
_REQUEST_ID: Final = {"schema": {"minLength": 1, "maxLength": MAX_REQUEST_ID, "pattern": r"\S"}}
_SESSION_ID: Final = {
    "schema": {"pattern": f"^[A-Za-z0-9._:-]{{1,{MAX_SESSION_ID}}}$"},
}
_IF_BUSY: Final = {"schema": {"enum": [*IF_BUSY, None]}}


# -- request bodies ------------------------------------------------------------------------


@frozen(kw_only=True)
class CreateSessionBody:
    session_id: str | None = field(default=None, validator=_session_id, metadata=_SESSION_ID)
    system: str | None = None
    if_busy: str | None = field(default=None, validator=_if_busy, metadata=_IF_BUSY)
    # The session's grant: only these of the daemon's tools (absent: all of them).
    tools: list[str] | None = None


@frozen(kw_only=True)
class CommandBody:
    """A command with nothing but its request id (cancel, pause, resume, compensate)."""

    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)


@frozen(kw_only=True)
class MessageBody:
    text: str = field(validator=_nonempty, metadata=_TEXT)
    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)


@frozen(kw_only=True)
class SubmitBody:
    """A new input; ``if_busy`` says what happens while a run is busy (queue by default)."""

    text: str = field(validator=_nonempty, metadata=_TEXT)
    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)
    if_busy: str | None = field(default=None, validator=_if_busy, metadata=_IF_BUSY)


@frozen(kw_only=True)
class ForkBody:
    """A fork's request id and optional new id (``at`` is read apart: a run id or a seq)."""

    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)
    session_id: str | None = field(default=None, validator=_session_id, metadata=_SESSION_ID)
    # Restore the workspace's files as they were at that point, too.
    files: bool = False


@frozen(kw_only=True)
class RewindBody:
    """A rewind's request id (``to`` is read apart: a call id or a seq)."""

    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)


@frozen(kw_only=True)
class ApprovalBody:
    approved: bool
    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)
    note: str = ""


@frozen(kw_only=True)
class ResolutionBody:
    action: str = field(validator=_action, metadata={"schema": {"enum": list(ACTIONS)}})
    request_id: str = field(validator=_request_id, metadata=_REQUEST_ID)
    result: Any = None

    # What __attrs_post_init__ checks, for the API's document.
    __json_schema__: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"action": {"const": "retry"}}, "required": ["action"]},
        "then": {"properties": {"result": {"type": "null"}}},
    }

    def __attrs_post_init__(self) -> None:
        if self.action == "retry" and self.result is not None:
            raise FieldError("result", "the field 'result' goes with skip or fail, not with retry")

    @property
    def resolution(self) -> ResolutionAction:
        return ACTIONS[self.action]


@frozen(kw_only=True)
class TokenBody:
    """A scoped token's request: its scope and lifetime (an hour unless given)."""

    scope: str = field(validator=_scope, metadata={"schema": {"enum": list(SCOPES)}})
    ttl_s: int = field(
        default=3600, validator=_ttl, metadata={"schema": {"minimum": 1, "maximum": MAX_TTL}}
    )


# -- answers -------------------------------------------------------------------------------


@frozen
class SessionCreatedAnswer:
    session_id: str
    created: bool


@frozen
class MessageAccepted:
    submission_id: str
    seq: int
    duplicate: bool
    disposition: str


@frozen
class SessionDeletedAnswer:
    session_id: str
    deleted: bool
    records: int


@frozen
class ForkAnswer:
    session_id: str
    source: str
    position: int
    duplicate: bool


@frozen
class RewindAnswer:
    session_id: str
    tree: str
    position: int
    before: str
    duplicate: bool


@frozen(kw_only=True)
class Recorded:
    """The answer to a command: ``seq`` is None when nothing had to be recorded."""

    seq: int | None
    recorded: bool
    duplicate: bool


@frozen(kw_only=True)
class CancelAnswer(Recorded):
    run_id: str | None


@frozen(kw_only=True)
class ApprovalAnswer(Recorded):
    call_id: str
    approved: bool


@frozen(kw_only=True)
class RevisionAnswer(Recorded):
    goal_rev: int


@frozen(kw_only=True)
class PauseAnswer(Recorded):
    paused: bool


@frozen(kw_only=True)
class CompactionAnswer(Recorded):
    compaction_id: str  # the compaction started (or the one already in progress)


@frozen(kw_only=True)
class CompensationAnswer(Recorded):
    call_id: str
    compensation_id: str


@frozen(kw_only=True)
class ResolutionAnswer(Recorded):
    call_id: str
    action: str


@frozen
class TokenAnswer:
    """A scoped token (a JWT) for one session, and when it expires (epoch seconds)."""

    token: str
    expires_at: int
    session_id: str
    scope: str = field(metadata={"schema": {"enum": list(SCOPES)}})


@frozen
class WhoamiAnswer:
    """What the caller's credential opens: everything (admin) or one session."""

    scope: str = field(metadata={"schema": {"enum": ["admin", *SCOPES]}})
    session_id: str | None
    expires_at: int | None


@frozen
class StatsAnswer:
    appends: int
    transactions: int
    records: int
    largest_transaction: int
    resident_sessions: int
    evictions: int


# -- the converter -------------------------------------------------------------------------


def _strict(kind: type[T], what: str) -> Any:
    def structure(value: Any, _: type) -> T:
        # bool is an int in Python: a flag field must not take 1, a string not take 5.
        if type(value) is not kind:
            raise TypeError(what)
        return value

    return structure


converter: Final = cattrs.Converter(omit_if_default=False)
converter.register_structure_hook(str, _strict(str, "must be a string"))
converter.register_structure_hook(bool, _strict(bool, "must be true or false"))


def _whole(value: Any, _: type) -> int:
    # JSON has one number type: 60.0 is the whole number 60; true is not a number.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if type(value) is not int:
        raise TypeError("must be a whole number")
    return value


converter.register_structure_hook(int, _whole)


def _names(value: Any, _: type) -> list[str]:
    # cattrs would take any iterable for a list (an object's keys, a string's letters).
    if type(value) is not list or any(type(item) is not str for item in value):
        raise TypeError("must be a list of strings")
    return value


converter.register_structure_hook_func(lambda kind: kind == list[str], _names)


def parse(data: dict[str, Any], kind: type[T]) -> T:
    """Structure a request body into ``kind``, or raise the ``ApiError`` naming the field."""
    present = {k: v for k, v in data.items() if v is not None}
    try:
        return converter.structure(present, kind)
    except FieldError as exc:
        raise ApiError(400, "invalid_field", exc.message, exc.name) from None
    except ClassValidationError as group:
        noted, unnoted = group.group_exceptions()
        for inner, note in noted:
            name = note.name
            if isinstance(inner, KeyError):
                raise ApiError(
                    400, "missing_field", f"the field {name!r} is required", name
                ) from None
            raise ApiError(400, "invalid_field", f"the field {name!r} {inner}", name) from None
        for other in unnoted:
            # A validator (run by the class's __init__) refused a well-typed value.
            if isinstance(other, FieldError):
                raise ApiError(400, "invalid_field", other.message, other.name) from None
        raise ApiError(400, "invalid_json", str(group)) from None


def answer(value: Any) -> dict[str, Any]:
    """An answer class as its JSON object."""
    data: dict[str, Any] = converter.unstructure(value)
    return data


def session_list(
    infos: list[SessionInfo],
    stuck: Sequence[StuckRun] = (),
    *,
    next_after: str | Literal[False] | None = False,
) -> dict[str, Any]:
    """``GET /v1/sessions``: each session's summary as the log keeps it, plus ``active``
    and ``stuck`` (what a stuck session waits for, or null); for a page, ``next``: the
    ``after`` of the next page, or null after the last (``next_after``; False: no page)."""
    by_session = {run.session_id: run for run in stuck}
    paging = {} if next_after is False else {"next": next_after}
    return {
        **paging,
        "sessions": [
            {
                **answer(i),
                "active": i.open_submissions > 0,
                "stuck": _stuck(by_session.get(i.session_id)),
            }
            for i in infos
        ],
    }


def _stuck(run: StuckRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "waiting": run.waiting.kind,
        "detail": run.waiting.detail,
        "call_id": run.waiting.call_id,
        "run_id": run.run_id,
        "last_progress_at": run.last_progress_at,
        "idle_for": run.idle_for,
        "describe": run.waiting.describe(),
    }


# -- reading a request ---------------------------------------------------------------------


async def read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The body as a JSON object, or an ``ApiError`` (400 malformed, 413 too large).

    An oversized body is still read (and dropped) up to ``DRAIN_FACTOR`` times the
    limit, so the client, which is still sending, gets the 413 instead of a reset
    connection; beyond that the connection is closed after the answer.
    """
    too_large = ApiError(413, "too_large", f"the body exceeds the limit of {max_body} bytes")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "invalid_header", "Content-Length is not a number") from None
        if size > max_body * DRAIN_FACTOR:
            raise too_large
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_body * DRAIN_FACTOR:
            raise too_large
        if total <= max_body:
            chunks.append(chunk)
    if total > max_body:
        raise too_large
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "the body must be a JSON object")
    return data


async def read_body(request: Request, kind: type[T], max_body: int) -> T:
    """Read and structure a request body in one step."""
    return parse(await read_json(request, max_body), kind)


def path_session(request: Request) -> str:
    """The session id of the path; an id that cannot exist is simply not found."""
    sid: str = request.path_params["session_id"]
    try:
        return check_session_id(sid)
    except ValueError:
        raise ApiError(404, "not_found", f"no session {sid!r} in this log") from None


MAX_PAGE: Final = 10_000  # sessions in one page of ``GET /v1/sessions``


@frozen
class SessionPage:
    """What ``GET /v1/sessions`` asked for: a page of at most ``limit`` sessions, in
    session-id order after the id ``after`` (``newest`` False), or newest first by
    creation, created before the first seq ``before`` (``newest``; 0: from the newest);
    ``active``: only sessions with unfinished work."""

    after: str
    before: int
    limit: int
    active: bool
    newest: bool


def session_page(request: Request) -> SessionPage | None:
    """``GET /v1/sessions``'s page, or None for the whole list (none of ``limit``,
    ``after``, ``before``, ``active``, ``order`` given; a page is ``MAX_PAGE`` long
    unless ``limit`` says less). Each order reads its own cursor (``after`` or
    ``before``) and ignores the other's."""
    query = request.query_params
    raw_limit, after, raw_before = query.get("limit"), query.get("after"), query.get("before")
    raw_active, order = query.get("active"), query.get("order")
    if all(v is None for v in (raw_limit, after, raw_before, raw_active, order)):
        return None
    if raw_active not in (None, "0", "1", "true", "false"):
        raise ApiError(400, "invalid_field", "active must be 1, 0, true or false", "active")
    active = raw_active in ("1", "true")
    if order not in (None, "id", "newest"):
        raise ApiError(400, "invalid_field", "order must be id or newest", "order")
    before = 0
    if raw_before is not None:
        try:
            before = int(raw_before)
        except ValueError:
            raise ApiError(
                400, "invalid_field", "before must be a whole number (a page's next)", "before"
            ) from None
        if before < 0:
            raise ApiError(400, "invalid_field", "before must not be negative", "before")
    limit = MAX_PAGE
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            raise ApiError(400, "invalid_field", "limit must be a whole number", "limit") from None
        if not 1 <= limit <= MAX_PAGE:
            raise ApiError(400, "invalid_field", f"limit must be between 1 and {MAX_PAGE}", "limit")
    return SessionPage(after or "", before, limit, active, order == "newest")


def stream_start(request: Request) -> int:
    """Where a stream resumes: ``Last-Event-ID`` (a reconnect) wins over ``?after=``."""
    for name, raw in (
        ("Last-Event-ID", request.headers.get("last-event-id")),
        ("after", request.query_params.get("after")),
    ):
        if raw is None or raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(
                400, "invalid_field", f"{name} must be a sequence number", name
            ) from None
        if value < 0:
            raise ApiError(400, "invalid_field", f"{name} must not be negative", name)
        return value
    return 0


def message_json(message: ModelMessage) -> dict[str, Any]:
    """A transcript message as the API shows it: opaque signatures and ciphertext left out."""
    blocks: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextBlock):
            blocks.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUseBlock):
            blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        elif isinstance(b, ThinkingBlock):
            blocks.append({"type": "thinking", "thinking": b.thinking})  # signature: opaque
        elif isinstance(b, RedactedThinkingBlock):
            blocks.append({"type": "redacted_thinking"})  # encrypted: nothing to show
        elif isinstance(b, ToolResultBlock):
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": b.tool_use_id,
                    "content": b.content,
                    "is_error": b.is_error,
                }
            )
    return {"role": message.role, "content": blocks}
