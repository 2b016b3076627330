"""The OpenAPI document: generated from the routes, valid, complete, served behind the token.

The completeness test is the guard: a route added to ``create_app`` without an
``Operation`` makes the document fail to build, and every route the app answers
must be an operation of the document (and nothing else).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from openapi_spec_validator import validate
from starlette.routing import Route

from perdure.server.app import create_app
from perdure.server.openapi import (
    ERROR_CODES,
    UndocumentedRoute,
    openapi_document,
)
from tests.support.daemon import Daemon
from tests.support.ledger_tools import ALL_TOOLS


def _app_routes(**kwargs: Any) -> list[Any]:
    app = create_app(None, token="t", closing=trio.Event(), **kwargs)  # type: ignore[arg-type]
    routes: list[Any] = app.app.routes  # type: ignore[attr-defined]
    return routes


def _pairs(routes: list[Any]) -> set[tuple[str, str]]:
    return {
        (method, route.path) for route in routes for method in route.methods if method != "HEAD"
    }


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document(_app_routes())
    assert doc["openapi"] == "3.1.0"
    validate(doc)


def test_every_route_is_in_the_document_and_nothing_else() -> None:
    from perdure.observability.metrics import RuntimeMetrics

    routes = _app_routes(metrics=RuntimeMetrics())
    doc = openapi_document(routes)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == _pairs(routes)
    assert ("GET", "/metrics") in documented


def test_a_route_without_an_operation_fails_the_document() -> None:
    async def undocumented(request: Any) -> Any:
        raise AssertionError("never called")

    routes = [*_app_routes(), Route("/v1/new-thing", undocumented, methods=["POST"])]
    with pytest.raises(UndocumentedRoute, match="/v1/new-thing"):
        openapi_document(routes)


def test_bodies_come_from_the_payload_types() -> None:
    doc = openapi_document(_app_routes())
    schemas = doc["components"]["schemas"]
    submit = schemas["SubmitBody"]
    assert submit["required"] == ["text", "request_id"]
    assert submit["properties"]["request_id"]["maxLength"] == 200
    assert set(submit["properties"]["if_busy"]["enum"]) == {
        "queue",
        "interrupt",
        "reject",
        "steer",
        None,
    }
    assert schemas["ApprovalBody"]["properties"]["approved"] == {"type": "boolean"}
    assert schemas["CancelAnswer"]["properties"]["seq"] == {"type": ["integer", "null"]}
    post = doc["paths"]["/v1/sessions/{session_id}/messages"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SubmitBody"
    }
    assert set(post["responses"]) >= {"202", "400", "401", "403", "404", "409", "413", "503"}
    codes = schemas["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert codes == list(ERROR_CODES)
    events = doc["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {"bearer": []} in events["security"] and {"queryToken": []} in events["security"]
    assert doc["paths"]["/healthz"]["get"]["security"] == []


def test_every_error_code_the_daemon_raises_is_listed() -> None:
    import re
    from pathlib import Path

    import perdure

    root = Path(perdure.__file__).parent
    raised: set[str] = set()
    for path in [*(root / "server").rglob("*.py"), *root.rglob("*.py")]:
        text = path.read_text()
        raised.update(re.findall(r'ApiError\(\s*\d+,\s*"([a-z_]+)"', text))
        raised.update(re.findall(r'Refused\(\s*"([a-z_]+)"', text))
        raised.update(re.findall(r'error_response\(\s*\w+,\s*"([a-z_]+)"', text))
    assert raised, "the scan found no error code"
    assert raised <= set(ERROR_CODES), raised - set(ERROR_CODES)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = Daemon(tmp_path_factory.mktemp("openapi"), [{"text": "ok"}]).start()
    yield d
    d.close()


def test_the_daemon_serves_the_document_and_its_docs_page_behind_the_token(
    daemon: Daemon,
) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as anonymous:
        refused = anonymous.get("/openapi.json")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"
        login = anonymous.get("/docs")
        assert login.status_code == 401 and "token" in login.text
        # The printed link trades the token for the cookie, which then opens the
        # page and the document it loads.
        traded = anonymous.get(f"/docs?token={daemon.token}", follow_redirects=False)
        assert traded.status_code == 303 and traded.headers["location"] == "/docs"
        assert anonymous.get("/docs").status_code == 200
        assert anonymous.get("/openapi.json").status_code == 200
    with daemon.client() as client:
        doc = client.get("/openapi.json")
        assert doc.status_code == 200
        validate(doc.json())
        assert doc.json()["info"]["title"] == "perdure daemon"
        page = client.get("/docs")
        assert page.status_code == 200
        assert '<script src="/docs/swagger-ui-bundle.js">' in page.text
        csp = page.headers["content-security-policy"]
        # Scripts only from the daemon itself: no script-src widening default-src.
        assert csp.startswith("default-src 'self'") and "script-src" not in csp
        bundle = client.get("/docs/swagger-ui-bundle.js")
        assert bundle.status_code == 200 and "SwaggerUIBundle" in bundle.text
        assert 'url: "/openapi.json"' in client.get("/docs/docs.js").text
        assert client.get("/docs/nothing.js").status_code == 404
        # A scoped token of a session reads the document too (its routes are in it).
        client.post("/v1/sessions", json={"session_id": "s1"}).raise_for_status()
        minted = client.post("/v1/sessions/s1/tokens", json={"scope": "read"}).json()
    with httpx.Client(
        base_url=daemon.url, timeout=30, headers={"Authorization": f"Bearer {minted['token']}"}
    ) as scoped:
        assert scoped.get("/openapi.json").status_code == 200


def test_what_schemathesis_found_stays_fixed(daemon: Daemon) -> None:
    with daemon.client() as client:
        # 405 names every method of the path, not only the first route's.
        refused = client.request("OPTIONS", "/v1/sessions")
        assert refused.status_code == 405
        assert refused.headers["allow"] == "GET, HEAD, POST"
        assert client.request("PUT", "/v1/sessions/s1").headers["allow"] == "DELETE, GET, HEAD"
        # JSON has one number type: 60.0 seconds is a whole number of seconds.
        client.post("/v1/sessions", json={"session_id": "s2"}).raise_for_status()
        minted = client.post("/v1/sessions/s2/tokens", json={"scope": "read", "ttl_s": 60.0})
        assert minted.status_code == 201, minted.text
        half = client.post("/v1/sessions/s2/tokens", json={"scope": "read", "ttl_s": 60.5})
        assert half.status_code == 400 and half.json()["error"]["field"] == "ttl_s"
        # A grant is a list of the daemon's own tool names (an object is not a list), and
        # the document names them, since any other name is refused.
        grant = client.post("/v1/sessions", json={"session_id": "s3", "tools": {}})
        assert grant.status_code == 400 and grant.json()["error"]["field"] == "tools"
        document = client.get("/openapi.json").json()
        body = document["components"]["schemas"]["CreateSessionBody"]["properties"]["tools"]
        (listed,) = [option for option in body["anyOf"] if option.get("type") == "array"]
        assert set(listed["items"]["enum"]) == {tool.name for tool in ALL_TOOLS}
