"""The daemon's OpenAPI 3.1 document, generated from its routes and payload types.

Each route's endpoint carries an ``Operation`` (attached with ``documented``): what
it reads and answers, named by the attrs classes that ``perdure.server.payloads``
structures and unstructures, plus the errors it can answer. ``openapi_document``
walks the Starlette routes themselves, so a route without an ``Operation`` is an
``UndocumentedRoute`` error rather than a silent gap, and it turns each attrs class
into a JSON Schema from its fields' types and the ``schema`` metadata that sits
beside their validators. Nothing here is written twice: the route table, the
types and the error codes are the ones the daemon runs with.

Served at ``/openapi.json`` (behind the same credentials as the API) and rendered
for people at ``/docs`` by Swagger UI, whose files ship in ``static/swagger-ui``.
"""

from __future__ import annotations

import importlib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, Union

import attrs
from attrs import frozen
from starlette.routing import Route

from perdure import __version__
from perdure.server.payloads import ForkBody, RewindBody
from perdure.storage import SessionInfo
from perdure.stuck import WAITING_KINDS

F = TypeVar("F", bound=Callable[..., Any])

JSON: Final = "application/json"
SSE: Final = "text/event-stream"

# Every code of the error envelope, with the status it goes with.
ERROR_CODES: Final[Mapping[str, str]] = {
    "invalid_json": "400: the body is not a JSON object",
    "missing_field": "400: a required field is absent (`field` names it)",
    "invalid_field": "400: a field, parameter or header is invalid (`field` names it)",
    "invalid_header": "400: a header is malformed",
    "unauthorized": "401: no token, a wrong one, or a scoped token forged, expired or of an "
    "older format",
    "forbidden": "403: a scoped token on a route it does not open",
    "not_found": "404: unknown session, tool call, reply, static file or route",
    "method_not_allowed": "405: the route does not take that method",
    "conflict": "409: a request id reused with another body, or a session id with another "
    "system prompt",
    "invalid_state": "409: the command does not fit the session's state now",
    "busy": "409: the session is busy (`if_busy: reject`, or deleting a session with work)",
    "not_owner": "409: another node leases the session (`owner` names it)",
    "too_large": "413: the body exceeds the limit (1 MiB by default)",
    "parked": "423: the session is parked (its actor kept crashing)",
    "corrupt_record": "500: a damaged record in the log (the message names its seq)",
    "internal": "500: a bug",
    "session_restarting": "503: the session's actor crashed with the command pending: retry "
    "with the same request id (`Retry-After`)",
    "log_unavailable": "503: the log cannot be written (disk full, outage, ownership lost)",
    "not_installed": "501: the route needs an optional package (the message names it)",
    "http_error": "another HTTP-level refusal",
}

_STATUS_TEXT: Final[Mapping[int, str]] = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    413: "Body too large",
    423: "Session parked",
    500: "Server error",
    501: "An optional package is not installed",
    503: "Unavailable",
}

# What every route behind the credentials can answer, whatever it does.
_ALWAYS: Final = (401, 500, 503)


@frozen
class Param:
    """A query or header parameter (``where``: ``query`` or ``header``)."""

    name: str
    where: str
    schema: Mapping[str, Any]
    description: str


@frozen
class Body:
    """A request or response body: an attrs class, or a schema for what is not one."""

    kind: type | None = None
    schema: Mapping[str, Any] | None = None
    media: str = JSON
    description: str = ""
    required: bool = True  # a request body that may be left out (all its fields optional)


@frozen(kw_only=True)
class Operation:
    """What one route reads and answers, as the document says it."""

    summary: str
    tag: str
    description: str = ""
    body: Body | None = None
    answers: Mapping[int, Body] = attrs.field(factory=dict)
    errors: tuple[int, ...] = ()
    params: tuple[Param, ...] = ()
    # Its 2xx answers carry a ``session_id`` that every session route can take (OpenAPI
    # links: what a client, or a stateful test, calls next).
    yields_session: bool = False
    # "none": no credentials; "admin": the admin token only; "session": the admin
    # token or a scoped token of that session; "query": as "session", and also
    # ``?token=`` (a browser's EventSource cannot set a header).
    access: str = "admin"


