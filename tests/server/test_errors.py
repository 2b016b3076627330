"""Errors say whose fault they are: the daemon's exception handlers, in process.

* every exception the runtime or the log can raise has its own status and code
  (the table of ``perdure.server.errors``), checked through a real Starlette app;
* an actor that crashes with a command pending answers 503 ``session_restarting``
  (not ``log_unavailable``: the log is fine) and the retry with the same request
  id is answered once, from the log;
* a malformed payload is a 400 naming its field and records nothing.

In process (httpx's ASGI transport over ``create_app`` and a real runtime on a
real LMDB log), so a crash can be injected at one exact append.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import perdure
from perdure.errors import (
    NotOwnerRefused,
    Refused,
    SessionParkedError,
    SessionRestarting,
    UnknownSession,
)
from perdure.providers.scripted import Reply, ScriptedProvider
from perdure.server.app import create_app
from perdure.server.errors import HANDLERS, ApiError
from perdure.storage import LogFenced, LogUnavailable, NotOwner, StorageFull
from perdure.storage.codec import CorruptRecord
from perdure.storage.records import InputAccepted, Record

TOKEN = "t0ken"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}

RAISED: list[tuple[BaseException, int, str]] = [
    (ApiError(400, "invalid_field", "bad", "text"), 400, "invalid_field"),
    (UnknownSession("s"), 404, "not_found"),
    (Refused("conflict", "another body"), 409, "conflict"),
    (Refused("invalid_state", "not now"), 409, "invalid_state"),
    (SessionParkedError("s", "crashed"), 423, "parked"),
    (NotOwnerRefused("ask node-b", "node-b"), 409, "not_owner"),
    (NotOwner("s", "node-b", 3.0), 409, "not_owner"),
    (SessionRestarting("s", "RuntimeError: boom"), 503, "session_restarting"),
    (LogUnavailable("connection refused"), 503, "log_unavailable"),
    (StorageFull("disk full"), 503, "log_unavailable"),
    (LogFenced("taken over"), 503, "log_unavailable"),
    (CorruptRecord(7, "bad checksum"), 500, "corrupt_record"),
    (KeyError("a bug"), 500, "internal"),
]


@pytest.mark.parametrize(("exc", "status", "code"), RAISED, ids=lambda v: type(v).__name__)
async def test_each_error_has_its_own_status_and_code(
    exc: BaseException, status: int, code: str
) -> None:
    async def route(request: Request) -> Response:
        raise exc

    app = Starlette(routes=[Route("/", route)], exception_handlers=dict(HANDLERS))
    # raise_app_exceptions=False: Starlette re-raises a 500 after answering it (for
    # the server's log); the client still gets the answer.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        resp = await c.get("/")
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code
    assert error["message"]
    if code == "not_owner":
        assert error["owner"] == "node-b"  # the caller is told where to go
    if code == "session_restarting":
        assert "retry with the same request_id" in error["message"]


class CrashOnce:
    """Wraps the journal's append: the next append of a chosen record type raises a bug."""

    def __init__(self, append: Any, kind: type[Record]) -> None:
        self.append = append
        self.kind = kind
        self.armed = True
        self.crashed = trio.Event()

    async def __call__(self, records: Sequence[Record], **kwargs: Any) -> Any:
        if self.armed and any(isinstance(r, self.kind) for r in records):
            self.armed = False
            self.crashed.set()
            raise RuntimeError("injected actor bug")
        return await self.append(records, **kwargs)


async def last_seq(rt: perdure.Runtime, sid: str) -> int:
    info = await rt.session_info(sid)
    assert info is not None
    return info.last_seq


async def test_an_actor_crash_is_session_restarting_and_the_retry_is_answered_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = ScriptedProvider([Reply(text="done")])
    async with perdure.open_runtime(tmp_path / "log", provider=provider, tools=[]) as rt:
        app = create_app(rt, token=TOKEN, closing=trio.Event())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=HEADERS
        ) as c:
            created = await c.post("/v1/sessions", json={"session_id": "s1"})
            assert created.status_code == 201, created.text
            crash = CrashOnce(rt._journal.append, InputAccepted)
            monkeypatch.setattr(rt._journal, "append", crash)
            body = {"text": "hello", "request_id": "r1"}
            with trio.fail_after(30):  # the caller must be told, never left waiting
                first = await c.post("/v1/sessions/s1/messages", json=body)
            assert crash.crashed.is_set()
            assert first.status_code == 503, first.text
            assert first.json()["error"]["code"] == "session_restarting"
            # The supervisor restarts the actor from the log; the same request id is
            # then accepted exactly once.
            with trio.fail_after(30):
                while True:
                    again = await c.post("/v1/sessions/s1/messages", json=body)
                    if again.status_code != 503:
                        break
                    await trio.sleep(0.05)
            assert again.status_code == 202, again.text
            twice = await c.post("/v1/sessions/s1/messages", json=body)
            assert twice.json()["duplicate"] is True
            assert twice.json()["submission_id"] == again.json()["submission_id"]
            # Malformed: a 400 naming the field, and nothing recorded.
            await rt.wait_idle("s1")
            before = await last_seq(rt, "s1")
            bad = await c.post("/v1/sessions/s1/messages", json={"text": 3, "request_id": "r2"})
            assert bad.status_code == 400
            assert bad.json()["error"] == {
                "code": "invalid_field",
                "message": "the field 'text' must be a string",
                "field": "text",
            }
            assert await last_seq(rt, "s1") == before
