"""``PerdureClient``: the daemon's API for synchronous code (threads, scripts, Django)."""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx

from perdure.answers import Accepted, CallDiff, Done, Forked, IfBusy, Rewound
from perdure.client import _model as m
from perdure.client.errors import DaemonError

T = TypeVar("T")


class PerdureClient:
    """A client of ``perdure serve``. Use it as a context manager, or ``close()`` it.

    ``url`` is the daemon's address and ``token`` its bearer token. ``retry`` says
    how long a request is re-sent (with the same request id) while the daemon is
    unreachable or answers a retryable error; ``timeout`` is per attempt.
    ``stream_timeout`` is how long an event stream may stay silent before it is
    reconnected (the daemon sends a heartbeat well within it).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        retry: m.Retry | None = None,
        timeout: float = 30.0,
        stream_timeout: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.retry = retry if retry is not None else m.Retry()
        self.stream_timeout = stream_timeout
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        self._base = url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {token}"}

    def __enter__(self) -> PerdureClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: m.Call[T]) -> T:
        attempts = m.Attempts(self.retry)
        while True:
            error: DaemonError
            try:
                resp = self._http.request(
                    call.method,
                    self._base + call.path,
                    json=call.body,
                    headers={**self._auth, **call.headers} if call.headers else self._auth,
                )
            except httpx.TransportError as exc:
                error = m.unreachable(exc)
            else:
                try:
                    return call.answer(resp.status_code, resp.content)
                except DaemonError as exc:
                    error = exc
            time.sleep(attempts.after(error))

    # -- reads ---------------------------------------------------------------------------

    def health(self) -> m.Health:
        return self._send(m.health())

    def stats(self) -> m.Stats:
        return self._send(m.stats())

    def sessions(
        self, *, after: str = "", limit: int | None = None, active: bool = False
    ) -> list[m.SessionInfo]:
        """Every session in order of creation, or with ``after``, ``limit`` (at most
        10,000) or ``active`` a page in session-id order (``GET /v1/sessions``)."""
        return self._send(m.sessions(after, limit, active))

    def newest_sessions(
        self, *, before: int = 0, limit: int | None = None, active: bool = False
    ) -> list[m.SessionInfo]:
        """A page of the sessions newest first, by creation: at most ``limit`` (10,000
        when left out) created before ``before`` (the ``first_seq`` of the previous
        page's last; 0: from the newest); ``active``: only sessions with unfinished
        work (``GET /v1/sessions?order=newest``)."""
        return self._send(m.newest_sessions(before, limit, active))

    def state(self, session_id: str) -> m.SessionState:
        return self._send(m.state(session_id))

    def transcript(self, session_id: str, *, history: bool = False) -> list[m.TranscriptMessage]:
        """What the model is sent; ``history``: every message, as if nothing was
        compacted."""
        return self._send(m.transcript(session_id, history))

    def whoami(self) -> m.Grant:
        """What this client's token opens."""
        return self._send(m.whoami())

    def mint_token(
        self, session_id: str, *, scope: Literal["read", "write"] = "read", ttl_s: int = 3600
    ) -> m.SessionToken:
        """A token for ``session_id`` only (``read``: look; ``write``: also send), valid
        ``ttl_s`` seconds: to hand to a browser or another service. Needs the admin token."""
        return self._send(m.mint_token(session_id, scope, ttl_s))

    # -- commands (each carries a request id; a retry re-sends the same one) -----------

    def create_session(
        self,
        session_id: str | None = None,
        *,
        system: str | None = None,
        if_busy: IfBusy | None = None,
        tools: Sequence[str] | None = None,
    ) -> m.SessionCreated:
        """Create a session (idempotent for an explicit id). ``if_busy`` is its default
        for input sent while a run is busy (see ``submit``). ``tools`` grants it only
        these of the daemon's tools (None: all); an unknown name is refused (400)."""
        return self._send(m.create_session(session_id, system, if_busy, tools))

    def submit(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str | None = None,
        if_busy: IfBusy | None = None,
        traceparent: str | None = None,
    ) -> Accepted:
        """Queue input; durable when this returns. While a run is busy, ``if_busy`` says
        what happens: ``queue`` (the default), ``interrupt``, ``reject`` or ``steer``;
        the answer's ``disposition`` says which it was. ``traceparent`` (W3C) makes the
        run a child of the caller's trace."""
        return self._send(m.submit(session_id, text, request_id, if_busy, traceparent))

    def fork(
        self,
        source: str,
        *,
        at: int | str | None = None,
        session_id: str | None = None,
        request_id: str | None = None,
        files: bool = False,
    ) -> Forked:
        """A new session from ``source``'s history up to a settled point: ``at`` is None
        (the latest), a run id (the end of that run) or a sequence number. The same
        request id forks once (``duplicate`` on a retry). ``files=True`` also puts the
        workspace's files back as they were there (answered once they are)."""
        return self._send(m.fork(source, at, session_id, request_id, files))

    def rewind(self, session_id: str, *, to: int | str, request_id: str | None = None) -> Rewound:
        """Put the workspace's files back as they were at ``to`` (a call id: before that
        call; a settled point's seq); the conversation stays. ``NotFound`` without a
        checkpoint there; a ``Refused`` (409) while a run is active."""
        return self._send(m.rewind(session_id, to, request_id))

    def workspace_diff(self, session_id: str, call_id: str | None = None) -> list[CallDiff]:
        """What each checkpointed workspace call changed (or only ``call_id``'s), with a
        unified diff of each."""
        return self._send(m.workspace_diff(session_id, call_id))

    def delete_session(self, session_id: str) -> int:
        """Remove a finished session from the log; the number of records removed.

        ``Busy`` while it has unfinished work. A retry whose first attempt went
        through (its answer lost) answers ``NotFound``: the session is gone either way.
        """
        return self._send(m.delete_session(session_id))

    def cancel(self, session_id: str, *, request_id: str | None = None) -> Done:
        return self._send(m.cancel(session_id, request_id))

    def approve(
        self,
        session_id: str,
        call_id: str,
        *,
        approved: bool = True,
        request_id: str | None = None,
        note: str = "",
    ) -> Done:
        return self._send(m.approve(session_id, call_id, approved, request_id, note))

    def revise(self, session_id: str, text: str, *, request_id: str | None = None) -> Done:
        return self._send(m.revise(session_id, text, request_id))

    def compact_context(self, session_id: str, *, request_id: str | None = None) -> Done:
        """Summarise the session's conversation now (what the model is sent; the log
        keeps everything); ``ref`` is the compaction's id."""
        return self._send(m.compact_context(session_id, request_id))

    def pause(self, session_id: str, *, request_id: str | None = None) -> Done:
        return self._send(m.pause(session_id, request_id))

    def resume(self, session_id: str, *, request_id: str | None = None) -> Done:
        return self._send(m.resume(session_id, request_id))

    def compensate(self, session_id: str, call_id: str, *, request_id: str | None = None) -> Done:
        return self._send(m.compensate(session_id, call_id, request_id))

    def resolve(
        self,
        session_id: str,
        call_id: str,
        *,
        action: Literal["retry", "skip", "fail"],
        result: Any = None,
        request_id: str | None = None,
    ) -> Done:
        return self._send(m.resolve(session_id, call_id, action, result, request_id))

    # -- events --------------------------------------------------------------------------

    def events(
        self, session_id: str, *, after: int = 0, live: bool = True
    ) -> Generator[m.StreamEvent, None, None]:
        """The session's events after seq ``after``: the log's records, then live ones.

        Reconnects by itself (``Last-Event-ID``) when the connection breaks or the
        daemon restarts, with no gap and no duplicate among the records. With
        ``live=False`` it ends after the records committed so far.
        """
        follower = m.Follower(session_id, after, live)
        attempts = m.Attempts(self.retry)
        timeout = httpx.Timeout(self.stream_timeout, connect=10.0)
        while True:
            error: DaemonError
            try:
                with self._http.stream(
                    "GET",
                    self._base + follower.path,
                    params=follower.params(),
                    headers={**self._auth, **follower.headers()},
                    timeout=timeout,
                ) as resp:
                    try:
                        follower.opened(resp.status_code, None if resp.is_success else resp.read())
                    except DaemonError as exc:
                        error = exc  # retried if retryable (a 503 while it restarts)
                    else:
                        attempts.reset()
                        for line in resp.iter_lines():
                            event = follower.line(line)
                            if event is not None:
                                yield event
                        if not live:
                            return
                        error = m.unreachable(ConnectionError("the daemon ended the stream"))
            except httpx.TransportError as exc:
                error = m.unreachable(exc)
            time.sleep(attempts.after(error))

    def wait_idle(self, session_id: str) -> m.Run | None:
        """Wait until no run is in progress and no input is queued; the last run's outcome.

        Reads the state, and while the session is busy follows its events from that
        point: each finished run is a moment to read the state again.
        """
        current = self.state(session_id)
        if current.idle:
            return current.last_run
        stream = self.events(session_id, after=current.last_seq)
        try:
            for event in stream:
                if m.is_final(event):
                    current = self.state(session_id)
                    if current.idle:
                        return current.last_run
        finally:
            stream.close()
        raise AssertionError("unreachable: a live event stream does not end")
