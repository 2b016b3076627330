"""One face, four bodies: the operations of perdure agree wherever they are offered.

``Runtime`` (trio), ``AsyncioRuntime`` (``perdure.embed``), ``PerdureClient`` and
``AsyncPerdureClient`` (``perdure.client``) and the daemon's routes are written by hand.
This test compares them, so that an operation or a parameter added to one and not the
others fails here:

* ``AsyncioRuntime`` offers every public method of ``Runtime`` with the same parameters
  (names, kinds, defaults); the properties that change while the runtime runs are
  awaited methods there (they are read on the trio thread);
* the two clients offer the same operations with the same parameters;
* an operation both ``Runtime`` and the clients offer takes the same parameters;
* every request a client sends reaches a route of the daemon, and the JSON body it
  sends has exactly the fields that route reads.

Each difference that is meant is listed below with its reason; anything else fails.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import attrs
import pytest
import trio
from starlette.routing import Match

import perdure
import perdure.embed
from perdure.client import AsyncPerdureClient, PerdureClient
from perdure.client import _model as m
from perdure.server import app as daemon_app

Param = tuple[str, Any, Any]  # name, kind, default


def operations(cls: type) -> dict[str, Any]:
    """The public methods (and properties) a class defines, by name."""
    return {
        name: value
        for klass in reversed(cls.__mro__[:-1])
        for name, value in vars(klass).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def params(fn: Callable[..., Any]) -> list[Param]:
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.name != "self"
    ]


# -- Runtime and AsyncioRuntime ----------------------------------------------------------

# Read on the trio thread, so awaited methods of AsyncioRuntime (no parameters).
AWAITED_PROPERTIES = {
    "resident_sessions",
    "taken_over_sessions",
    "received_sessions",
    "handed_over_sessions",
    "evictions",
    "hibernated_sessions",
    "hibernations",
    "frozen_sessions",
}
NOT_ON_ASYNCIO = {
    "mcp": "the MCP hub holds trio objects: use it from trio code, inside run()",
    "tools": "the tools are trio code; AsyncioRuntime.trio_runtime.tools is the same dict",
    "watch": "it yields a trio memory channel; asyncio code follows each session's events",
    "event_batches": "events() delivers the same events, one per __anext__ across the loops",
}
ONLY_ON_ASYNCIO = {
    "run": "awaits any trio function on the runtime's loop (the bridge itself)",
}
# events() returns an EventStream (an asyncio iterator) instead of an async generator:
# same parameters, compared below like the rest.


def test_asyncio_runtime_offers_every_method_of_runtime() -> None:
    trio_ops = operations(perdure.Runtime)
    asyncio_ops = operations(perdure.embed.AsyncioRuntime)
    expected = set(trio_ops) - set(NOT_ON_ASYNCIO)
    offered = set(asyncio_ops) - set(ONLY_ON_ASYNCIO)
    assert offered == expected, (
        f"missing on AsyncioRuntime: {sorted(expected - offered)}; "
        f"not on Runtime: {sorted(offered - expected)}"
    )
    assert set(ONLY_ON_ASYNCIO) <= set(asyncio_ops) and not set(NOT_ON_ASYNCIO) & set(asyncio_ops)
    for name in sorted(expected):
        mine, theirs = trio_ops[name], asyncio_ops[name]
        if isinstance(mine, property):
            if name in AWAITED_PROPERTIES:
                assert inspect.iscoroutinefunction(theirs) and params(theirs) == [], name
            else:
                assert isinstance(theirs, property), f"{name} is a property of Runtime"
            continue
        assert params(theirs) == params(mine), name
        if inspect.iscoroutinefunction(mine):
            assert inspect.iscoroutinefunction(theirs), f"AsyncioRuntime.{name} is not awaited"


def test_only_listed_properties_of_runtime_are_awaited_on_asyncio() -> None:
    trio_ops = operations(perdure.Runtime)
    assert {n for n, v in trio_ops.items() if isinstance(v, property)} >= AWAITED_PROPERTIES


# -- the two clients -----------------------------------------------------------------------

CLOSERS = {"close", "aclose"}  # the sync client closes, the async one acloses


def test_the_two_clients_offer_the_same_operations_with_the_same_parameters() -> None:
    sync_ops = operations(PerdureClient)
    async_ops = operations(AsyncPerdureClient)
    assert set(sync_ops) - CLOSERS == set(async_ops) - CLOSERS
    for name in sorted(set(sync_ops) - CLOSERS):
        assert params(sync_ops[name]) == params(async_ops[name]), name
        assert not inspect.iscoroutinefunction(sync_ops[name]), name
        is_async = inspect.iscoroutinefunction(async_ops[name])
        assert is_async or inspect.isasyncgenfunction(async_ops[name]), name


# -- Runtime and the clients ----------------------------------------------------------------

ONLY_IN_PROCESS = {
    "ensure_session": "the clients' create_session answers whether it created the session",
    "session_info": "the clients' sessions() lists the same summaries",
    "summary": "the clients' state() answers this summary (GET /v1/sessions/{id})",
    "view": "the clients' state() answers the session's summary, which holds the same facts",
    "restarts": "the log's system records are read where the log is",
    "stream_stats": "the daemon's /metrics serves them",
    "children": "the daemon streams sub-agents' events; their ids are in the heartbeats",
    "prune": "retention is run where the log is (perdure prune)",
    "export_session": "retention is run where the log is (perdure export)",
    "import_session": "retention is run where the log is (perdure import)",
    "event_batches": "the daemon writes these batches to its event streams",
    "watch": "a trio channel of the process",
    "mcp": "the process's MCP servers",
    "tools": "the process's tools",
    "location": "the process's log",
    "log_path": "the process's log",
    "node_id": "the process's identity among nodes",
    "epoch": "the process's ownership of the log",
    "recovered_sessions": "what this process recovered when it started",
    "taken_over_sessions": "what this process took over",
    "received_sessions": "what this process was handed",
    "handed_over_sessions": "what this process handed over",
    "resident_sessions": "the daemon's stats() counts them",
    "hibernated_sessions": "the process's memory",
    "frozen_sessions": "the process's memory",
    "evictions": "the daemon's stats() counts them",
    "hibernations": "the process's memory",
    "stuck_runs": "the daemon's session list marks each stuck session (its stuck field)",
    "stuck_after": "the daemon's threshold is set where it starts (perdure serve --stuck-after)",
    "prices": "the daemon's price table is set where it starts; its summaries are priced by it",
}
ONLY_IN_CLIENTS = {
    "health": "the daemon's liveness",
    "whoami": "what the caller's credential opens",
    "mint_token": "scoped tokens are the daemon's",
    "close": "the HTTP connection pool",
    "aclose": "the HTTP connection pool",
}
# Parameters of Runtime that the clients (and the daemon) do not take, and why.
NOT_OVER_HTTP = {
    ("create_session", "budget"): "budgets are set where the runtime opens, not by callers",
    ("create_session", "compaction"): "compaction policies are set where the runtime opens",
    ("submit", "budget"): "budgets are set where the runtime opens, not by callers",
    ("revise", "budget"): "budgets are set where the runtime opens, not by callers",
    ("delete_session", "reason"): "the daemon records its own reason (deleted through the API)",
    ("state", "fn"): "a function cannot cross HTTP: the clients read the session's summary",
    ("state", "wake"): "the daemon never wakes a session to read it",
    ("events", "restarts"): "the daemon's streams always mark restarts",
}
# fork's source is positional-only in process (a session id can never clash with the
# keyword arguments); the clients take it as a plain positional parameter.
POSITIONAL_ONLY_IN_PROCESS = {("fork", "source")}


def test_an_operation_takes_the_same_parameters_in_process_and_over_http() -> None:
    trio_ops = operations(perdure.Runtime)
    client_ops = operations(PerdureClient)
    in_process = set(trio_ops) - set(client_ops) - set(ONLY_IN_PROCESS)
    in_clients = set(client_ops) - set(trio_ops) - set(ONLY_IN_CLIENTS)
    assert not in_process and not in_clients, (
        f"only in process, unlisted: {sorted(in_process)}; "
        f"only in the clients, unlisted: {sorted(in_clients)}"
    )
    assert not set(ONLY_IN_PROCESS) & set(client_ops) and not set(ONLY_IN_CLIENTS) & set(trio_ops)
    for name in sorted(set(trio_ops) & set(client_ops)):
        mine = [
            (
                p,
                inspect.Parameter.POSITIONAL_OR_KEYWORD
                if (name, p) in POSITIONAL_ONLY_IN_PROCESS
                else kind,
                d,
            )
            for p, kind, d in params(trio_ops[name])
            if (name, p) not in NOT_OVER_HTTP
        ]
        assert params(client_ops[name]) == mine, name
    for name, param in NOT_OVER_HTTP:  # each listed exception is still one
        assert param in [p for p, _, _ in params(trio_ops[name])], (name, param)
        assert param not in [p for p, _, _ in params(client_ops[name])], (name, param)


# -- the clients and the daemon's routes ----------------------------------------------------

# A value for each parameter, unlike any default, so that every optional field is sent.
SAMPLES: dict[str, Any] = {
    "session_id": "sess-1",
    "source": "sess-src",
    "call_id": "call-1",
    "text": "hello",
    "system": "be brief",
    "if_busy": "reject",
    "request_id": "rid-1",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "at": 7,
    "approved": False,
    "note": "fine",
    "action": "skip",
    "result": {"ok": True},
    "scope": "write",
    "ttl_s": 60,
    "tools": ["lookup"],
    "history": True,
    "files": True,
    "to": "call-7",
    "after": "sess-0",
    "limit": 5,
    "active": True,
    "before": 9,
}
# Sent in a header, not in the body.
HEADERS = {"traceparent": "traceparent"}
# Made of several requests or a stream, by the clients themselves.
NOT_ONE_REQUEST = {"events", "wait_idle", "close", "aclose"}


def _request(name: str) -> tuple[m.Call[Any], dict[str, Any]]:
    """The request ``PerdureClient.<name>`` sends, with every parameter given."""
    sent: list[m.Call[Any]] = []
    client = PerdureClient("http://daemon.invalid", "token")
    client._send = sent.append  # type: ignore[method-assign,assignment]
    try:
        method = getattr(client, name)
        given = {p: SAMPLES[p] for p, _, _ in params(method)}
        positional = [
            given.pop(p)
            for p, kind, _ in params(method)
            if kind is not inspect.Parameter.KEYWORD_ONLY
        ]
        method(*positional, **given)
    finally:
        client.close()
    (call,) = sent
    return call, {p: SAMPLES[p] for p, _, _ in params(getattr(PerdureClient, name))}


def _routes() -> list[Any]:
    app = daemon_app.create_app(None, token="t", closing=trio.Event())  # type: ignore[arg-type]
    starlette = app.app  # inside the auth middleware
    return list(starlette.routes)


def _endpoint(method: str, path: str) -> tuple[Any, dict[str, Any]]:
    for route in _routes():
        match, child = route.matches({"type": "http", "path": path, "method": method})
        if match is Match.FULL:
            return route.endpoint, child["path_params"]
    raise AssertionError(f"no route of the daemon takes {method} {path}")


def _query_params(endpoint: Any) -> set[str]:
    """The query parameters the route's document names."""
    return {p.name for p in endpoint.__openapi__.params if p.where == "query"}


