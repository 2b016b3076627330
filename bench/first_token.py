"""Time to first token at the browser: what ``perdure serve`` adds to a model's first token.

    python bench/first_token.py WORKDIR TRIALS [--think-ms 50] [--warmup 3]

One fake Anthropic Messages API (``tests/fake_anthropic.py``: a real HTTP server in a
thread of this process, spoken to by the real ``anthropic`` SDK) streams every answer:
its head (``message_start``, a ping, the text block's start) at once, then, after
``--think-ms``, the first token, whose text is the wall-clock time at which the fake
wrote it (``@<time.time()>@``), then the rest of the answer a few ms apart, as a model
trickles it.

Two servers stream that same model to a lean SSE client (a raw socket, a regex: the
``bench/sse.py`` kind) in this process, one machine, one clock:

* ``perdure``: a real ``perdure serve`` (``--provider anthropic`` pointed at the fake).
  The client follows the session's event stream (``GET /v1/sessions/ID/events``, as
  the web page does) and each trial posts a message; the first token comes as a
  ``text_delta`` event, after the SDK's parse, the generation actor, the bus and the
  stream's encoding.
* ``bare``: Hypercorn's trio worker with a bare ASGI app (``python bench/first_token.py
  bare``) that calls the same model through the same SDK (``messages.stream``) and
  writes each text delta to its response as an SSE frame: what an application without
  perdure would serve. The client asks it once per trial.

A trial's figure is the client's arrival time of the frame holding the first token
minus the time written in it. The arms alternate trial by trial (ABBA), so a noisy
neighbour hurts both alike; each arm's first ``--warmup`` trials are not counted.
Prints one JSON line: per arm the p50 / p99 / mean and every trial (ms), the ratio of
the p50s and the difference, the load average before and after, and the share of the
time tasks stalled for CPU (Linux PSI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import server_env, start_serve, wait_listening  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, Reply, Text, stream_events  # noqa: E402
from tests.support.fake_vendor import Received, Wire, sse  # noqa: E402

# The first token in a text delta's frame (both servers name it so). Only there: the
# committed records that follow (the reply, the run's end) hold the whole text, stamp
# included, and a later trial must not read a stale stamp from them.
_STAMP = re.compile(rb"event: text_delta\r?\ndata: [^\n]*?@(\d+\.\d+)@")
_RUN_FINISHED = re.compile(rb"event: RunFinished\r?\n(?:[^\n]+\n)*\n")  # the whole frame
_ANSWER = "The first token is a time stamp; the rest of the answer follows it in pieces."
_PAUSE = 0.002  # between the pieces after the first token


# -- the model ------------------------------------------------------------------------------


class _StampedFrames(Sequence[bytes]):
    """The frames of one streamed answer: the head at once, then, ``think`` seconds
    later, the first token stamped with the moment it is written, then the rest."""

    def __init__(self, frames: list[bytes], think: float) -> None:
        self.frames = frames
        self.think = think

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, index: Any) -> Any:
        return self.frames[index]

    def __iter__(self) -> Iterator[bytes]:
        stamped = False
        for frame in self.frames:
            if not stamped and b'"text_delta"' in frame:
                time.sleep(self.think)
                stamped = True
                delta = {"type": "text_delta", "text": f"@{time.time():.6f}@ "}
                # Written by the fake's handler right after this yield: the stamp is
                # taken a few microseconds before the bytes go into the socket.
                data = {"type": "content_block_delta", "index": 0, "delta": delta}
                yield sse(data, "content_block_delta")
                continue
            if stamped:
                time.sleep(_PAUSE)
            yield frame


class StampingModel(FakeAnthropic):
    """The fake Anthropic API whose every streamed answer carries its first token's time."""

    thread_name = "first-token-model"

    def __init__(self, think: float) -> None:
        super().__init__(default=Reply(content=[Text(_ANSWER)], chunk=12, ping=True))
        self.think = think

    def respond(self, wire: Wire, received: Received, action: Any, n: int) -> None:
        if not received.body.get("stream") or not isinstance(action, Reply):
            super().respond(wire, received, action, n)
            return
        model = str(received.body.get("model", "claude-fake"))
        frames = [sse(data, name) for name, data in stream_events(action, f"msg_{n}", model)]
        wire.stream(_StampedFrames(frames, self.think), {"request-id": f"req_{n}"}, action)


# -- the bare server (a child process) ---------------------------------------------------------


def bare_app() -> Any:
    """An ASGI app: ``GET /stream`` calls the model through the SDK and forwards each
    text delta as an SSE frame, nothing else (no framework, no log)."""
    import anthropic

    client = anthropic.AsyncAnthropic(max_retries=0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        async with client.messages.stream(
            model="claude-fake",
            max_tokens=1024,
            messages=[{"role": "user", "content": "go"}],
        ) as stream:
            async for text in stream.text_stream:
                frame = f"event: text_delta\ndata: {json.dumps({'text': text})}\n\n"
                await send(
                    {"type": "http.response.body", "body": frame.encode(), "more_body": True}
                )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def serve_bare() -> None:
    import logging

    import hypercorn.trio
    from hypercorn.config import Config

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("bench.first_token")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn.trio.serve, bare_app(), config)
            print(f"listening on {binds[0]}", flush=True)

    trio.run(main)


# -- starting the servers ----------------------------------------------------------------------