class UndocumentedRoute(Exception):
    """A route whose endpoint carries no ``Operation``: the document would miss it."""


def documented(op: Operation) -> Callable[[F], F]:
    """Attach ``op`` to a route's endpoint."""

    def attach(fn: F) -> F:
        fn.__openapi__ = op  # type: ignore[attr-defined]
        return fn

    return attach


def operation_of(endpoint: object) -> Operation | None:
    op = getattr(endpoint, "__openapi__", None)
    return op if isinstance(op, Operation) else None


def operations(routes: Iterable[object]) -> list[tuple[str, str, Operation]]:
    """``(method, path, operation)`` for every route; ``UndocumentedRoute`` for a gap."""
    found = []
    for route in routes:
        if not isinstance(route, Route):
            raise UndocumentedRoute(f"{route!r} is not a plain route: describe it by hand")
        op = operation_of(route.endpoint)
        if op is None:
            raise UndocumentedRoute(
                f"the route {route.path} ({route.name}) has no Operation: add @documented(...)"
            )
        for method in sorted(route.methods or ()):
            if method != "HEAD":  # Starlette adds HEAD to every GET by itself
                found.append((method, route.path, op))
    return found


# -- JSON Schema from attrs classes ----------------------------------------------------


class Schemas:
    """The components/schemas of one document, filled as classes are referenced."""

    def __init__(self) -> None:
        self.named: dict[str, dict[str, Any]] = {}

    def ref(self, kind: type) -> dict[str, Any]:
        name = kind.__name__
        if name not in self.named:
            self.named[name] = {}  # reserved first: a class may refer to itself
            self.named[name] = self.of_class(kind)
        return {"$ref": f"#/components/schemas/{name}"}

    def pydantic(self, where: str) -> dict[str, Any]:
        """A pydantic model's own JSON Schema (by its aliases, as it validates input), its
        definitions moved into components; a plain object if its package is absent."""
        module, _, name = where.partition(":")
        try:
            model = getattr(importlib.import_module(module), name)
        except ImportError:
            return {"type": "object", "description": f"{name} (its package is not installed)"}
        schema = model.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}", mode="validation"
        )
        for def_name, definition in schema.pop("$defs", {}).items():
            self.named.setdefault(def_name, definition)
        self.named[name] = schema
        return {"$ref": f"#/components/schemas/{name}"}

    def of_class(self, kind: type) -> dict[str, Any]:
        hints = typing.get_type_hints(kind)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for f in attrs.fields(kind):
            schema = self.of_type(hints[f.name])
            schema.update(f.metadata.get("schema", {}))
            if f.default is attrs.NOTHING:
                required.append(f.name)
            else:
                # A body's null counts as absent (payloads.parse): the default applies.
                if isinstance(schema.get("type"), str):
                    schema["type"] = [schema["type"], "null"]
                if f.default is not None and _plain(f.default):
                    schema["default"] = f.default
            properties[f.name] = schema
        out: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            out["required"] = required
        # A rule across fields (what a class's __attrs_post_init__ checks), as the class
        # states it beside the check.
        out.update(getattr(kind, "__json_schema__", {}))
        if kind.__doc__ and not kind.__doc__.startswith(kind.__name__ + "("):
            out["description"] = " ".join(kind.__doc__.split())
        return out

    def of_type(self, hint: Any) -> dict[str, Any]:
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if hint is Any:
            return {}
        if hint is type(None):
            return {"type": "null"}
        if hint is str:
            return {"type": "string"}
        if hint is bool:
            return {"type": "boolean"}
        if hint is int:
            return {"type": "integer"}
        if hint is float:
            return {"type": "number"}
        if origin in (Union, types.UnionType):
            options = [self.of_type(a) for a in args]
            plain = [o.get("type") for o in options]
            if all(isinstance(t, str) for t in plain) and all(len(o) == 1 for o in options):
                return {"type": plain}
            return {"anyOf": options}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin in (list, tuple, Sequence) and args:
            return {"type": "array", "items": self.of_type(args[0])}
        if origin in (dict, Mapping):
            return {"type": "object", "additionalProperties": self.of_type(args[1])}
        if attrs.has(hint):
            return self.ref(hint)
        raise TypeError(f"no JSON Schema for {hint!r}")


