"""A FastAPI service that embeds perdure (``perdure.embed``) and survives ``kill -9``.

    python examples/fastapi_app.py                        # the demo below
    FASTAPI_APP_DIR=/tmp/app uvicorn fastapi_app:app --app-dir examples   # the service

The service: ``POST /tasks`` starts a task (a session and its first input),
``GET /tasks/{id}/events`` streams its events to the browser as Server-Sent
Events (``Last-Event-ID`` resumes), ``POST /tasks/{id}/approvals/{call_id}``
approves a call, ``GET /tasks/{id}`` shows its state. The runtime lives in the
app's lifespan: it opens (and recovers every interrupted run) before uvicorn
serves the first request, and on shutdown lets running tools finish. The model
is scripted, so no API key is needed; the tools are trio code, as always.

The demo starts the service under uvicorn, posts a task, follows its events and
``kill -9``s uvicorn while a tool runs. The restarted service continues the run by
itself (no request is re-sent); the demo reconnects with ``Last-Event-ID``,
approves the report when asked, and checks the report was sent exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

import perdure
import perdure.embed
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

HERE = Path(__file__).resolve().parent
TASK = "Check the forecast for Paris and send the team a short report."

# -- the tools (trio code, run by the runtime) -----------------------------------------------


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def fetch_forecast(ctx: perdure.ToolContext, city: str) -> str:
    """Fetch the weather forecast for a city (read-only: safe to re-run)."""
    await trio.sleep(1.5)  # a slow service: the demo kills uvicorn meanwhile
    return f"{city}: sunny, 21°C"


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, requires_approval=True)
async def send_report(ctx: perdure.ToolContext, to: str, text: str) -> str:
    """Send a report (an effect that must not happen twice; a person approves it)."""
    assert ctx.workspace is not None
    async with await trio.Path(ctx.workspace / "outbox.txt").open("a") as outbox:
        await outbox.write(f"to {to}: {text}\n")
    return f"sent to {to}"


SCRIPT = [
    Reply(
        text="Let me check the forecast first.",
        tool_uses=[ToolUse("fetch_forecast", {"city": "Paris"})],
    ),
    Reply(
        text="Sending the report to the team.",
        tool_uses=[ToolUse("send_report", {"to": "team", "text": "Paris: sunny, 21°C"})],
    ),
    Reply(text="Done: Paris will be sunny at 21°C, and the team has the report."),
]

# -- the service ------------------------------------------------------------------------------


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state = Path(os.environ.get("FASTAPI_APP_DIR", ".perdure-fastapi"))
    (state / "workspace").mkdir(parents=True, exist_ok=True)
    async with perdure.embed.open_runtime(
        state / "log",
        provider=ScriptedProvider(SCRIPT),
        tools=[fetch_forecast, send_report],
        workspace=state / "workspace",
    ) as rt:
        app.state.rt = rt
        yield


app = FastAPI(title="perdure in FastAPI", lifespan=lifespan)


@app.exception_handler(perdure.Refused)
async def refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, perdure.Refused)
    status = 404 if exc.code == "not_found" else 409
    return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=status)


class TaskIn(BaseModel):
    text: str
    session_id: str | None = None
    request_id: str | None = None  # the same id again gets the same answer


class ApprovalIn(BaseModel):
    approved: bool = True
    request_id: str | None = None


def runtime(request: Request) -> perdure.embed.AsyncioRuntime:
    rt: perdure.embed.AsyncioRuntime = request.app.state.rt
    return rt


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/tasks", status_code=202)
async def post_task(task: TaskIn, request: Request) -> dict[str, Any]:
    rt = runtime(request)
    sid = await rt.create_session(task.session_id)
    accepted = await rt.submit(sid, task.text, request_id=task.request_id)
    return {"session_id": sid, **attrs.asdict(accepted)}


@app.get("/tasks/{session_id}")
async def get_task(session_id: str, request: Request) -> dict[str, Any]:
    return await runtime(request).summary(session_id, wake=False)


@app.post("/tasks/{session_id}/approvals/{call_id}")
async def approve(
    session_id: str, call_id: str, body: ApprovalIn, request: Request
) -> dict[str, Any]:
    rt = runtime(request)
    done = await rt.approve(session_id, call_id, approved=body.approved, request_id=body.request_id)
    return attrs.asdict(done)


@app.get("/tasks/{session_id}/events")
async def events(session_id: str, request: Request) -> StreamingResponse:
    rt = runtime(request)
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not raw.isdigit():
        raise HTTPException(400, "Last-Event-ID must be a sequence number")
    if await rt.session_info(session_id) is None:
        raise HTTPException(404, f"no task {session_id!r}")
    stream = rt.events(session_id, after=int(raw), restarts=True)

    async def frames() -> AsyncIterator[bytes]:
        try:
            async for event in stream:
                if event.seq is None:  # a live-only event (a text delta): no id
                    data = {"type": event.kind, "data": event.data}
                    yield f"event: {event.kind}\ndata: {json.dumps(data)}\n\n".encode()
                    continue
                record = attrs.asdict(event.record) if event.record is not None else {}
                data = {"seq": event.seq, "type": event.kind, "record": record}
                body = json.dumps(data, default=str)
                yield f"id: {event.seq}\nevent: {event.kind}\ndata: {body}\n\n".encode()
        finally:
            await stream.aclose()

    return StreamingResponse(frames(), media_type="text/event-stream")


# -- the demo: serve, kill -9 mid-tool, restart ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Service:
    """``uvicorn fastapi_app:app`` as a child process."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, FASTAPI_APP_DIR=str(self.state))
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(HERE)),
                *("--port", str(self.port), "--log-level", "warning"),
            ],
            env=env,
        )
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # uvicorn serves once the runtime recovered
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the service did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def sse(client: Any, session_id: str, last_id: int) -> Iterator[tuple[int | None, str, Any]]:
    """(id, event type, data) from the task's stream, resuming after ``last_id``."""
    headers = {"Last-Event-ID": str(last_id)}
    with client.stream("GET", f"/tasks/{session_id}/events", headers=headers) as resp:
        resp.raise_for_status()
        ident, kind, data = None, "message", ""
        for line in resp.iter_lines():
            if not line:
                if data:
                    yield ident, kind, json.loads(data)
                ident, kind, data = None, "message", ""
            elif line.startswith("id: "):
                ident = int(line[4:])
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = line[6:]


