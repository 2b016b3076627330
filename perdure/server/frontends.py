"""The routes that speak frontend protocols: the AI SDK's chat transport and AG-UI.

- ``GET /v1/sessions/{id}/events?format=ai-sdk|ag-ui``: the session's whole stream
  in that encoding (from the log, then live), resumable with ``Last-Event-ID``:
  each record's last frame carries its seq as the SSE id. Frames without an id are
  live deltas not yet committed; a client that reconnects drops what it got after
  its last id, and the committed reply is sent again whole.
- ``POST /v1/sessions/{id}/chat``: the AI SDK chat transport's request
  (``DefaultChatTransport({api: "/v1/sessions/{id}/chat"})``). The newest user
  message becomes a submit whose request id is the message id (a browser retry is
  deduplicated and gets the same run's stream); an assistant message whose tool
  parts carry approval responses records those approvals and continues the reply.
  The answer is that submission's UI message stream, ending with ``finish`` when
  its run ends, or when it waits for approvals.
- ``GET /v1/sessions/{id}/chat/{chat_id}/stream``: the transport's resume: the
  reply in progress replayed from its start (204 when nothing is in progress).
- ``POST /v1/sessions/{id}/ag-ui``: an AG-UI ``RunAgentInput``. The newest user
  message becomes a submit whose request id is the ``runId``; ``resume`` entries
  answer the approvals of an interrupted run (``payload: {"approved": bool}``).

All of it reads ``Runtime.events`` through ``perdure.server.protocols``; nothing
here keeps state between requests, so a restarted daemon answers the same way.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import attrs
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from perdure.budget import Price, cost_summary
from perdure.errors import Refused
from perdure.server.errors import ApiError
from perdure.server.protocols import ag_ui, ai_sdk
from perdure.server.protocols.parts import Follower, Part, parse_approval_id
from perdure.server.streams import serve_sse
from perdure.storage.bus import EventStreamLagged

if TYPE_CHECKING:
    from perdure.server.app import Api
    from perdure.view import SessionLookup

FORMATS: Final = ("ai-sdk", "ag-ui")

Chunk = dict[str, Any]
# Called when the followed run waits for approvals only: the chunks that end the
# response, or None to go on (the approvals were already answered).
OnBlocked = Callable[[Part], Awaitable[list[Chunk] | None]]


class ProtocolStream(Response):
    """Server-Sent Events of one session's parts, encoded by one protocol."""

    def __init__(
        self,
        api: Api,
        session_id: str,
        *,
        follower: Follower,
        encode: Callable[[Part], list[Chunk]],
        after: int = 0,
        head: list[Chunk] | None = None,
        on_blocked: OnBlocked | None = None,
        tail: bytes = b"",
        headers: dict[str, str] | None = None,
        resumed: Callable[[], list[Chunk]] | None = None,
        live: bool = True,
    ) -> None:
        super().__init__(status_code=200)
        self.api = api
        self.session_id = session_id
        self.follower = follower
        self.encode = encode
        self.after = after
        self.head = head or []
        self.on_blocked = on_blocked
        self.tail = tail
        self.extra_headers = headers or {}
        # Chunks that re-open what the hidden part of the stream left open (AG-UI's
        # current step), sent before the first visible event of a continuation.
        self.resumed = resumed
        self.live = live

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        opening = f"retry: {self.api.streams.retry_ms}\n\n".encode() + _frames(self.head, None)
        headers = [(k.encode(), v.encode()) for k, v in self.extra_headers.items()]
        await serve_sse(send, receive, self.api.streams, opening, self._pump, headers)

    async def _pump(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        events = self.api.rt.events(
            self.session_id, after=self.after, live=self.live, restarts=True
        )
        try:
            async with aclosing(events) as stream:
                async for event in stream:
                    chunks: list[Chunk] = []
                    ended = False
                    parts = self.follower.feed(event)
                    if self.follower.hidden(event):
                        for part in parts:
                            self.encode(part)  # keeps the encoder's state; sends nothing
                        continue
                    if self.resumed is not None:
                        chunks += self.resumed()
                        self.resumed = None
                    for part in parts:
                        if part.kind == "blocked" and self.on_blocked is not None:
                            closing = await self.on_blocked(part)
                            if closing is not None:
                                chunks += self.encode(part) + closing
                                ended = True
                                break
                        chunks += self.encode(part)
                    if chunks:
                        await write(_frames(chunks, event.seq))
                    if ended or self.follower.done:
                        await write(self.tail)
                        return
        except EventStreamLagged:
            await write(b": lagged behind; reconnect with Last-Event-ID\n\n")


def _frames(chunks: list[Chunk], seq: int | None) -> bytes:
    """SSE frames; the last one of a committed record carries its seq as the id."""
    out = []
    for i, chunk in enumerate(chunks):
        data = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
        head = f"id: {seq}\n" if seq is not None and i == len(chunks) - 1 else ""
        out.append(f"{head}data: {data}\n\n")
    return "".join(out).encode()


# -- the session's stream in another encoding ---------------------------------------------


def session_stream(
    api: Api, session_id: str, fmt: str, after: int, live: bool = True
) -> ProtocolStream:
    """``events?format=``: every submission of the session, resumable by seq
    (``live=0``: only what the log holds now).

    The follower reads the session from its start (so a part resumed mid-run knows
    its context) and is cut at ``after``: nothing up to there is sent.
    """
    follower = Follower(cut=after)
    if fmt == "ai-sdk":
        encoder = ai_sdk.AiSdkEncoder()
        return ProtocolStream(
            api,
            session_id,
            follower=follower,
            encode=encoder.encode,
            headers=ai_sdk.HEADERS,
            live=live,
        )
    ag = ag_ui.AgUiEncoder(session_id)
    return ProtocolStream(api, session_id, follower=follower, encode=ag.encode, live=live)


# -- the AI SDK chat transport --------------------------------------------------------------


def _text_of(parts: Any) -> str:
    if not isinstance(parts, list):
        return ""
    return "".join(
        str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
    )


def _end_if_still_blocked(
    api: Api, session_id: str, closing: Callable[[Part], list[Chunk]]
) -> OnBlocked:
    """End the response with ``closing(part)`` if the calls still wait for approval
    (a replay passes points where a run waited and was answered long ago)."""

    async def check(part: Part) -> list[Chunk] | None:
        def still_waiting(state: SessionLookup) -> bool:
            return any(
                (task := state.task_view(c)) is not None and task.phase == "awaiting_approval"
                for c in part.data["call_ids"]
            )

        waiting = await api.rt.state(session_id, still_waiting, wake=False)
        return closing(part) if waiting else None

    return check


class ChatRoutes:
    """The AI SDK and AG-UI request routes, bound to the daemon's ``Api``."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def _approve(
        self, session_id: str, call_id: str, approved: bool, request_id: str, note: str
    ) -> None:
        """Record an approval; one decided meanwhile (another tab, the page) is no error:
        the stream that follows shows what was decided."""
        try:
            await self.api.rt.approve(
                session_id, call_id, approved=approved, request_id=request_id, note=note
            )
        except Refused as exc:
            if exc.code != "invalid_state":
                raise

    async def _submission_seq(self, session_id: str, submission_id: str) -> int:
        """Where a reply's stream starts: just before its submission's first record.

        Asked of the session's live state (it was just sent the input, so it is in
        memory), not folded from the log: that cost grew with the session's history
        on every chat request (about 30 ms at 200 turns).
        """

        seq = await self.api.rt.state(session_id, partial(_seq_of, submission_id))
        return max(0, (seq if seq is not None else 1) - 1)

    def _chat_stream(
        self, session_id: str, submission_id: str, after: int, cut: int
    ) -> ProtocolStream:
        encoder = ai_sdk.AiSdkEncoder()
        head = encoder.start(submission_id) if cut else []
        return ProtocolStream(
            self.api,
            session_id,
            follower=Follower(submission=submission_id, cut=cut),
            encode=encoder.encode,
            after=after,
            head=head,
            on_blocked=_end_if_still_blocked(self.api, session_id, lambda _: encoder.pause()),
            tail=ai_sdk.DONE,
            headers=ai_sdk.HEADERS,
        )

    async def chat(self, session_id: str, data: dict[str, Any]) -> Response:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            raise ApiError(400, "invalid_field", "'messages' must be a non-empty list", "messages")
        last = messages[-1]
        mid = last.get("id")
        if not isinstance(mid, str) or not mid.strip() or len(mid) > 200:
            raise ApiError(
                400, "invalid_field", "the newest message needs an 'id' (a string)", "messages"
            )
        if last.get("role") == "user":
            text = _text_of(last.get("parts"))
            if not text.strip():
                raise ApiError(
                    400, "invalid_field", "the newest user message has no text part", "messages"
                )
            await self.api.rt.ensure_session(session_id)
            accepted = await self.api.rt.submit(session_id, text, request_id=mid)
            after = await self._submission_seq(session_id, accepted.submission_id)
            return self._chat_stream(session_id, accepted.submission_id, after, 0)
        if last.get("role") == "assistant":
            return await self._chat_approvals(session_id, last)
        raise ApiError(
            400,
            "invalid_field",
            "the newest message must be the user's or answer approvals",
            "messages",
        )

    async def _chat_approvals(self, session_id: str, message: dict[str, Any]) -> Response:
        submission_id = str(message.get("id", "")).removeprefix("msg_")
        answered: list[tuple[str, int, bool, str, str]] = []
        for part in message.get("parts") or []:
            if not isinstance(part, dict) or part.get("state") != "approval-responded":
                continue
            approval = part.get("approval")
            if not isinstance(approval, dict) or not isinstance(approval.get("approved"), bool):
                continue
            parsed = parse_approval_id(str(approval.get("id", "")))
            if parsed is None:
                raise ApiError(
                    400, "invalid_field", f"unknown approval id {approval.get('id')!r}", "messages"
                )
            reason = approval.get("reason")
            note = reason if isinstance(reason, str) else ""
            answered.append((*parsed, approval["approved"], note, str(approval["id"])))
        if not answered:
            raise ApiError(
                400,
                "invalid_field",
                "the newest message is the assistant's but answers no approval",
                "messages",
            )
        for call_id, _seq, approved, note, rid in answered:
            await self._approve(session_id, call_id, approved, rid, note)
        seq = await self.api.rt.state(session_id, partial(_seq_of, submission_id), wake=False)
        if seq is None:
            raise ApiError(404, "not_found", f"no reply {message.get('id')!r} in this session")
        after = max(0, seq - 1)
        cut = max(seq for _c, seq, _a, _n, _r in answered)
        return self._chat_stream(session_id, submission_id, after, cut)

    async def chat_resume(self, session_id: str) -> Response:
        """The reply in progress, replayed from its start; 204 when there is none."""
        found = await self.api.rt.state(session_id, _open_submission, wake=False)
        if found is None:
            return Response(status_code=204)
        submission_id, seq = found
        return self._chat_stream(session_id, submission_id, max(0, seq - 1), 0)

    # -- AG-UI -------------------------------------------------------------------------

    async def ag_ui_run(self, session_id: str, data: dict[str, Any]) -> Response:
        try:
            from ag_ui.core import RunAgentInput
            from pydantic import ValidationError
        except ImportError:
            raise ApiError(
                501, "not_installed", "AG-UI input needs the ag-ui-protocol package: perdure[ag-ui]"
            ) from None
        try:
            run = RunAgentInput.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise ApiError(
                400, "invalid_field", f"not an AG-UI RunAgentInput: {where}: {first['msg']}", where
            ) from None
        if run.thread_id != session_id:
            raise ApiError(
                400, "invalid_field", "threadId must be the session id of the URL", "threadId"
            )
        encoder = ag_ui.AgUiEncoder(session_id)
        if run.resume:
            return await self._ag_ui_resume(session_id, run.run_id, run.resume, encoder)
        text = ""
        for m in reversed(run.messages):
            if m.role == "user":
                content = m.content
                text = (
                    content
                    if isinstance(content, str)
                    else "".join(str(getattr(p, "text", "")) for p in content)
                )
                break
        if not text.strip():
            raise ApiError(
                400, "invalid_field", "no user message with text in 'messages'", "messages"
            )
        await self.api.rt.ensure_session(session_id)
        accepted = await self.api.rt.submit(session_id, text, request_id=run.run_id)
        after = await self._submission_seq(session_id, accepted.submission_id)
        return self._ag_ui_stream(session_id, accepted.submission_id, after, 0, encoder, [])

    async def _ag_ui_resume(
        self, session_id: str, run_id: str, entries: list[Any], encoder: ag_ui.AgUiEncoder
    ) -> Response:
        cut = 0
        call_ids = []
        for entry in entries:
            parsed = parse_approval_id(entry.interrupt_id)
            if parsed is None:
                raise ApiError(
                    400, "invalid_field", f"unknown interrupt id {entry.interrupt_id!r}", "resume"
                )
            call_id, seq = parsed
            payload = entry.payload if isinstance(entry.payload, dict) else {}
            approved = entry.status == "resolved" and payload.get("approved") is True
            note = payload.get("note")
            note = note if isinstance(note, str) else ""
            await self._approve(session_id, call_id, approved, entry.interrupt_id, note)
            cut = max(cut, seq)
            call_ids.append(call_id)
        reply = partial(_reply_of, call_ids[0], self.api.rt.prices)
        found = await self.api.rt.state(session_id, reply, wake=False)
        if found is None:
            raise ApiError(404, "not_found", f"no tool call {call_ids[0]!r} in this session")
        submission_id, seq, snapshot = found
        head = encoder.start(run_id, snapshot)
        return self._ag_ui_stream(session_id, submission_id, max(0, seq - 1), cut, encoder, head)

    def _ag_ui_stream(
        self,
        session_id: str,
        submission_id: str,
        after: int,
        cut: int,
        encoder: ag_ui.AgUiEncoder,
        head: list[Chunk],
    ) -> ProtocolStream:
        def interrupt(part: Part) -> list[Chunk]:
            return encoder.interrupt(part.data["approvals"])

        return ProtocolStream(
            self.api,
            session_id,
            follower=Follower(submission=submission_id, cut=cut),
            encode=encoder.encode,
            after=after,
            head=head,
            on_blocked=_end_if_still_blocked(self.api, session_id, interrupt),
            resumed=encoder.reopen if cut else None,
        )


# -- what the routes read of a session's state (run inside its actor: read-only) -------


def _seq_of(submission_id: str, state: SessionLookup) -> int | None:
    """The seq of a submission's first record (None: no such submission)."""
    sub = state.submission_view(submission_id)
    return sub.seq if sub is not None else None