def _plain(value: object) -> bool:
    return isinstance(value, str | int | float | bool)


# -- the document -----------------------------------------------------------------------


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": list(ERROR_CODES)},
                    "message": {"type": "string"},
                    "field": {"type": "string", "description": "the field that is wrong"},
                    "owner": {"type": "string", "description": "not_owner: the leasing node"},
                },
            }
        },
        "description": "Every error: "
        + "; ".join(f"`{code}` ({what})" for code, what in ERROR_CODES.items()),
    }


def _content(body: Body, schemas: Schemas) -> dict[str, Any]:
    if body.kind is not None:
        schema: dict[str, Any] = schemas.ref(body.kind)
    else:
        schema = _resolve(body.schema or {}, schemas)
    return {body.media: {"schema": schema}}


def _resolve(schema: Any, schemas: Schemas) -> Any:
    """``schema`` with ``{"$attrs": Class}`` and ``{"$pydantic": "module:Model"}`` replaced
    by references to those types' schemas."""
    if isinstance(schema, Mapping):
        if "$attrs" in schema:
            return schemas.ref(schema["$attrs"])
        if "$pydantic" in schema:
            return schemas.pydantic(schema["$pydantic"])
        return {k: _resolve(v, schemas) for k, v in schema.items()}
    if isinstance(schema, list | tuple):
        return [_resolve(v, schemas) for v in schema]
    return schema


_SECURITY: Final[Mapping[str, list[dict[str, list[str]]]]] = {
    "none": [],
    "admin": [{"bearer": []}, {"adminCookie": []}],
    "session": [{"bearer": []}, {"adminCookie": []}, {"scopedCookie": []}],
    "query": [{"bearer": []}, {"adminCookie": []}, {"scopedCookie": []}, {"queryToken": []}],
}


def _path_params(path: str) -> list[dict[str, Any]]:
    out = []
    for name in path.split("{")[1:]:
        name = name.split("}")[0]
        out.append(
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": {"type": "string"},
            }
        )
    return out