def main() -> int:
    import httpx

    root = Path(tempfile.mkdtemp(prefix="perdure-fastapi-"))
    service = Service(root)
    try:
        print("1) start the FastAPI service under uvicorn")
        service.start()
        client = httpx.Client(base_url=service.url, timeout=httpx.Timeout(30, read=60))
        task = {"text": TASK, "session_id": "weather", "request_id": "weather-1"}
        first = client.post("/tasks", json=task).json()
        print(f"2) task accepted (durably) as {first['submission_id']}, record {first['seq']}")
        last_id, killed, final = 0, False, None
        while final is None:
            try:
                for ident, kind, data in sse(client, "weather", last_id):
                    last_id = ident if ident is not None else last_id
                    record = data.get("record", {})
                    if kind == "GenerationCompleted":
                        print(record["text"])
                    elif kind == "ToolExecuting":
                        print(f"   tool {record['tool_name']} is executing")
                        if not killed:
                            print("3) kill -9 the uvicorn process while the tool runs")
                            service.kill()
                            killed = True
                    elif kind == "LogOpened":
                        print(f"   -- the service restarted (epoch {record['epoch']}) --")
                    elif kind == "RecoveryDecision":
                        print(f"   recovery: found {record['found']} -> {record['action']}")
                    elif kind == "ToolAwaitingApproval":
                        print(f"   {record['call_id']} awaits approval: approve it")
                        done = client.post(f"/tasks/weather/approvals/{record['call_id']}", json={})
                        assert done.status_code == 200, done.text
                    elif kind == "ToolCompleted":
                        print(f"   tool result: {record['output']}")
                    elif kind == "RunFinished" and record["status"] != "interrupted":
                        final = record
                        break
            except httpx.TransportError:
                if not killed or service.proc is None or service.proc.poll() is None:
                    raise
                print(f"4) the stream broke at record {last_id}; restart the service")
                service.start()
                print(f"5) reconnect with Last-Event-ID: {last_id} (no new request is sent)")
        again = client.post("/tasks", json=task).json()
        assert again == {**first, "duplicate": True}, again
        print("6) posting the task again with the same request_id returns the same answer")
        outbox = (root / "workspace" / "outbox.txt").read_text().splitlines()
        print(f"   the report was sent {len(outbox)} time(s)")
        print(f"final answer ({final['status']}): {final['final_text']}")
        client.close()
        # uvicorn re-raises SIGTERM once its graceful shutdown (lifespan included) is done.
        code = service.stop()
        print(f"service stopped by SIGTERM (exit code {code})")
        ok = final["status"] == "completed" and len(outbox) == 1 and code in (0, -signal.SIGTERM)
        return 0 if ok else 1
    finally:
        if service.proc is not None and service.proc.poll() is None:
            service.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
