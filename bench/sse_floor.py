"""The floor of SSE fan-out: one event to N clients through bare Hypercorn, and through perdure.

    python bench/sse_floor.py WORKDIR {hypercorn,perdure} CLIENTS BURSTS

N ``curl`` processes follow one stream each; then BURSTS times, one ephemeral
event (a ~400-byte frame) is handed to every client at once, and the next burst
waits until the previous one has reached every socket, so bursts never overlap.

``hypercorn``: a bare ASGI app on Hypercorn's trio worker whose responses only
forward the bytes handed to them (a list and a parking lot per response, no
framework): what the HTTP stack itself costs per client and per write, the floor
of any daemon built on it. ``perdure``: the daemon's own app (``create_app`` over
a real runtime on LMDB) and the event published on the runtime's bus: the same
work plus perdure's stream pump, encoding and middleware.

Per burst: when the first, the median and the last client's bytes went into their
sockets (``send_all``), after the hand-over; and the server thread's CPU per
write. Prints one JSON line of the medians over the bursts.
"""

from __future__ import annotations

import bisect
import json
import logging
import resource
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, cast

import hypercorn.trio
import trio
from hypercorn.config import Config
from hypercorn.typing import ASGIFramework
from starlette.types import Message, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SENDS: list[float] = []  # when each send_all of the server began
_WAITING: list[tuple[int, trio.Event]] = []  # (count of sends, set once reached)


def stamp_sends() -> None:
    send_all = trio.SocketStream.send_all

    async def stamped(self: trio.SocketStream, data: Any) -> None:
        SENDS.append(time.time())
        if _WAITING and len(SENDS) >= _WAITING[0][0]:
            _WAITING.pop()[1].set()
        await send_all(self, data)

    trio.SocketStream.send_all = stamped  # type: ignore[method-assign]


async def sent(count: int) -> None:
    """Wait until the server has begun ``count`` sends since the last ``SENDS.clear()``."""
    if len(SENDS) < count:
        reached = trio.Event()
        _WAITING.append((count, reached))
        await reached.wait()


def start_curls(url: str, auth: list[str], clients: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(["curl", "-sN", *auth, url], stdout=subprocess.DEVNULL)
        for _ in range(clients)
    ]


class Forwarder:
    """The bare app: each response forwards whatever ``publish`` handed it."""

    def __init__(self) -> None:
        self.responses: list[tuple[list[bytes], trio.lowlevel.ParkingLot]] = []

    def publish(self, frame: bytes) -> None:
        for queue, ready in self.responses:
            queue.append(frame)
            if ready:
                ready.unpark_all()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        start: Message = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
        await send(start)
        await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
        queue: list[bytes] = []
        ready = trio.lowlevel.ParkingLot()
        self.responses.append((queue, ready))

        async def forward() -> None:
            while True:
                if not queue:
                    await ready.park()
                chunk = b"".join(queue)
                queue.clear()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward)
            while (await receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()


async def measure(
    workdir: Path, server: str, clients: int, bursts: int
) -> dict[str, float | int | str]:
    frame_data = {"text": "x" * 300}
    closing = trio.Event()
    async with trio.open_nursery() as nursery:
        runtime_cm: Any = None
        if server == "hypercorn":
            forwarder = Forwarder()
            app = cast(ASGIFramework, forwarder)
            path, auth = "/", []
            payload = json.dumps({"type": "text_delta", "session_id": "s", "data": frame_data})
            frame = f"event: text_delta\ndata: {payload}\n\n".encode()

            def publish(i: int) -> None:
                forwarder.publish(frame)

            def subscribed() -> int:
                return len(forwarder.responses)
        else:
            from perdure import open_runtime
            from perdure.providers.scripted import ScriptedProvider
            from perdure.server.app import create_app
            from perdure.storage.bus import Event

            runtime_cm = open_runtime(workdir / "log", provider=ScriptedProvider([]))
            rt = await runtime_cm.__aenter__()
            await rt.create_session("s")
            app = cast(ASGIFramework, create_app(rt, token="floor", closing=closing))
            path, auth = "/v1/sessions/s/events", ["-H", "Authorization: Bearer floor"]
            bus = rt._journal.bus

            def publish(i: int) -> None:
                bus.publish(Event("s", "text_delta", data=dict(frame_data, i=i)))

            def subscribed() -> int:
                return len(bus.subscriptions())

        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = logging.getLogger("bench.sse_floor")
        serving = partial(hypercorn.trio.serve, app, config, shutdown_trigger=closing.wait)
        binds: list[str] = await nursery.start(serving)
        curls = start_curls(binds[0] + path, auth, clients)
        try:
            with trio.fail_after(60):
                # Nothing to wait on but the server's own count of open streams.
                while subscribed() < clients:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            SENDS.clear()
            handed: list[float] = []
            cpu = time.thread_time()
            before = resource.getrusage(resource.RUSAGE_THREAD)
            for i in range(bursts):
                handed.append(time.time())
                publish(i)
                with trio.fail_after(60):
                    await sent(clients * (i + 1))
                await trio.sleep(0.005)
            cpu = time.thread_time() - cpu
            after = resource.getrusage(resource.RUSAGE_THREAD)
        finally:
            closing.set()
            for curl in curls:
                curl.kill()
                curl.wait()
            if runtime_cm is not None:
                await runtime_cm.__aexit__(None, None, None)
    first, middle, last = [], [], []
    for i, t in enumerate(handed):
        end = handed[i + 1] if i + 1 < len(handed) else float("inf")
        mine = SENDS[bisect.bisect_left(SENDS, t) : bisect.bisect_left(SENDS, end)]
        first.append((mine[0] - t) * 1e3)
        middle.append((statistics.median(mine) - t) * 1e3)
        last.append((mine[-1] - t) * 1e3)
    writes = clients * bursts
    return {
        "server": server,
        "clients": clients,
        "bursts": bursts,
        "first_client_ms": statistics.median(first),
        "median_client_ms": statistics.median(middle),
        "last_client_ms": statistics.median(last),
        "cpu_us_per_write": cpu / writes * 1e6,
        "user_cpu_us_per_write": (after.ru_utime - before.ru_utime) / writes * 1e6,
    }


def main() -> None:
    workdir, server = Path(sys.argv[1]), sys.argv[2]
    clients, bursts = int(sys.argv[3]), int(sys.argv[4])
    if server not in ("hypercorn", "perdure"):
        raise SystemExit("the server is hypercorn or perdure")
    workdir.mkdir(parents=True, exist_ok=True)
    stamp_sends()
    print(json.dumps(trio.run(measure, workdir, server, clients, bursts)))


if __name__ == "__main__":
    main()
