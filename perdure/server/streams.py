"""The SSE pump: one session's events, replayed from the log and then followed live.

Each committed record goes out as ``id: seq`` / ``event: RecordType`` / ``data:
{...}``; ephemeral events (text deltas, progress) without an ``id``; restart
markers (``LogOpened``) in sequence order; a comment every ``heartbeat`` seconds.
A client resumes with ``Last-Event-ID`` and gets no gap and no duplicate. The
runtime's bus never waits for a slow client: it drops it, the response ends, and
the client reconnects from its last id.

What one more client of a busy session costs is kept to the unavoidable: each event
is encoded once for all of them (``FrameCache``), and each response wakes once per
burst and writes everything that piled up since its last write in one send (the
records of a commit, the deltas that came meanwhile), from a task of its own.
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

from perdure import Runtime
from perdure.storage.bus import Event, EventStreamLagged
from perdure.storage.codec import converter
from perdure.storage.records import Record
from perdure.storage.redact import redacted


def record_json(record: Record) -> dict[str, Any]:
    """A record as the daemon sends it (secret tool parameters masked)."""
    data: dict[str, Any] = converter.unstructure(redacted(record), unstructure_as=Record)
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
    """Each event encoded once for all the subscribers of one runtime's streams.

    A live event reaches every subscriber of its session as the same ``Event``
    object, so the frame is cached by identity (ephemeral deltas as well as
    records); committed records are also cached by (session, seq), so the clients
    that replay the same records from the log (reconnecting after a restart, say)
    share one encoding too. The cached bytes are exactly what ``sse_frame`` returns.
    """

    def __init__(self, size: int = 8192, live: int = 1024) -> None:
        self.size = size
        self.live = live
        self._frames: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        # id(event) -> (event, frame); holding the event keeps its id from being reused
        self._recent: OrderedDict[int, tuple[Event, bytes]] = OrderedDict()

    def frame(self, event: Event) -> bytes:
        recent = self._recent.get(id(event))
        if recent is not None and recent[0] is event:
            return recent[1]
        if event.seq is None:
            found = sse_frame(event)
        else:
            key = (event.session_id, event.seq)
            cached = self._frames.get(key)
            if cached is None:
                cached = self._frames[key] = sse_frame(event)
                if len(self._frames) > self.size:
                    self._frames.popitem(last=False)
            found = cached
        self._recent[id(event)] = (event, found)
        if len(self._recent) > self.live:
            self._recent.popitem(last=False)
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
        """Forward the session's events: whatever has piled up since the last write (a
        commit's records, the deltas of a busy stream, a page of the replay) goes out
        in one write, so a client costs one wake-up and one send per burst."""
        streams = self.streams
        frame = streams.frames.frame
        batches = streams.rt.event_batches(
            self.session_id, after=self.after, live=self.live, restarts=True
        )
        try:
            async with aclosing(batches) as stream:
                async for batch in stream:
                    await write(b"".join([frame(event) for event in batch]))
        except EventStreamLagged:
            # The runtime dropped us rather than wait: end, so the client
            # reconnects from the last id it received.
            await write(b": lagged behind; reconnect with Last-Event-ID\n\n")


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
    lock = trio.Lock()  # the pump and the heartbeats take turns

    async def write(chunk: bytes) -> None:
        # Uncontended (nearly always), take the lock without ``acquire``'s checkpoint:
        # the send below yields anyway, and one scheduling round less per write is
        # what a hundred clients of one session feel.
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            lock.release()

    async def forward(scope: trio.CancelScope) -> None:
        await write(opening)
        await pump(write)
        scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
            nursery.start_soon(_until_set, streams.closing, nursery.cancel_scope)
            nursery.start_soon(_heartbeats, streams.heartbeat, write)
            # In a task of its own: every wake-up of the pump resumes only its own few
            # frames, not the whole ASGI stack (server, middleware, router) above us.
            nursery.start_soon(forward, nursery.cancel_scope)
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