def openapi_document(
    routes: Iterable[object], *, tool_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (a Starlette app's ``routes``); with
    ``tool_names`` (the daemon's tools), a session's grant may name only those."""
    schemas = Schemas()
    paths: dict[str, dict[str, Any]] = {}
    producers: list[dict[str, Any]] = []
    for method, path, op in operations(routes):
        entry: dict[str, Any] = {
            "operationId": _operation_id(method, path),
            "summary": op.summary,
            "tags": [op.tag],
            "security": _SECURITY[op.access],
        }
        if op.description:
            entry["description"] = op.description
        params = _path_params(path)
        for p in op.params:
            params.append(
                {
                    "name": p.name,
                    "in": p.where,
                    "required": False,
                    "schema": dict(p.schema),
                    "description": p.description,
                }
            )
        if params:
            entry["parameters"] = params
        if op.body is not None:
            entry["requestBody"] = {
                "required": op.body.required,
                "content": _content(op.body, schemas),
            }
            if op.body.description:
                entry["requestBody"]["description"] = op.body.description
        responses: dict[str, Any] = {}
        for status, body in op.answers.items():
            response: dict[str, Any] = {"description": body.description or "OK"}
            if body.kind is not None or body.schema is not None:
                response["content"] = _content(body, schemas)
            responses[str(status)] = response
        errors = set(op.errors)
        if op.access != "none":
            errors.update(_ALWAYS)
        if op.access in ("session", "query"):
            errors.add(403)
        for status in sorted(errors):
            responses[str(status)] = {"$ref": f"#/components/responses/E{status}"}
        entry["responses"] = responses
        if op.yields_session:
            producers.append(responses)
        paths.setdefault(path, {})[method.lower()] = entry
    session_ops = [
        entry["operationId"]
        for path, entries in paths.items()
        if path.startswith("/v1/sessions/{session_id}")
        for entry in entries.values()
    ]
    for responses in producers:
        for code, response in responses.items():
            if code.startswith("2") and "content" in response:
                response["links"] = {
                    target: {
                        "operationId": target,
                        "parameters": {"session_id": "$response.body#/session_id"},
                    }
                    for target in session_ops
                }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "perdure daemon",
            "version": __version__,
            "description": "The HTTP API of `perdure serve`: sessions of a durable agent "
            "runtime. Every command is answered once its record is durable and carries a "
            "`request_id`: the same id with the same body gets the same answer, also after "
            "a restart; the same id with another body is a 409 `conflict`.",
        },
        "paths": paths,
        "components": {
            "schemas": {**_granting(schemas.named, tool_names), "Error": _error_schema()},
            "responses": {
                f"E{status}": {
                    "description": text,
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
                for status, text in _STATUS_TEXT.items()
            },
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin token (`daemon.token` in the log's directory, "
                    "or `PERDURE_TOKEN`), or a scoped session token (a JWT minted by "
                    "`POST /v1/sessions/{session_id}/tokens`).",
                },
                "adminCookie": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "perdure_session",
                    "description": "The page's cookie, set by `GET /?token=<admin token>`.",
                },
                "scopedCookie": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "perdure_scoped",
                    "description": "The page's cookie for a scoped token, set by "
                    "`GET /?token=<scoped token>`.",
                },
                "queryToken": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "token",
                    "description": "A token in the URL, accepted only by the page and the "
                    "event streams (a browser's EventSource cannot set a header).",
                },
            },
        },
    }


def _granting(named: dict[str, Any], tool_names: Sequence[str] | None) -> dict[str, Any]:
    """The schemas with a session's grant (``CreateSessionBody.tools``) limited to the
    daemon's own tool names: a name it does not have is refused, so the document says so."""
    body = named.get("CreateSessionBody")
    if tool_names is None or body is None:
        return named
    tools = body["properties"]["tools"]
    for option in tools.get("anyOf", [tools]):
        if option.get("type") == "array":
            option["items"] = {"type": "string", "enum": sorted(tool_names)}
    return named


def _operation_id(method: str, path: str) -> str:
    words = [method.lower()]
    for part in path.strip("/").split("/"):
        if not part or part == "v1":
            continue
        if part.startswith("{"):
            words.append("by_" + part.strip("{}"))
        else:
            words.append(part.replace("-", "_").replace(".", "_"))
    return "_".join(words) if len(words) > 1 else words[0] + "_root"


# -- what is read or answered without an attrs class ------------------------------------
#
# A few routes read their body by hand (a token's request, a fork's ``at``, the AI
# SDK's and AG-UI's inputs) or answer a summary built as plain data; their schemas
# are written here, beside the generator, and checked against the live daemon by the
# property-based tests. ``{"$attrs": Class}`` inside one stands for that class's schema.

HTML: Final = "text/html"


def sse_event(data: Mapping[str, Any], description: str) -> dict[str, Any]:
    """One Server-Sent Event, the OpenAPI 3.2 way: ``schema`` of a text/event-stream
    describes each event (its fields as strings; ``data`` per ``data``)."""
    return {
        "type": "object",
        "description": description,
        "required": ["data"],
        "properties": {
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the record's seq"},
            "event": {"type": "string"},
            "retry": {"type": "integer"},
            "data": dict(data),
        },
    }


NATIVE_EVENT: Final = {
    "type": "string",
    "contentMediaType": JSON,
    "contentSchema": {
        "type": "object",
        "required": ["type", "session_id"],
        "properties": {
            "seq": {"type": "integer", "description": "committed records only"},
            "type": {"type": "string", "description": "the record type, or the ephemeral kind"},
            "session_id": {"type": "string"},
            "record": {"type": "object", "description": "the record, with its type as `t`"},
            "data": {"description": "an ephemeral event's data"},
        },
    },
}
ANY_EVENT: Final = sse_event(
    {"type": "string", "description": "native: a JSON object; ai-sdk and ag-ui: their JSON parts"},
    "an event of the stream, in the format asked for",
)
AI_SDK_EVENT: Final = sse_event(
    {"type": "string", "description": "a UI message stream part as JSON, or `[DONE]` at the end"},
    "an AI SDK UI message stream part",
)
AG_UI_EVENT: Final = sse_event(
    {"type": "string", "contentMediaType": JSON, "contentSchema": {"type": "object"}},
    "an AG-UI event",
)

HEALTH: Final = {
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"enum": ["ok", "shutting_down"]},
        "version": {"type": "string"},
    },
}

STUCK: Final = {
    "type": "object",
    "required": [
        "waiting",
        "detail",
        "call_id",
        "run_id",
        "last_progress_at",
        "idle_for",
        "describe",
    ],
    "properties": {
        "waiting": {"enum": list(WAITING_KINDS)},
        "detail": {"type": "string", "description": "the tool's name, the model, ..."},
        "call_id": {"type": ["string", "null"]},
        "run_id": {"type": ["string", "null"]},
        "last_progress_at": {"type": "number", "description": "the latest record's time"},
        "idle_for": {"type": "number", "description": "seconds since then"},
        "describe": {"type": "string", "description": "one line for a person"},
    },
}

SESSION_LIST_PARAMS: Final = (
    Param(
        "limit",
        "query",
        {"type": "integer", "minimum": 1, "maximum": 10_000},
        "a page of at most this many sessions",
    ),
    Param(
        "after",
        "query",
        {"type": "string"},
        "`order=id`: the page after this session id (the `next` of the page before)",
    ),
    Param(
        "before",
        "query",
        {"type": "integer", "minimum": 0},
        "`order=newest`: the page of the sessions created before this position (the "
        "`next` of the page before)",
    ),
    Param(
        "order",
        "query",
        {"enum": ["id", "newest"]},
        "`id` (the default): pages in session-id order, placed by `after`; `newest`: "
        "newest first by creation (read from the log's index by creation), placed by "
        "`before`",
    ),
    Param(
        "active",
        "query",
        {"enum": ["1", "0", "true", "false"]},
        "`1` or `true`: only the sessions with unfinished work (read from the log's index of them)",
    ),
)

SESSION_LIST_DOC: Final = """\
Without `limit`, `after`, `before`, `active` or `order`: every session, in order of
creation (each call reads every session's summary). With any of them: a page of at most
`limit` sessions (10,000 when left out), with `active=1` only sessions with unfinished
work, and `next`, where the next page starts (null after the last page). In session-id
order (`order=id`, the default) a page holds the ids after `after`, and `next` is the
next page's `after`; newest first by creation (`order=newest`, what the web page
shows) it holds the sessions created before `before`, and `next` is the next page's
`before`. A page reads only its own sessions' summaries (with `active=1`, the active
sessions'), and `stuck` only for its sessions with unfinished work."""

SESSION_LIST: Final = {
    "type": "object",
    "required": ["sessions"],
    "properties": {
        "next": {
            "description": "a page's answer only: the `after` (`order=id`) or `before` "
            "(`order=newest`) of the next page, or null after the last",
            "anyOf": [{"type": "null"}, {"type": "string"}],
        },
        "sessions": {
            "type": "array",
            "items": {
                "allOf": [
                    {"$attrs": SessionInfo},
                    {
                        "type": "object",
                        "required": ["active", "stuck"],
                        "properties": {
                            "active": {"type": "boolean"},
                            "stuck": {
                                "description": "unfinished work and no record committed "
                                "for the daemon's --stuck-after seconds: what it waits for "
                                "(null: not stuck)",
                                "anyOf": [{"type": "null"}, STUCK],
                            },
                        },
                    },
                ]
            },
        },
    },
}

_LIST: Final = {"type": "array"}
SESSION_SUMMARY: Final = {
    "type": "object",
    "description": "What `perdure show` shows: see `perdure.inspect`.",
    "required": [
        "session_id",
        "status",
        "system",
        "forked_from",
        "parent",
        "if_busy",
        "paused",
        "parked",
        "last_seq",
        "request",
        "done",
        "next",
        "unconfirmed",
        "current_run",
        "queue",
        "runs",
        "tasks",
        "pending_approvals",
        "awaiting_resolution",
        "decisions",
        "usage",
        "cost",
        "context",
    ],
    "properties": {
        "session_id": {"type": "string"},
        "context": {
            "type": "object",
            "description": "Context compaction: what the model is sent in place of the "
            "older turns (every compaction, the one in progress, the last that made "
            "nothing); the log keeps every record.",
            "required": ["items", "summarised", "last_input_tokens", "compactions"],
            "properties": {
                "items": {"type": "integer"},
                "summarised": {"type": "integer"},
                "last_input_tokens": {"type": "integer"},
                "compactions": _LIST,
                "compacting": {"type": ["object", "null"]},
                "abandoned": {"type": ["string", "null"]},
            },
        },
        "status": {
            "enum": [
                "parked",
                "idle",
                "cancelling",
                "paused",
                "awaiting_approval",
                "awaiting_human",
                "compensating",
                "running",
            ]
        },
        "system": {"type": ["string", "null"]},
        "forked_from": {
            "type": ["object", "null"],
            "properties": {"session_id": {"type": "string"}, "position": {"type": "integer"}},
        },
        "parent": {"type": ["string", "null"]},
        "if_busy": {"type": ["string", "null"]},
        "paused": {"type": "boolean"},
        "parked": {"type": ["string", "null"], "description": "why it is parked, if it is"},
        "last_seq": {"type": "integer"},
        "current_run": {"type": ["string", "null"]},
        "queue": _LIST,
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["run_id", "submission_id", "status", "final_text", "reason"],
                "properties": {
                    "run_id": {"type": "string"},
                    "submission_id": {"type": "string"},
                    "status": {"type": "string"},
                    "final_text": {"type": ["string", "null"]},
                    "reason": {"type": ["string", "null"]},
                },
            },
        },
        "tasks": _LIST,
        "next": _LIST,
        "unconfirmed": _LIST,
        "decisions": _LIST,
        "pending_approvals": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["call_id", "tool", "input"],
                "properties": {"call_id": {"type": "string"}, "tool": {"type": "string"}},
            },
        },
        "awaiting_resolution": _LIST,
    },
}

