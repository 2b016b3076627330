"""The frontend protocols over a real daemon: AG-UI, the AI SDK UI message stream.

Every AG-UI event the daemon sends is validated by the ``ag-ui-protocol``
package's own models; the AI SDK chunks are checked for the shapes and order that
``useChat`` needs (tests/js drives the real ``ai`` client over the same routes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from tests.server.conftest import APPROVAL_SCRIPT
from tests.support.daemon import Daemon

ag_ui_core = pytest.importorskip("ag_ui.core", reason="the ag-ui extra is not installed")
EVENT = TypeAdapter(ag_ui_core.Event)

Frame = tuple[int | None, dict[str, Any]]


def frames(
    resp: httpx.Response, until: Callable[[dict[str, Any]], bool] | None = None
) -> Iterator[Frame]:
    """``(id, data)`` of each SSE frame; stops after a frame ``until`` accepts."""
    ident: int | None = None
    data: list[str] = []
    for line in resp.iter_lines():
        if line == "":
            if data:
                text = "\n".join(data)
                if text == "[DONE]":
                    return
                chunk = json.loads(text)
                yield ident, chunk
                if until is not None and until(chunk):
                    return
            ident, data = None, []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("id:"):
            ident = int(line[3:])


def ag_run(client: httpx.Client, sid: str, body: dict[str, Any]) -> list[Frame]:
    with client.stream("POST", f"/v1/sessions/{sid}/ag-ui", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        got = list(frames(resp))
    for _, event in got:
        EVENT.validate_python(event)  # the protocol's own models accept every event
    return got


def user_input(sid: str, run_id: str, text: str) -> dict[str, Any]:
    return {
        "threadId": sid,
        "runId": run_id,
        "messages": [{"id": f"u-{run_id}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("frontends"), APPROVAL_SCRIPT).start()
    yield d
    d.close()


def test_ag_ui_run_interrupts_for_approval_and_resumes(daemon: Daemon) -> None:
    sid = "ag1"
    with daemon.client() as c:
        first = ag_run(c, sid, user_input(sid, "run-1", "Deploy the site"))
        kinds = [e["type"] for _, e in first]
        assert kinds[0] == "RUN_STARTED" and first[0][1]["runId"] == "run-1"
        assert first[0][1]["threadId"] == sid
        finished = first[-1][1]
        assert finished["type"] == "RUN_FINISHED"
        assert finished["outcome"]["type"] == "interrupt"
        (interrupt,) = finished["outcome"]["interrupts"]
        assert interrupt["reason"] == "tool_approval"
        assert interrupt["toolCallId"] == "toolu_002_1"
        # The two safe tools ran and answered; the third waits.
        results = {e["toolCallId"] for _, e in first if e["type"] == "TOOL_CALL_RESULT"}
        assert results == {"toolu_001_1", "toolu_001_2"}
        for kind in ("STEP_STARTED", "TEXT_MESSAGE_CONTENT", "TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert kind in kinds

        # The same runId again (a client retry) replays the same run, not a new one.
        again = ag_run(c, sid, user_input(sid, "run-1", "Deploy the site"))
        assert [e for _, e in again] == [e for _, e in first]

        body = user_input(sid, "run-2", "Deploy the site")
        body["resume"] = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        second = ag_run(c, sid, body)
        assert second[0][1]["type"] == "RUN_STARTED" and second[0][1]["runId"] == "run-2"
        assert second[1][1]["type"] == "STATE_SNAPSHOT"
        # The continuation starts after the interrupt: nothing of the first response again.
        assert not {e.get("toolCallId") for _, e in second} & {"toolu_001_1", "toolu_001_2"}
        assert second[-1][1]["type"] == "RUN_FINISHED"
        assert second[-1][1]["outcome"] == {"type": "success"}
        assert second[-1][1]["result"]["final_text"] == "Deployed: all done."
        text = "".join(e["delta"] for _, e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "Deployed: all done."

        # The session's stream in AG-UI (replayed from the log) validates too, and its
        # ids are log positions.
        got: list[Frame] = []
        with c.stream("GET", f"/v1/sessions/{sid}/events?format=ag-ui") as resp:
            got = list(frames(resp, until=lambda e: e["type"] == "RUN_FINISHED"))
        for _, event in got:
            EVENT.validate_python(event)
        ids = [i for i, _ in got if i is not None]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert got[-1][1]["result"]["status"] == "completed"

        # Resuming from a log position gives exactly the frames after it.
        cut = ids[len(ids) // 2]
        with c.stream(
            "GET", f"/v1/sessions/{sid}/events?format=ag-ui", headers={"Last-Event-ID": str(cut)}
        ) as resp:
            rest = list(frames(resp, until=lambda e: e["type"] == "RUN_FINISHED"))
        position = next(n for n, (i, _) in enumerate(got) if i == cut)
        assert rest == got[position + 1 :]


def test_ag_ui_input_errors_are_clear(daemon: Daemon) -> None:
    with daemon.client() as c:
        resp = c.post("/v1/sessions/ag2/ag-ui", json={"threadId": "ag2"})
        assert resp.status_code == 400
        assert "RunAgentInput" in resp.json()["error"]["message"]
        resp = c.post("/v1/sessions/ag2/ag-ui", json=user_input("other", "r", "hi"))
        assert resp.status_code == 400 and resp.json()["error"]["field"] == "threadId"
        body = user_input("ag2", "r", "hi")
        body["resume"] = [{"interruptId": "nonsense", "status": "resolved"}]
        resp = c.post("/v1/sessions/ag2/ag-ui", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["field"] == "resume"


def chat_body(sid: str, message: dict[str, Any]) -> dict[str, Any]:
    return {"id": sid, "messages": [message], "trigger": "submit-message"}


def chat(client: httpx.Client, sid: str, body: dict[str, Any]) -> list[Frame]:
    with client.stream("POST", f"/v1/sessions/{sid}/chat", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["x-vercel-ai-ui-message-stream"] == "v1"
        return list(frames(resp))


def test_ai_sdk_chat_with_an_approval(daemon: Daemon) -> None:
    sid = "chat1"
    user = {"id": "m-1", "role": "user", "parts": [{"type": "text", "text": "Deploy"}]}
    with daemon.client() as c:
        first = chat(c, sid, chat_body(sid, user))
        chunks = [e for _, e in first]
        assert chunks[0]["type"] == "start"
        message_id = chunks[0]["messageId"]
        asks = [e for e in chunks if e["type"] == "tool-approval-request"]
        assert [a["toolCallId"] for a in asks] == ["toolu_002_1"]
        assert chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
        # Steps are balanced; text parts open and close.
        assert chunks.count({"type": "start-step"}) == chunks.count({"type": "finish-step"}) == 2
        opened = [e["id"] for e in chunks if e["type"] == "text-start"]
        closed = [e["id"] for e in chunks if e["type"] == "text-end"]
        assert opened == closed and len(opened) == 2

        # The browser retries the same message: the same reply again, no new input.
        assert [e for _, e in chat(c, sid, chat_body(sid, user))] == chunks
        assert len(c.get(f"/v1/sessions/{sid}").json()["done"]["inputs"]) == 0

        # Resume (GET) while it waits: the reply replayed from its start.
        with c.stream("GET", f"/v1/sessions/{sid}/chat/{sid}/stream") as resp:
            assert resp.status_code == 200
            assert [e for _, e in frames(resp)] == chunks

        # The approval, as useChat sends it: the assistant message, its tool part answered.
        answered = {
            "id": message_id,
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "deploy",
                    "toolCallId": "toolu_002_1",
                    "state": "approval-responded",
                    "input": {"target": "prod"},
                    "approval": {"id": asks[0]["approvalId"], "approved": True},
                }
            ],
        }
        second = [e for _, e in chat(c, sid, chat_body(sid, answered))]
        assert second[0] == {"type": "start", "messageId": message_id}
        outputs = [e for e in second if e["type"] == "tool-output-available"]
        assert [o["toolCallId"] for o in outputs] == ["toolu_002_1"]
        assert second[-1]["type"] == "finish" and second[-1]["finishReason"] == "stop"
        texts = "".join(e["delta"] for e in second if e["type"] == "text-delta")
        assert texts == "Deployed: all done."
        # Nothing from before the approval is sent twice.
        assert not [e for e in second if e["type"] == "tool-approval-request"]

        # Nothing in progress now: the resume route says so.
        assert c.get(f"/v1/sessions/{sid}/chat/{sid}/stream").status_code == 204

        # The next user message streams its own reply only, from its own submission on
        # (the script has no fourth reply, so that run fails: the stream says so).
        again = {"id": "m-2", "role": "user", "parts": [{"type": "text", "text": "Again"}]}
        third = [e for _, e in chat(c, sid, chat_body(sid, again))]
        assert third[0]["type"] == "start" and third[0]["messageId"] != message_id
        assert not [e for e in third if e["type"].startswith(("text-", "tool-"))]
        (error,) = [e for e in third if e["type"] == "error"]
        assert "none for turn 4" in error["errorText"]  # it saw the three turns before
        assert third[-1]["type"] == "finish" and third[-1]["finishReason"] == "error"


def test_ai_sdk_chat_errors_are_clear(daemon: Daemon) -> None:
    with daemon.client() as c:
        resp = c.post("/v1/sessions/chat2/chat", json={"messages": []})
        assert resp.status_code == 400 and resp.json()["error"]["field"] == "messages"
        user = {"id": "x", "role": "user", "parts": [{"type": "file", "url": "data:,"}]}
        resp = c.post("/v1/sessions/chat2/chat", json=chat_body("chat2", user))
        assert resp.status_code == 400 and "text" in resp.json()["error"]["message"]
        resp = c.get("/v1/sessions/chat2/events?format=xml")
        assert resp.status_code == 400 and resp.json()["error"]["field"] == "format"


def test_ag_ui_denial_and_ai_sdk_view_of_the_same_session(daemon: Daemon) -> None:
    sid = "ag3"
    with daemon.client() as c:
        first = ag_run(c, sid, user_input(sid, "deny-1", "Deploy"))
        (interrupt,) = first[-1][1]["outcome"]["interrupts"]
        body = user_input(sid, "deny-2", "Deploy")
        body["resume"] = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": False}}
        ]
        second = ag_run(c, sid, body)
        result = next(e for _, e in second if e["type"] == "TOOL_CALL_RESULT")
        assert result["toolCallId"] == interrupt["toolCallId"]
        assert second[-1][1]["type"] == "RUN_FINISHED"
        tasks = {t["call_id"]: t for t in c.get(f"/v1/sessions/{sid}").json()["tasks"]}
        assert tasks[interrupt["toolCallId"]]["phase"] == "completed"
        # The same session read as an AI SDK stream: the denial is tool-output-denied.
        with c.stream("GET", f"/v1/sessions/{sid}/events?format=ai-sdk&live=0") as resp:
            chunks = [e for _, e in frames(resp)]
        denied = [e for e in chunks if e["type"] == "tool-output-denied"]
        assert [d["toolCallId"] for d in denied] == [interrupt["toolCallId"]]
        assert chunks[-1]["type"] == "finish" and chunks[-1]["finishReason"] == "stop"


def test_the_ag_ui_snapshot_is_the_summary_s_headline_read_from_the_view() -> None:
    """AG-UI's shared state reads the session's ``SessionView`` (no summary is made per
    answer); what it shows is what ``GET /v1/sessions/{id}`` says of the same session,
    cost included (a priced model, an unpriced one), pause and parking too."""
    from perdure.actors import protocol
    from perdure.actors.readmodel import StateLookup
    from perdure.budget import Price
    from perdure.inspect import summarize
    from perdure.server.frontends import _snapshot
    from perdure.storage.records import Usage
    from tests.core.sim import Session

    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.command(protocol.Pause("p1"))
    state = s.state
    state.spend = {
        "claude-sonnet-4": Usage(input_tokens=1000, output_tokens=200),
        "no-such-model": Usage(input_tokens=5),
    }
    state.usage = Usage(input_tokens=1005, output_tokens=200)
    state.parked = "crashed 3 times"
    # The runtime's own prices (open_runtime(prices=)), as the summary takes them.
    prices = {"claude-sonnet-4": Price(input=2.0, output=10.0)}
    summary = summarize(state, prices)
    snapshot = _snapshot(StateLookup(state), prices)
    keys = ("session_id", "paused", "parked", "usage", "cost")
    assert list(snapshot) == list(keys)
    assert snapshot == {key: summary[key] for key in keys}
    assert snapshot["cost"]["unpriced_models"] == ["no-such-model"] and snapshot["paused"]
    assert snapshot["cost"]["usd"] == (1000 * 2.0 + 200 * 10.0) / 1e6