def _open_submission(state: SessionLookup) -> tuple[str, int] | None:
    """The unanswered input that runs (or runs next), with its seq."""
    sub = state.open_submission()
    return (sub.submission_id, sub.seq) if sub is not None else None


def _reply_of(
    call_id: str, prices: Mapping[str, Price], state: SessionLookup
) -> tuple[str, int, dict[str, Any]] | None:
    """The submission whose reply made ``call_id``, its seq, and the AG-UI snapshot."""
    task = state.task_view(call_id)
    gen = state.generation_view(task.generation_id) if task is not None else None
    sub = state.submission_view(gen.submission_id) if gen is not None else None
    if sub is None:
        return None
    return sub.submission_id, sub.seq, _snapshot(state, prices)


def _snapshot(state: SessionLookup, prices: Mapping[str, Price]) -> dict[str, Any]:
    """What AG-UI's shared state shows of a session: the headline facts of its summary
    (``GET /v1/sessions/{id}``), read from the session's snapshot (``SessionView``);
    the cost at the runtime's prices, as the summary's."""
    view = state.view()
    return {
        "session_id": view.session_id,
        "paused": view.paused,
        "parked": view.parked,
        "usage": attrs.asdict(view.usage),
        "cost": cost_summary(dict(view.spend), prices),
    }
