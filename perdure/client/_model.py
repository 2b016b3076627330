"""The one request/answer model both clients share (no I/O here).

Each API method is a function that returns a ``Call``: the HTTP method, the path,
the JSON body, and how to turn the answer into a typed value. ``PerdureClient``
and ``AsyncPerdureClient`` only send calls and sleep between attempts; what is
sent, what is retried, and how an answer or an error is read is decided here, so
the two cannot drift apart.

Retries: every command carries a request id (generated here when the caller gives
none) and the daemon deduplicates by it, so a command whose answer was lost (a
crash, a reset connection, a 5xx) is sent again *with the same id*: it is
recorded once, and the retry gets the first answer (``duplicate=True``). Reads are
retried the same way. ``create_session`` without an id gets one generated here
for the same reason.

Event streams: ``Follower`` parses Server-Sent Events, remembers the last
committed sequence number seen, and gives the ``Last-Event-ID`` to reconnect with,
so the stream continues across a daemon restart with no gap and no duplicate.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

from attrs import field, frozen

from perdure.answers import Accepted, CallDiff, Done, Forked, IfBusy, Rewound
from perdure.client.errors import DaemonError, ProtocolError, Unavailable, error_from

T = TypeVar("T")

# -- what the daemon answers -------------------------------------------------------------


@frozen
class Health:
    status: str
    version: str | None


@frozen
class Stats:
    """The daemon's counters: the Journal's commits and the sessions in memory."""

    appends: int
    transactions: int
    records: int
    largest_transaction: int
    resident_sessions: int
    evictions: int


@frozen
class SessionCreated:
    session_id: str
    created: bool  # False: it existed already (e.g. a retry of a lost answer)


@frozen
class Grant:
    """What the caller's credential opens: ``admin`` (the daemon's token) or one session."""

    scope: str  # admin, read or write
    session_id: str | None  # None for admin
    expires_at: float | None  # wall-clock seconds; None for admin


@frozen
class SessionToken:
    """A token for one session only (``mint_token``), e.g. for a browser."""

    token: str
    session_id: str
    scope: str  # read (look) or write (also send)
    expires_at: float  # wall-clock seconds


@frozen
class SessionInfo:
    """One session of the log, as listed by ``sessions()``."""

    session_id: str
    first_seq: int
    last_seq: int
    records: int
    goal_rev: int
    open_submissions: int
    active: bool


@frozen
class Run:
    """One run of a session: what answered one input."""

    run_id: str
    submission_id: str
    status: str  # running, completed, failed, cancelled, interrupted, ...
    final_text: str | None = None
    reason: str | None = None


@frozen
class PendingCall:
    """A tool call that waits for a person (an approval or a resolution)."""

    call_id: str
    tool: str
    input: Any
    reason: str | None = None


@frozen
class SessionState:
    """The session's state folded from the daemon's log (``GET /v1/sessions/{id}``).

    The main fields are typed; ``summary`` holds the whole answer (requests, tasks,
    decisions, usage, cost) as the daemon sent it.
    """

    session_id: str
    status: str  # idle, running, paused, awaiting_approval, awaiting_human, parked, ...
    paused: bool
    parked: bool
    last_seq: int
    current_run: str | None
    queued: int
    runs: tuple[Run, ...]
    pending_approvals: tuple[PendingCall, ...]
    awaiting_resolution: tuple[PendingCall, ...]
    summary: Mapping[str, Any] = field(repr=False)

    @property
    def idle(self) -> bool:
        """No run in progress and no input queued (what ``wait_idle`` waits for)."""
        return self.current_run is None and self.queued == 0

    @property
    def last_run(self) -> Run | None:
        finished = [r for r in self.runs if r.status != "running"]
        return finished[-1] if finished else None


@frozen
class TranscriptMessage:
    """One message of the conversation as the model sees it; blocks as the daemon sends them."""

    role: str
    content: tuple[Mapping[str, Any], ...]

    @property
    def text(self) -> str:
        return "".join(str(b.get("text", "")) for b in self.content if b.get("type") == "text")


@frozen
class RecordEvent:
    """A committed record of the session's log (it has a sequence number)."""

    seq: int
    type: str  # the record's type: InputAccepted, ToolCompleted, RunFinished, LogOpened, ...
    session_id: str
    record: Mapping[str, Any]


@frozen
class EphemeralEvent:
    """A live-only event (a text delta, progress): never stored, not replayed."""

    type: str
    session_id: str
    data: Any


StreamEvent = RecordEvent | EphemeralEvent


# -- calls ---------------------------------------------------------------------------------


