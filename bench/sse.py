"""Streaming over the daemon: N Server-Sent Event clients follow one session.

    python bench/sse.py WORKDIR SUBSCRIBERS K

Starts a real ``perdure serve`` (scripted model, the benchmark's ``lookup`` tool),
connects SUBSCRIBERS clients to one session's event stream, then runs a K-turn
task. For every committed record each client receives, the delay is the client's
wall clock at arrival minus the record's ``at`` (the moment its decision was
taken, just before its commit): commit + fan-out + HTTP, as a frontend sees it.
Prints one JSON line: p50/p99 in ms, deliveries, subscribers.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import workload  # noqa: E402

_LISTENING = re.compile(r"listening on (http://\S+)")


def script(k: int) -> list[dict[str, Any]]:
    turn = {
        "text": workload.REPLY_TEXT,
        "tool_uses": [{"name": workload.TOOL_NAME, "input": dict(workload.TOOL_ARGS)}],
    }
    return [dict(turn) for _ in range(k)] + [{"text": workload.FINAL_TEXT}]


def start_daemon(workdir: Path, k: int) -> tuple[subprocess.Popen[str], str, str]:
    (workdir / "script.json").write_text(json.dumps({"replies": script(k)}))
    token = "bench-token"
    (workdir / "token").write_text(token)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERDURE_FAULT", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perdure.cli",
            "serve",
            "--log",
            str(workdir / "log"),
            "--port",
            "0",
            "--provider",
            f"scripted:{workdir / 'script.json'}",
            "--tools",
            "bench.agent:lookup",
            "--token-file",
            str(workdir / "token"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        found = _LISTENING.search(line)
        if found:
            return proc, found.group(1), token
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("perdure serve did not start")


_AT = re.compile(rb'"at":([0-9.eE+-]+)')


async def follow(
    host: str,
    port: int,
    token: str,
    sid: str,
    delays: list[float],
    connected: trio.Semaphore,
) -> None:
    """A lean SSE client (raw socket, chunked decoding, a regex for ``at``) so that the
    measuring side adds as little as possible to what it measures."""
    stream = await trio.open_tcp_stream(host, port)
    request = (
        f"GET /v1/sessions/{sid}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    )
    async with stream:
        await stream.send_all(request.encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += await stream.receive_some(65536)
        _, raw = raw.split(b"\r\n\r\n", 1)
        connected.release()
        payload = b""
        while True:
            # De-chunk what we have: size line, data, CRLF.
            while True:
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(raw[:line_end].split(b";")[0] or b"0", 16)
                if len(raw) < line_end + 2 + size + 2:
                    break
                payload += raw[line_end + 2 : line_end + 2 + size]
                raw = raw[line_end + 2 + size + 2 :]
                if size == 0:
                    return
            *frames, payload = payload.split(b"\n\n")
            now = time.time()
            for frame in frames:
                if frame.startswith(b"id:"):
                    found = _AT.search(frame)
                    if found:
                        delays.append(now - float(found.group(1)))
                    if b"event: RunFinished" in frame:
                        return
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            raw += chunk


async def measure(url: str, token: str, subscribers: int, k: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    host, port = url.removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        sid = (await client.post("/v1/sessions", json={"session_id": "sse"})).json()["session_id"]
        delays: list[float] = []
        connected = trio.Semaphore(0, max_value=subscribers)
        async with trio.open_nursery() as nursery:
            for _ in range(subscribers):
                nursery.start_soon(follow, host, int(port), token, sid, delays, connected)
            for _ in range(subscribers):
                await connected.acquire()
            await trio.sleep(0.5)  # replayed history is not part of the measurement
            delays.clear()
            resp = await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "go", "request_id": "bench"}
            )
            assert resp.status_code == 202, resp.text
    ms = sorted(d * 1000 for d in delays)
    return {
        "subscribers": subscribers,
        "k": k,
        "deliveries": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "measure": "record decision -> SSE client (commit + fan-out + HTTP)",
    }


def main() -> None:
    workdir, subscribers, k = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    workdir.mkdir(parents=True, exist_ok=True)
    proc, url, token = start_daemon(workdir, k)
    try:
        result = trio.run(measure, url, token, subscribers, k)
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