def _env(model_url: str) -> dict[str, str]:
    return server_env(ANTHROPIC_API_KEY="sk-ant-bench", ANTHROPIC_BASE_URL=model_url)


def start_perdure(workdir: Path, model_url: str) -> tuple[subprocess.Popen[str], str, str]:
    provider = ["--provider", "anthropic", "--model", "claude-fake"]
    return start_serve(workdir, provider, _env(model_url))


def start_bare(model_url: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "bare"],
        cwd=ROOT,
        env=_env(model_url),
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, wait_listening(proc, "the bare server")


# -- the client ------------------------------------------------------------------------------


class Reader:
    """A lean reader of one HTTP response's bytes (raw socket, regexes, no parser)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def until(self, pattern: re.Pattern[bytes]) -> tuple[re.Match[bytes], float]:
        """The first match of ``pattern`` in what comes next, and when its bytes came;
        what precedes it is dropped."""
        while True:
            found = pattern.search(self.buffer)
            if found is not None:
                self.buffer = self.buffer[found.end() :]
                return found, time.time()
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise SystemExit("a server closed the stream before the first token")
            self.buffer += chunk


async def _connect(url: str, request: str) -> Reader:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(request.format(host=host).encode())
    reader = Reader(stream)
    await reader.until(re.compile(rb"\r\n\r\n"))  # the response's head
    return reader


async def perdure_trial(
    http: httpx.AsyncClient, reader: Reader, i: int, results: list[float]
) -> None:
    """Post a message; time its first token on the event stream; wait for the run's end."""
    body = {"text": f"go {i}", "request_id": f"r{i}"}
    sent = await http.post("/v1/sessions/ttft/messages", json=body)
    assert sent.status_code == 202, sent.text
    found, arrived = await reader.until(_STAMP)
    results.append((arrived - float(found.group(1))) * 1e3)
    await reader.until(_RUN_FINISHED)  # idle again for the next


async def bare_trial(url: str, results: list[float]) -> None:
    reader = await _connect(url, "GET /stream HTTP/1.1\r\nHost: {host}\r\n\r\n")
    async with reader.stream:
        found, arrived = await reader.until(_STAMP)
        results.append((arrived - float(found.group(1))) * 1e3)
        await reader.until(re.compile(rb"\r\n0\r\n\r\n"))  # the response's end


# -- the measurement ---------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _psi_cpu() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return float(line.rsplit("total=", 1)[1])
    return None


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "p50_ms": _pct(values, 0.5),
        "p99_ms": _pct(values, 0.99),
        "mean_ms": statistics.fmean(values),
        "min_ms": min(values),
        "trials_ms": [round(v, 3) for v in values],
    }


async def measure(workdir: Path, trials: int, think: float, warmup: int) -> dict[str, Any]:
    with StampingModel(think) as model:
        daemon, url, token = start_perdure(workdir, model.url)
        bare, bare_url = start_bare(model.url)
        try:
            got: dict[str, list[float]] = {"perdure": [], "bare": []}
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
                created = await http.post("/v1/sessions", json={"session_id": "ttft"})
                created.raise_for_status()
                reader = await _connect(
                    url,
                    "GET /v1/sessions/ttft/events HTTP/1.1\r\nHost: {host}\r\n"
                    f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n",
                )
                async with reader.stream:
                    load_before, psi_before = os.getloadavg(), _psi_cpu()
                    started = time.perf_counter()
                    for i in range(warmup + trials):
                        # ABBA: each arm goes first every other trial.
                        if i % 2 == 0:
                            await perdure_trial(http, reader, i, got["perdure"])
                            await bare_trial(bare_url, got["bare"])
                        else:
                            await bare_trial(bare_url, got["bare"])
                            await perdure_trial(http, reader, i, got["perdure"])
                    wall = time.perf_counter() - started
                    load_after, psi_after = os.getloadavg(), _psi_cpu()
        finally:
            for proc in (daemon, bare):
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    ours, theirs = got["perdure"][warmup:], got["bare"][warmup:]
    result: dict[str, Any] = {
        "trials": trials,
        "warmup": warmup,
        "think_ms": think * 1e3,
        "measure": "model writes its first token -> an SSE client has the frame holding it",
        "perdure": _summary(ours),
        "bare": _summary(theirs),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    result["p50_ratio"] = result["perdure"]["p50_ms"] / result["bare"]["p50_ms"]
    result["p99_ratio"] = result["perdure"]["p99_ms"] / result["bare"]["p99_ms"]
    result["added_p50_ms"] = result["perdure"]["p50_ms"] - result["bare"]["p50_ms"]
    result["added_p99_ms"] = result["perdure"]["p99_ms"] - result["bare"]["p99_ms"]
    if psi_before is not None and psi_after is not None:
        result["cpu_pressure"] = round((psi_after - psi_before) / 1e6 / wall, 3)
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["bare"]:
        serve_bare()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("trials", type=int)
    parser.add_argument("--think-ms", type=float, default=50.0, help="before the first token")
    parser.add_argument("--warmup", type=int, default=3, help="uncounted trials per arm")
    opts = parser.parse_args(args)
    if opts.trials < 1:
        raise SystemExit("trials must be 1 or more")
    opts.workdir.mkdir(parents=True, exist_ok=True)
    if (opts.workdir / "log").exists():
        raise SystemExit(f"{opts.workdir} holds a log already: give an empty directory")
    result = trio.run(measure, opts.workdir, opts.trials, opts.think_ms / 1e3, opts.warmup)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