TRANSCRIPT: Final = {
    "type": "object",
    "required": ["session_id", "messages"],
    "properties": {
        "session_id": {"type": "string"},
        "messages": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["user", "assistant"]},
                    "content": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type"],
                            "properties": {
                                "type": {
                                    "enum": [
                                        "text",
                                        "tool_use",
                                        "thinking",
                                        "redacted_thinking",
                                        "tool_result",
                                    ]
                                }
                            },
                        },
                    },
                },
            },
        },
    },
}

FORK_REQUEST: Final = {
    "allOf": [
        {"$attrs": ForkBody},
        {
            "type": "object",
            "properties": {
                "at": {
                    "type": ["string", "integer", "null"],
                    "description": "a run id or a sequence number (default: the newest "
                    "settled point)",
                }
            },
        },
    ]
}

REWIND_REQUEST: Final = {
    "allOf": [
        {"$attrs": RewindBody},
        {
            "type": "object",
            "required": ["to"],
            "properties": {
                "to": {
                    "type": ["string", "integer"],
                    "description": "a call id (the workspace before it) or a sequence "
                    "number of a settled point",
                }
            },
        },
    ]
}

WORKSPACE_DIFF: Final = {
    "type": "object",
    "required": ["session_id", "calls"],
    "properties": {
        "session_id": {"type": "string"},
        "calls": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "call_id",
                    "attempt",
                    "tool_name",
                    "before",
                    "after",
                    "changed",
                    "skipped",
                    "patch",
                ],
                "properties": {
                    "call_id": {"type": "string"},
                    "attempt": {"type": "integer"},
                    "tool_name": {"type": "string"},
                    "before": {"type": "string"},
                    "after": {"type": "string"},
                    "changed": {"type": "array", "items": {"type": "string"}},
                    "skipped": {"type": "array", "items": {"type": "string"}},
                    "patch": {"type": "string"},
                },
            },
        },
    },
}

