"""The SSE pump: one session's events, replayed from the log and then followed live.

Each committed record goes out as ``id: seq`` / ``event: RecordType`` / ``data:
{...}``; ephemeral events (text deltas, progress) without an ``id``; restart
markers (``LogOpened``) in sequence order; a comment every ``heartbeat`` seconds.
A client resumes with ``Last-Event-ID`` and gets no gap and no duplicate. The
runtime's bus never waits for a slow client: it drops it, the response ends, and
the client reconnects from its last id.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any

import trio
from attrs import frozen
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from perdure._runtime import Runtime
from perdure.storage.bus import Event, EventStreamLagged
from perdure.storage.codec import converter
from perdure.storage.records import Record


def record_json(record: Record) -> dict[str, Any]:
    data: dict[str, Any] = converter.unstructure(record, unstructure_as=Record)
    return data


def event_payload(event: Event) -> dict[str, Any]:
    if event.seq is not None and event.record is not None:
        return {
            "seq": event.seq,
            "type": event.kind,
            "session_id": event.session_id,
            "record": record_json(event.record),
        }
    return {"type": event.kind, "session_id": event.session_id, "data": event.data}


def sse_frame(event: Event) -> bytes:
    data = json.dumps(event_payload(event), ensure_ascii=False, separators=(",", ":"))
    head = f"id: {event.seq}\n" if event.seq is not None else ""
    return f"{head}event: {event.kind}\ndata: {data}\n\n".encode()


class FrameCache:
    """Committed records encoded once for all the subscribers of one runtime's streams."""

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self._frames: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def frame(self, event: Event) -> bytes:
        if event.seq is None:
            return sse_frame(event)
        key = (event.session_id, event.seq)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = sse_frame(event)
            if len(self._frames) > self.size:
                self._frames.popitem(last=False)
        return found


@frozen
class Streams:
    """What every stream of one daemon shares: the runtime, the frame cache, the stop."""

    rt: Runtime
    frames: FrameCache
    closing: trio.Event
    heartbeat: float = 15.0
    retry_ms: int = 1000


class EventStreamResponse(Response):
    """``text/event-stream`` for one session: replay, then live, with heartbeats."""

    def __init__(self, streams: Streams, session_id: str, after: int, live: bool) -> None:
        super().__init__(status_code=200)
        self.streams = streams
        self.session_id = session_id
        self.after = after
        self.live = live

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        opening = f"retry: {self.streams.retry_ms}\n: after {self.after}\n\n".encode()
        await serve_sse(send, receive, self.streams, opening, self._pump)

    async def _pump(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Forward the session's events; frames that pile up while a write is in
        progress go out together in the next write (one send for a burst of commits)."""
        frames_in, frames_out = trio.open_memory_channel[bytes](256)
        streams = self.streams

        async def read() -> None:
            events = streams.rt.events(
                self.session_id, after=self.after, live=self.live, restarts=True
            )
            async with frames_in:
                try:
                    async with aclosing(events) as stream:
                        async for event in stream:
                            await frames_in.send(streams.frames.frame(event))
                except EventStreamLagged:
                    # The runtime dropped us rather than wait: end, so the client
                    # reconnects from the last id it received.
                    await frames_in.send(b": lagged behind; reconnect with Last-Event-ID\n\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            async for frame in frames_out:
                batch = [frame]
                while True:
                    try:
                        batch.append(frames_out.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await write(b"".join(batch))


Write = Callable[[bytes], Awaitable[None]]


async def serve_sse(
    send: Send,
    receive: Receive,
    streams: Streams,
    opening: bytes,
    pump: Callable[[Write], Awaitable[None]],
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """One ``text/event-stream`` response: ``opening``, then whatever ``pump`` writes,
    with a keep-alive comment every ``heartbeat`` seconds; it ends when the pump
    returns, the client goes away, or the daemon stops (every SSE route uses it)."""
    start = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache, no-transform"),
        (b"x-accel-buffering", b"no"),
        *headers,
    ]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    lock = trio.Lock()

    async def write(chunk: bytes) -> None:
        async with lock:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
            nursery.start_soon(_until_set, streams.closing, nursery.cancel_scope)
            nursery.start_soon(_heartbeats, streams.heartbeat, write)
            await write(opening)
            await pump(write)
            nursery.cancel_scope.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass  # the client went away mid-write; nothing to tell it


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _until_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _heartbeats(period: float, write: Write) -> None:
    while True:
        await trio.sleep(period)
        await write(b": keepalive\n\n")