@frozen
class Call(Generic[T]):
    """One request of the API and how to read its answer."""

    method: str
    path: str
    read: Callable[[Any], T]
    body: Mapping[str, Any] | None = None
    ok: tuple[int, ...] = (200,)
    headers: Mapping[str, str] | None = None  # besides the token

    def answer(self, status: int, content: bytes) -> T:
        """The typed value of a successful answer; a ``DaemonError`` for any other."""
        try:
            data = json.loads(content) if content else None
        except ValueError:
            data = None
            if status in self.ok:
                raise ProtocolError(status, "not_json", "the answer is not JSON") from None
        if status not in self.ok:
            raise error_from(status, data)
        try:
            return self.read(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(status, "bad_answer", f"unexpected answer shape: {exc!r}") from None


def request_id() -> str:
    return "req-" + uuid.uuid4().hex


def _s(session_id: str) -> str:
    return "/v1/sessions/" + quote(session_id, safe="")


def _run(d: Mapping[str, Any]) -> Run:
    return Run(d["run_id"], d["submission_id"], d["status"], d.get("final_text"), d.get("reason"))


def _pending(d: Mapping[str, Any]) -> PendingCall:
    return PendingCall(d["call_id"], d["tool"], d.get("input"), d.get("reason"))


def _state(d: Mapping[str, Any]) -> SessionState:
    return SessionState(
        session_id=d["session_id"],
        status=d["status"],
        paused=bool(d["paused"]),
        parked=bool(d["parked"]),
        last_seq=int(d["last_seq"]),
        current_run=d.get("current_run"),
        queued=len(d.get("queue", ())),
        runs=tuple(_run(r) for r in d.get("runs", ())),
        pending_approvals=tuple(_pending(p) for p in d.get("pending_approvals", ())),
        awaiting_resolution=tuple(_pending(p) for p in d.get("awaiting_resolution", ())),
        summary=d,
    )


def _done(ref: Callable[[Mapping[str, Any]], Any]) -> Callable[[Any], Done]:
    """``perdure.Done`` from a command's answer; ``ref`` picks what the runtime calls ref."""

    def read(d: Mapping[str, Any]) -> Done:
        value = ref(d)
        return Done(
            ref="" if value is None else str(value),
            seq=int(d["seq"] or 0),
            duplicate=bool(d["duplicate"]),
        )

    return read


def health() -> Call[Health]:
    return Call("GET", "/healthz", lambda d: Health(d["status"], d.get("version")), ok=(200, 503))


def stats() -> Call[Stats]:
    return Call(
        "GET",
        "/v1/stats",
        lambda d: Stats(
            d["appends"],
            d["transactions"],
            d["records"],
            d["largest_transaction"],
            d["resident_sessions"],
            d["evictions"],
        ),
    )


def sessions(
    after: str = "", limit: int | None = None, active: bool = False
) -> Call[list[SessionInfo]]:
    # Nothing asked: no query, the whole list in order of creation.
    query: dict[str, str] = {}
    if after or limit is not None or active:
        query["after"] = after
        if limit is not None:
            query["limit"] = str(limit)
        if active:
            query["active"] = "1"
    return Call(
        "GET",
        "/v1/sessions" + ("?" + urlencode(query) if query else ""),
        lambda d: [
            SessionInfo(
                s["session_id"],
                s["first_seq"],
                s["last_seq"],
                s["records"],
                s["goal_rev"],
                s["open_submissions"],
                s["active"],
            )
            for s in d["sessions"]
        ],
    )


def newest_sessions(
    before: int = 0, limit: int | None = None, active: bool = False
) -> Call[list[SessionInfo]]:
    query = {"order": "newest"}
    if before:
        query["before"] = str(before)
    if limit is not None:
        query["limit"] = str(limit)
    if active:
        query["active"] = "1"
    return Call("GET", "/v1/sessions?" + urlencode(query), sessions().read)


def create_session(
    session_id: str | None,
    system: str | None,
    if_busy: IfBusy | None = None,
    tools: Sequence[str] | None = None,
) -> Call[SessionCreated]:
    # An id chosen here (as the daemon would) makes a retried create idempotent.
    body: dict[str, Any] = {"session_id": session_id or "s-" + uuid.uuid4().hex[:16]}
    if system is not None:
        body["system"] = system
    if if_busy is not None:
        body["if_busy"] = if_busy
    if tools is not None:
        if isinstance(tools, str):
            raise ValueError(f"tools must be a list of tool names, not the string {tools!r}")
        body["tools"] = list(tools)
    return Call(
        "POST",
        "/v1/sessions",
        lambda d: SessionCreated(d["session_id"], bool(d["created"])),
        body,
        ok=(200, 201),
    )


def delete_session(session_id: str) -> Call[int]:
    return Call("DELETE", _s(session_id), lambda d: int(d["records"]))


def fork(
    source: str, at: int | str | None, session_id: str | None, rid: str | None, files: bool
) -> Call[Forked]:
    if isinstance(at, bool) or not (at is None or isinstance(at, int | str)):
        raise ValueError(f"at must be None, a run id or a sequence number, not {at!r}")
    body: dict[str, Any] = {"request_id": rid or request_id(), "at": at}
    if session_id is not None:
        body["session_id"] = session_id
    if files:
        body["files"] = True
    return Call(
        "POST",
        _s(source) + "/forks",
        lambda d: Forked(
            d["session_id"], d["source"], int(d["position"]), duplicate=bool(d["duplicate"])
        ),
        body,
        ok=(200, 201),
    )


def rewind(session_id: str, to: int | str, rid: str | None) -> Call[Rewound]:
    if isinstance(to, bool) or not isinstance(to, int | str):
        raise ValueError(f"to must be a call id or a sequence number, not {to!r}")
    return Call(
        "POST",
        _s(session_id) + "/rewind",
        lambda d: Rewound(
            d["session_id"],
            d["tree"],
            int(d["position"]),
            d["before"],
            duplicate=bool(d["duplicate"]),
        ),
        {"request_id": rid or request_id(), "to": to},
    )


def workspace_diff(session_id: str, call_id: str | None) -> Call[list[CallDiff]]:
    query = "" if call_id is None else "?" + urlencode({"call_id": call_id})
    return Call(
        "GET",
        _s(session_id) + "/diff" + query,
        lambda d: [
            CallDiff(
                call_id=c["call_id"],
                attempt=int(c["attempt"]),
                tool_name=c["tool_name"],
                before=c["before"],
                after=c["after"],
                changed=tuple(c["changed"]),
                skipped=tuple(c["skipped"]),
                patch=c["patch"],
            )
            for c in d["calls"]
        ],
    )


def whoami() -> Call[Grant]:
    return Call(
        "GET", "/v1/whoami", lambda d: Grant(d["scope"], d.get("session_id"), d.get("expires_at"))
    )


def mint_token(session_id: str, scope: str, ttl_s: int) -> Call[SessionToken]:
    return Call(
        "POST",
        _s(session_id) + "/tokens",
        lambda d: SessionToken(d["token"], d["session_id"], d["scope"], float(d["expires_at"])),
        {"scope": scope, "ttl_s": ttl_s},
        ok=(201,),
    )


def state(session_id: str) -> Call[SessionState]:
    return Call("GET", _s(session_id), _state)


def transcript(session_id: str, history: bool = False) -> Call[list[TranscriptMessage]]:
    return Call(
        "GET",
        _s(session_id) + "/transcript" + ("?history=1" if history else ""),
        lambda d: [TranscriptMessage(m["role"], tuple(m["content"])) for m in d["messages"]],
    )


def submit(
    session_id: str,
    text: str,
    rid: str | None,
    if_busy: IfBusy | None = None,
    traceparent: str | None = None,
) -> Call[Accepted]:
    body: dict[str, Any] = {"text": text, "request_id": rid or request_id()}
    if if_busy is not None:
        body["if_busy"] = if_busy
    return Call(
        "POST",
        _s(session_id) + "/messages",
        lambda d: Accepted(
            d["submission_id"], int(d["seq"]), bool(d["duplicate"]), d["disposition"]
        ),
        body,
        ok=(202,),
        headers={"traceparent": traceparent} if traceparent else None,
    )


def cancel(session_id: str, rid: str | None) -> Call[Done]:
    body = {"request_id": rid or request_id()}
    return Call("POST", _s(session_id) + "/cancel", _done(lambda d: d.get("run_id")), body)


def approve(
    session_id: str, call_id: str, approved: bool, rid: str | None, note: str
) -> Call[Done]:
    body: dict[str, Any] = {"approved": approved, "request_id": rid or request_id()}
    if note:
        body["note"] = note
    path = _s(session_id) + "/approvals/" + quote(call_id, safe="")
    return Call("POST", path, _done(lambda d: d["call_id"]), body)


def revise(session_id: str, text: str, rid: str | None) -> Call[Done]:
    body = {"text": text, "request_id": rid or request_id()}
    return Call("POST", _s(session_id) + "/revisions", _done(lambda d: d["goal_rev"]), body)


def compact_context(session_id: str, rid: str | None) -> Call[Done]:
    body = {"request_id": rid or request_id()}
    path = _s(session_id) + "/compact-context"
    return Call("POST", path, _done(lambda d: d["compaction_id"]), body)


def pause(session_id: str, rid: str | None) -> Call[Done]:
    body = {"request_id": rid or request_id()}
    return Call("POST", _s(session_id) + "/pause", _done(lambda d: None), body)


def resume(session_id: str, rid: str | None) -> Call[Done]:
    body = {"request_id": rid or request_id()}
    return Call("POST", _s(session_id) + "/resume", _done(lambda d: None), body)


def compensate(session_id: str, call_id: str, rid: str | None) -> Call[Done]:
    body = {"request_id": rid or request_id()}
    path = _s(session_id) + "/compensations/" + quote(call_id, safe="")
    return Call("POST", path, _done(lambda d: d["compensation_id"]), body)


def resolve(session_id: str, call_id: str, action: str, result: Any, rid: str | None) -> Call[Done]:
    body: dict[str, Any] = {"action": action, "request_id": rid or request_id()}
    if result is not None:
        body["result"] = result
    path = _s(session_id) + "/calls/" + quote(call_id, safe="") + "/resolution"
    return Call("POST", path, _done(lambda d: d["call_id"]), body)


# -- retries -------------------------------------------------------------------------------


@frozen
class Retry:
    """How long to keep re-sending a request the daemon could not take.

    Connection errors and retryable error answers (5xx but a damaged record) are
    retried with exponential backoff and jitter, from ``base`` up to ``cap``
    seconds between attempts, until ``timeout`` seconds have passed since the
    first attempt; then the last error is raised. ``Retry(timeout=0)`` never retries.
    """

    timeout: float = 30.0
    base: float = 0.05
    cap: float = 2.0


class Attempts:
    """The retry state of one request (or of one event stream's reconnections)."""

    def __init__(self, retry: Retry) -> None:
        self.retry = retry
        self.started = time.monotonic()
        self.failures = 0

    def reset(self) -> None:
        self.started = time.monotonic()
        self.failures = 0

    def after(self, error: DaemonError) -> float:
        """The delay before the next attempt, or ``error`` raised if it is time to give up."""
        if not error.retryable:
            raise error
        delay: float = min(self.retry.cap, self.retry.base * 2.0**self.failures)
        delay *= 0.5 + random.random() / 2  # jitter: clients restarted together spread out
        self.failures += 1
        if time.monotonic() + delay - self.started > self.retry.timeout:
            raise error
        return delay


def unreachable(exc: Exception) -> Unavailable:
    return Unavailable(0, "unreachable", f"cannot reach the daemon: {type(exc).__name__}: {exc}")


# -- event streams ----------------------------------------------------------------------


class Follower:
    """One session's event stream across as many connections as it takes.

    Feed it the lines of each response; it yields events and keeps the last
    committed sequence number, which the next connection resumes after. Events with
    a sequence number at or below it are dropped (a replay that overlaps).
    """

    def __init__(self, session_id: str, after: int, live: bool) -> None:
        self.session_id = session_id
        self.last = after
        self.live = live
        self.retry_ms: int | None = None
        self._reset_frame()

    @property
    def path(self) -> str:
        return _s(self.session_id) + "/events"

    def params(self) -> dict[str, str]:
        return {} if self.live else {"live": "0"}

    def headers(self) -> dict[str, str]:
        return {"Last-Event-ID": str(self.last), "Accept": "text/event-stream"}

    def opened(self, status: int, content: bytes | None) -> None:
        """Check a new connection's status; raises the daemon's error for a refusal."""
        if status != 200:
            try:
                data = json.loads(content) if content else None
            except ValueError:
                data = None
            raise error_from(status, data)
        self._reset_frame()

    def _reset_frame(self) -> None:
        self._id: str | None = None
        self._event = "message"
        self._data: list[str] = []

    def line(self, line: str) -> StreamEvent | None:
        """One line of the stream; an event when it completes one."""
        if line == "":
            event = self._dispatch()
            self._reset_frame()
            return event
        if line.startswith(":"):
            return None  # a comment: heartbeat, "after N", "lagged"
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> StreamEvent | None:
        if not self._data:
            return None
        try:
            payload = json.loads("\n".join(self._data))
            if self._id is not None:
                seq = int(self._id)
                if seq <= self.last:
                    return None
                event: StreamEvent = RecordEvent(
                    seq, payload["type"], payload["session_id"], payload["record"]
                )
                self.last = seq
                return event
            return EphemeralEvent(payload["type"], payload["session_id"], payload.get("data"))
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(200, "bad_event", f"unreadable event: {exc!r}") from None


def is_final(event: StreamEvent) -> bool:
    """A ``RunFinished`` that answers an input (an ``interrupted`` one is followed by more)."""
    return (
        isinstance(event, RecordEvent)
        and event.type == "RunFinished"
        and event.record.get("status") != "interrupted"
    )