DIFF_PARAMS: Final = (
    Param("call_id", "query", {"type": "string"}, "only this call's checkpoints"),
)

TRACEPARENT: Final = Param(
    "traceparent",
    "header",
    {"type": "string"},
    "W3C trace context: the run becomes a child of the caller's span (ignored if malformed)",
)

TRANSCRIPT_PARAMS: Final = (
    Param(
        "history",
        "query",
        {"type": "string"},
        "`1`, `true` or `yes`: every message the log keeps, as if no context compaction "
        "had been made; otherwise what the model is sent (a summary in place of what it "
        "covers)",
    ),
)

EVENT_PARAMS: Final = (
    Param("after", "query", {"type": "integer", "minimum": 0}, "resume after this seq"),
    Param(
        "Last-Event-ID",
        "header",
        {"type": "integer", "minimum": 0},
        "a reconnect: resume after this seq (wins over `after`)",
    ),
    Param(
        "live",
        "query",
        {"type": "string"},
        "`0`, `false` or `no`: end the stream after the replay; anything else follows live",
    ),
    Param(
        "format",
        "query",
        {"enum": ["perdure", "ai-sdk", "ag-ui"], "default": "perdure"},
        "the encoding: perdure's own (native), the AI SDK's UI message stream, or AG-UI",
    ),
)