def _body_fields(endpoint: Any) -> set[str]:
    """The JSON fields the route's handler reads: its body class's, and any it reads itself."""
    source = inspect.getsource(endpoint)
    fields: set[str] = set()
    for cls_name in set(re.findall(r"\b(\w+Body)\b", source)):
        fields |= {f.name for f in attrs.fields(getattr(daemon_app, cls_name))}
    fields |= set(re.findall(r"data\.get\(\"(\w+)\"", source))
    return fields


@pytest.mark.parametrize("name", sorted(set(operations(PerdureClient)) - NOT_ONE_REQUEST), ids=str)
def test_each_client_request_reaches_a_route_that_reads_every_field_it_sends(name: str) -> None:
    call, given = _request(name)
    path, _, query = call.path.partition("?")
    endpoint, path_params = _endpoint(call.method, path)
    in_path = {p for p, v in given.items() if v in path_params.values()}
    in_headers = {p for p in given if p in HEADERS and (call.headers or {}).get(HEADERS[p])}
    in_query = set(parse_qs(query))
    assert in_query <= set(_query_params(endpoint)), f"{name}: the route reads other parameters"
    body = set(call.body or {})
    assert body == set(given) - in_path - in_headers - in_query, name
    assert body == _body_fields(endpoint), f"{name}: the route reads other fields"


def test_the_event_stream_has_its_route() -> None:
    follower = m.Follower("sess-1", 0, live=False)
    endpoint, path_params = _endpoint("GET", follower.path)
    assert path_params == {"session_id": "sess-1"} and endpoint.__name__ == "events"
