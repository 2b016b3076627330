"""The Python client against the daemon's OpenAPI document, both ways.

Every call the client can make must be an operation of the document, and every
operation of the API (but the pages for people and the frontend protocols, which
other clients speak) must have a client call. Each request body the client sends
must hold every field the document requires and only fields it lists, and with
every option given, every field it lists. Each answer the client reads is built
from the document (its required fields only, with values of the documented
types): a client that reads a field the document does not promise fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from perdure.client import _model as m
from perdure.server.app import create_app
from perdure.server.openapi import openapi_document

SID, CALL = "{session_id}", "{call_id}"
# Operations the Python client leaves to others: pages and files for people, the
# document itself, and the AI SDK's and AG-UI's protocols (their own clients).
NOT_THE_CLIENTS = {
    ("GET", "/"),
    ("GET", "/static/{name}"),
    ("GET", "/docs"),
    ("GET", "/docs/{name}"),
    ("GET", "/openapi.json"),
    ("POST", "/v1/sessions/{session_id}/chat"),
    ("GET", "/v1/sessions/{session_id}/chat/{chat_id}/stream"),
    ("POST", "/v1/sessions/{session_id}/ag-ui"),
}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(None, token="t", closing=trio.Event())  # type: ignore[arg-type]
    doc: dict[str, Any] = openapi_document(app.app.routes)  # type: ignore[attr-defined]
    return doc


def _calls() -> list[m.Call[Any]]:
    """Every call of the client, each with every option it has."""
    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    return [
        m.health(),
        m.stats(),
        m.whoami(),
        m.sessions(),
        m.create_session(None, "be brief", if_busy="queue", tools=["lookup"]),
        m.state(SID),
        m.delete_session(SID),
        m.transcript(SID),
        m.submit(SID, "hi", "r1", if_busy="steer", traceparent=tp),
        m.cancel(SID, "r1"),
        m.fork(SID, 3, "copy", "r1"),
        m.approve(SID, CALL, True, "r1", "a note"),
        m.revise(SID, "again", "r1"),
        m.pause(SID, "r1"),
        m.resume(SID, "r1"),
        m.compact_context(SID, "r1"),
        m.compensate(SID, CALL, "r1"),
        m.resolve(SID, CALL, "skip", {"done": True}, "r1"),
        m.mint_token(SID, "read", 60),
    ]


def _path(call_path: str) -> str:
    return call_path.replace("%7B", "{").replace("%7D", "}")


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = doc["components"]["schemas"][name]
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            part = _resolve(doc, part)
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += part.get("required", [])
        return merged
    return schema


def _sample(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A value of the documented type, objects holding their required fields only."""
    schema = _resolve(doc, schema)
    if "enum" in schema:
        return next(v for v in schema["enum"] if v is not None)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "object" in kinds or "properties" in schema:
        props = schema.get("properties", {})
        return {name: _sample(doc, props.get(name, {})) for name in schema.get("required", [])}
    for kind, value in (("string", "x"), ("integer", 1), ("boolean", True), ("array", [])):
        if kind in kinds:
            return value
    return None


def _operation(doc: dict[str, Any], call: m.Call[Any]) -> dict[str, Any]:
    op: dict[str, Any] = doc["paths"][_path(call.path)][call.method.lower()]
    return op


def test_every_client_call_is_an_operation_and_every_operation_has_a_call(
    document: dict[str, Any],
) -> None:
    documented = {
        (method.upper(), path) for path, ops in document["paths"].items() for method in ops
    }
    covered = {(c.method, _path(c.path)) for c in _calls()}
    covered.add(("GET", _path(m.Follower(SID, 0, True).path)))
    assert covered - documented == set(), "client calls the document does not have"
    assert documented - NOT_THE_CLIENTS - covered == set(), "operations without a client call"


def test_request_bodies_match_the_document_both_ways(document: dict[str, Any]) -> None:
    for call in _calls():
        op = _operation(document, call)
        if "requestBody" not in op:
            assert call.body is None, call
            continue
        schema = _resolve(document, op["requestBody"]["content"]["application/json"]["schema"])
        listed = set(schema.get("properties", {}))
        sent = set(call.body or {})
        where = f"{call.method} {call.path}"
        assert set(schema.get("required", [])) <= sent, f"{where}: a required field not sent"
        assert sent <= listed, f"{where}: sends fields the document lacks: {sent - listed}"
        assert listed <= sent, f"{where}: cannot send documented fields: {listed - sent}"
        for header in call.headers or {}:
            names = {p["name"].lower() for p in op.get("parameters", [])}
            assert header.lower() in names, f"{where}: header {header} is not documented"


def test_the_client_reads_only_what_the_document_promises(document: dict[str, Any]) -> None:
    for call in _calls():
        op = _operation(document, call)
        for status in call.ok:
            response = op["responses"][str(status)]
            content = response.get("content", {}).get("application/json")
            assert content is not None, f"{call.method} {call.path}: {status} has no JSON body"
            sample = _sample(document, content["schema"])
            try:
                call.read(sample)
            except (KeyError, TypeError) as exc:
                pytest.fail(f"{call.method} {call.path} reads an undocumented field: {exc!r}")


def test_the_check_fails_on_a_field_the_document_lacks(document: dict[str, Any]) -> None:
    # The guard guards: a client call that reads a field no answer promises is caught.
    schema = _operation(document, m.submit(SID, "hi", "r1"))["responses"]["202"]
    sample = _sample(document, schema["content"]["application/json"]["schema"])
    reading_more = m.Call("POST", "/x", lambda d: d["not_in_the_document"])
    with pytest.raises(KeyError):
        reading_more.read(sample)