EVENTS_DOC: Final = """\
The native format (`format=perdure`): each committed record is one event

    id: <seq>
    event: <record type, e.g. RunStarted>
    data: {"seq": <seq>, "type": "<record type>", "session_id": "...", "record": {...}}

ephemeral events (text and tool-input deltas, progress) carry no `id`:

    event: text_delta
    data: {"type": "text_delta", "session_id": "...", "data": {...}}

and a comment (`: keepalive`) keeps an idle connection alive. The stream opens with
`retry: <ms>`. Reconnect with `Last-Event-ID` (or `?after=`): no gap, no duplicate.
A client that falls too far behind is dropped and reconnects from its last id.
`format=ai-sdk` and `format=ag-ui` give the same session in those protocols; each
record's last frame carries its seq as the SSE id."""

AI_SDK_DOC: Final = (
    "An AI SDK UI message stream (v1; header `x-vercel-ai-ui-message-stream: v1`): one "
    "`data: {json}` frame per part (`start`, `start-step`, `text-*`, `reasoning-*`, "
    "`tool-input-*`, `tool-approval-request`, `tool-output-*`, `data-perdure-*`, `finish`), "
    "ending with `data: [DONE]`."
)

CHAT_DOC: Final = (
    "The newest user message becomes an input whose request id is the message id (a retry "
    "gets the same reply); an assistant message whose tool parts carry approval responses "
    "records them and continues the reply. The session is created if it does not exist."
)

CHAT_REQUEST: Final = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "id": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "role"],
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 200},
                    "role": {"enum": ["user", "assistant", "system"]},
                    "parts": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
    },
}

AG_UI_DOC: Final = (
    "An AG-UI `RunAgentInput` (`threadId` is the session id; needs `perdure[ag-ui]`): the "
    "newest user message becomes an input whose request id is the `runId`; `resume` entries "
    "answer the approvals of an interrupted run (`payload: {approved: bool}`). Answers AG-UI "
    "events as SSE `data: {json}` frames."
)


AG_UI_REQUEST: Final = {"$pydantic": "ag_ui.core:RunAgentInput"}
