"""``perdure serve`` with server-side timestamps, for ``bench/sse.py --probe``.

    python bench/sse_probe.py OUT.json serve --log ... (the ``perdure`` command line)

Runs the ordinary command line in this process after wrapping four places of the
daemon, each of which stamps the wall clock (the clock of a record's ``at``):

``durable``    the log backend's commit returned, on the Journal's writer thread
``published``  the trio thread handed the record to the EventBus (``EventBus.publish``);
               the record's ``at`` is kept with it
``handed``     an SSE response passed a chunk holding the record's frame to the ASGI
               ``send`` (per connection: the pump has done its part)
``written``    Hypercorn calls ``send_all`` with the bytes holding that frame (per
               connection: the system call that puts them in the socket buffer)

Connections are named by the client's port, so ``sse.py`` joins these stamps with
its clients' arrival times. The stamps are written to OUT.json when the daemon exits
(it stops on SIGTERM). This is a benchmark's instrument, kept out of the product: it
wraps private methods and keeps a reference to every chunk it sees.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import trio
from starlette.types import Message

from perdure.server.streams import EventStreamResponse
from perdure.storage.bus import Event, EventBus
from perdure.storage.journal import Journal

_FRAME_ID = re.compile(rb"(?:^|\n)id: (\d+)\n")

durable: dict[int, float] = {}
published: dict[int, float] = {}
at: dict[int, float] = {}  # the record's decision time, for clients that time nothing
# While the daemon runs, only (time, bytes) per connection: the frames' ids are
# found at exit, so that the probe adds little to what it measures.
handed_raw: dict[int, list[tuple[float, bytes]]] = {}  # client port -> stamps
written_raw: dict[int, list[tuple[float, bytes]]] = {}  # client port -> stamps
_ports: dict[trio.SocketStream, int] = {}  # one getpeername per connection


def _seqs(chunk: bytes) -> list[int]:
    return [int(found) for found in _FRAME_ID.findall(chunk)]


def install() -> None:
    commit = Journal._commit

    def timed_commit(self: Journal, requests: list[Any]) -> tuple[list[Any], float, float]:
        results, took, waited = commit(self, requests)
        now = time.time()
        for result in results:
            if isinstance(result, list):
                for c in result:
                    durable[c.seq] = now
        return results, took, waited

    Journal._commit = timed_commit  # type: ignore[method-assign]

    publish = EventBus.publish

    def timed_publish(self: EventBus, event: Event) -> None:
        if event.seq is not None:
            published.setdefault(event.seq, time.time())
            decided = getattr(event.record, "at", None)
            if isinstance(decided, float):
                at[event.seq] = decided
        publish(self, event)

    EventBus.publish = timed_publish  # type: ignore[method-assign]

    respond = EventStreamResponse.__call__

    async def timed_response(
        self: EventStreamResponse, scope: Any, receive: Any, send: Any
    ) -> None:
        stamps = handed_raw.setdefault(scope["client"][1], [])

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                stamps.append((time.time(), message.get("body", b"")))
            await send(message)

        await respond(self, scope, receive, timed_send)

    EventStreamResponse.__call__ = timed_response  # type: ignore[method-assign]

    send_all = trio.SocketStream.send_all

    async def timed_send_all(self: trio.SocketStream, data: Any) -> None:
        # Stamped before the call: trio's send makes the system call at once and only
        # then yields, so a stamp after the await would also count the wait to be
        # scheduled again (by then the client may have read the bytes already).
        now = time.time()
        port = _ports.get(self)
        if port is None:
            port = _ports[self] = self.socket.getpeername()[1]
        written_raw.setdefault(port, []).append((now, data))
        await send_all(self, data)

    trio.SocketStream.send_all = timed_send_all  # type: ignore[method-assign]


def _by_seq(stamps: list[tuple[float, bytes]]) -> list[tuple[int, float]]:
    return [(seq, t) for t, data in stamps for seq in _seqs(bytes(data))]


def dump(out: Path) -> None:
    out.write_text(
        json.dumps(
            {
                "durable": durable,
                "published": published,
                "at": at,
                "handed": {port: _by_seq(stamps) for port, stamps in handed_raw.items()},
                "written": {port: _by_seq(stamps) for port, stamps in written_raw.items()},
                "writes": {port: len(stamps) for port, stamps in handed_raw.items()},
            }
        )
    )


def main() -> None:
    out = Path(sys.argv[1])
    install()
    atexit.register(dump, out)
    sys.argv = ["perdure", *sys.argv[2:]]
    from perdure.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
