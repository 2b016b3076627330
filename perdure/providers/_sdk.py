"""How perdure drives a vendor's Python SDK: the streamed body, request options.

Both SDK-backed providers ask their SDK for a streamed response and then read the
raw body themselves, through ``read_sse``: the SDKs' own stream iterators stop
reading at an error event and leave their nested async generators (and the HTTP
stack's) unfinished, which trio reports as leaked resources. ``SSEParser`` is plain
synchronous code fed from httpx2's body iterator, which ``read_sse`` reads to its
end and closes deterministically.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Protocol, Self

import httpx2

from perdure.providers._retry import StreamBroken

__all__ = ["EventFolder", "OwnsClient", "SSEParser", "json_object", "read_sse", "split_options"]

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEParser:
    """Server-Sent Events from a byte stream, as (event name, data) pairs."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[tuple[str, str]]:
        self._buffer += chunk
        while True:
            match = _LINE_END.search(self._buffer)
            if match is None:
                return
            if match.group() == b"\r" and match.end() == len(self._buffer):
                return  # may be the first half of \r\n: wait for more
            line = self._buffer[: match.start()].decode("utf-8", errors="replace")
            self._buffer = self._buffer[match.end() :]
            event = self._line(line)
            if event is not None:
                yield event

    def end(self) -> Iterator[tuple[str, str]]:
        """The body ended: a held-back ``\r`` was a line end after all."""
        if self._buffer == b"\r":
            yield from self.feed(b"\n")

    def _line(self, line: str) -> tuple[str, str] | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class SDKStream(Protocol):
    """A streamed response as both SDKs return it (``stream=True``)."""

    response: httpx2.Response

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any: ...


async def read_sse(stream: SDKStream, on_event: Callable[[str, str], None]) -> None:
    """Feed every event of ``stream``'s body to ``on_event``, then close the response.

    ``on_event`` must not raise (a reply builder remembers a failure instead): the body
    is read to its end so that the HTTP stack's generators finish normally.
    """
    async with stream, contextlib.aclosing(stream.response.aiter_bytes()) as body:
        parser = SSEParser()
        async for chunk in body:
            for name, data in parser.feed(chunk):
                on_event(name, data)
        for name, data in parser.end():
            on_event(name, data)


class EventFolder:
    """Folds a stream's events into one reply (a vendor's subclass says how).

    A failure is remembered, not raised: ``read_sse`` reads the body to its end (the
    server closes it right after an error event), so the HTTP stack's generators
    finish normally instead of being abandoned; the reply raises it afterwards.
    """

    def __init__(self) -> None:
        self.failure: StreamBroken | None = None

    def on_event(self, name: str, raw: str) -> None:
        if self.failure is not None or self.skips(name):
            return
        try:
            self.fold(name, raw)
        except StreamBroken as exc:
            self.failure = exc
        except (KeyError, TypeError, ValueError) as exc:
            self.failure = StreamBroken(f"the stream sent a malformed {name!r} event: {exc!r}")

    def skips(self, name: str) -> bool:
        """Whether to ignore an event (a keep-alive, anything after the end)."""
        return False

    def fold(self, name: str, raw: str) -> None:
        raise NotImplementedError

    def check_ended(self, ended: bool, unfinished: str) -> None:
        """Raise the remembered failure, or ``unfinished`` when the stream did not end."""
        if self.failure is not None:
            raise self.failure
        if not ended:
            raise StreamBroken(unfinished)


def json_object(name: str, raw: str) -> dict[str, Any]:
    """An event's data, which must be a JSON object."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise StreamBroken(f"the stream sent an unreadable {name!r} event") from None
    if not isinstance(data, dict):
        raise StreamBroken(f"the stream sent an unreadable {name!r} event")
    return data


def split_options(create: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """Options the SDK's ``create`` takes as arguments stay arguments; the others (fields
    this SDK version has no argument for, or a compatible server's own) go in
    ``extra_body``, so the API still receives them as request fields."""
    accepted = set(inspect.signature(create).parameters)
    direct = {k: v for k, v in options.items() if k in accepted}
    extra = {k: v for k, v in options.items() if k not in accepted}
    if extra:
        direct["extra_body"] = {**extra, **dict(direct.get("extra_body") or {})}
    return direct


class _Closable(Protocol):
    async def close(self) -> None: ...


class OwnsClient:
    """A provider with an SDK client: usable as ``async with``; closes the client on exit
    only if it made the client itself (one passed in belongs to the caller)."""

    client: _Closable
    _owns_client: bool

    async def aclose(self) -> None:
        """Close the HTTP client if this provider created it."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
