"""The typed clients against a real ``perdure serve``: every method, every error type.

Each test runs three times (``flavor``): the sync client, and the async client
under asyncio and under trio.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

import perdure
import perdure.client
from perdure.client import (
    BadRequest,
    Busy,
    Conflict,
    DaemonError,
    Forbidden,
    InvalidState,
    NotFound,
    PendingCall,
    RecordEvent,
    Unauthorized,
)
from tests.client.conftest import run
from tests.support.daemon import Daemon


async def awaiting_approval(client: Any, session_id: str) -> PendingCall:
    """Follow the session's events until a tool call waits for approval."""
    async with aclosing(client.events(session_id)) as stream:
        async for event in stream:
            if isinstance(event, RecordEvent):
                state = await client.state(session_id)
                if state.pending_approvals:
                    pending: PendingCall = state.pending_approvals[0]
                    return pending
    raise AssertionError("the stream ended before an approval was asked")


def test_every_method_against_a_real_daemon(flavor: str, approval_daemon: Daemon) -> None:
    async def scenario(client: Any) -> None:
        sid = f"{flavor}-a"
        assert (await client.health()).status == "ok"
        made = await client.create_session(sid)
        assert (made.session_id, made.created) == (sid, True)
        assert (await client.create_session(sid)).created is False
        other = await client.create_session(system="be brief")
        assert other.session_id.startswith("s-") and other.created

        first = await client.submit(sid, "deploy it", request_id="r1")
        assert isinstance(first, perdure.Accepted) and not first.duplicate and first.seq > 0
        again = await client.submit(sid, "deploy it", request_id="r1")
        assert again == perdure.Accepted(first.submission_id, first.seq, duplicate=True)
        with pytest.raises(Conflict) as conflict:
            await client.submit(sid, "something else", request_id="r1")
        assert conflict.value.status == 409 and isinstance(conflict.value, perdure.Refused)
        with pytest.raises(BadRequest) as bad:
            await client.submit(sid, "", request_id="r2")
        assert bad.value.field == "text"

        pending = await awaiting_approval(client, sid)
        assert pending.tool == "deploy" and pending.input == {"target": "prod"}
        assert (await client.state(sid)).status == "awaiting_approval"
        approved = await client.approve(sid, pending.call_id, request_id="ok-1", note="go")
        assert approved.ref == pending.call_id and approved.seq > 0 and not approved.duplicate
        assert (await client.approve(sid, pending.call_id, request_id="ok-1", note="go")) == (
            perdure.Done(pending.call_id, approved.seq, duplicate=True)
        )
        outcome = await client.wait_idle(sid)
        assert outcome is not None
        assert (outcome.status, outcome.final_text) == ("completed", "Deployed: all done.")
        assert outcome.submission_id == first.submission_id
        state = await client.state(sid)
        assert state.idle and state.status == "idle" and state.last_run == outcome

        transcript = await client.transcript(sid)
        assert transcript[0].role == "user" and transcript[0].text == "deploy it"
        assert transcript[-1].text == "Deployed: all done."

        # A replay (live=False) ends, and its records are in order without repeats.
        async with aclosing(client.events(sid, live=False)) as stream:
            replayed = [e async for e in stream]
        seqs = [e.seq for e in replayed]
        assert seqs == sorted(set(seqs)) and all(isinstance(e, RecordEvent) for e in replayed)
        assert replayed[-1].type == "RunFinished" and seqs[-1] <= state.last_seq
        async with aclosing(client.events(sid, after=seqs[-2], live=False)) as stream:
            assert [e.seq async for e in stream] == seqs[-1:]

        paused = await client.pause(sid)
        assert paused.seq > 0 and (await client.state(sid)).paused
        assert (await client.resume(sid)).seq > 0 and not (await client.state(sid)).paused
        nothing = await client.cancel(sid)
        assert (nothing.seq, nothing.duplicate) == (0, False)  # no run: nothing recorded
        with pytest.raises(InvalidState) as invalid:
            await client.revise(sid, "too late")
        assert invalid.value.code == "invalid_state" and isinstance(invalid.value, perdure.Refused)
        lookup = next(t for t in state.summary["tasks"] if t["tool"] == "lookup")
        with pytest.raises(InvalidState, match="declares no compensation"):
            await client.compensate(sid, lookup["call_id"])
        with pytest.raises(NotFound):
            await client.resolve(sid, "no-such-call", action="skip", result="x")
        with pytest.raises(NotFound) as missing:
            await client.state("no-such-session")
        assert missing.value.code == "not_found" and isinstance(missing.value, perdure.Refused)
        with pytest.raises(NotFound):
            async with aclosing(client.events("no-such-session")) as stream:
                await stream.__anext__()

        listed = {s.session_id: s for s in await client.sessions()}
        assert listed[sid].last_seq == (await client.state(sid)).last_seq
        assert not listed[sid].active and other.session_id in listed
        stats = await client.stats()
        assert stats.records >= listed[sid].records and stats.appends > 0

        # Another session: a revision while the approval is pending supersedes the call.
        sid_b = f"{flavor}-b"
        await client.create_session(sid_b)
        await client.submit(sid_b, "deploy it")
        await awaiting_approval(client, sid_b)
        revised = await client.revise(sid_b, "deploy to staging instead")
        assert revised.ref == "1" and revised.seq > 0
        finished = await client.wait_idle(sid_b)
        assert finished is not None and finished.status == "completed"
        assert (await client.state(sid_b)).summary["request"]["goal_rev"] == 1

    run(flavor, approval_daemon, scenario)


def test_a_wrong_token_is_unauthorized_and_not_retried(
    flavor: str, approval_daemon: Daemon
) -> None:
    async def scenario(client: Any) -> None:
        for call in (client.sessions(), client.submit("x", "hi")):
            with pytest.raises(Unauthorized) as denied:
                await call
            assert denied.value.status == 401 and isinstance(denied.value, DaemonError)
        assert (await client.health()).status == "ok"  # /healthz needs no token

    run(flavor, approval_daemon, scenario, token="not-the-token")


async def until_state(client: Any, session_id: str, done: Any) -> Any:
    """Follow the events until ``done(state)`` holds after a committed record."""
    state = await client.state(session_id)
    if done(state):
        return state
    async with aclosing(client.events(session_id, after=state.last_seq)) as stream:
        async for event in stream:
            if isinstance(event, RecordEvent):
                state = await client.state(session_id)
                if done(state):
                    return state
    raise AssertionError("the stream ended first")


def test_resolve_a_call_that_needs_a_person_and_compensate_a_completed_one(
    flavor: str, people_daemon: Daemon
) -> None:
    async def scenario(client: Any) -> None:
        sid = f"{flavor}-p"
        await client.create_session(sid)
        await client.submit(sid, "refund the customer")
        state = await until_state(client, sid, lambda s: s.awaiting_resolution)
        [waiting] = state.awaiting_resolution
        assert waiting.tool == "charge_card" and "declined" in (waiting.reason or "")
        assert state.status == "awaiting_human"
        resolved = await client.resolve(sid, waiting.call_id, action="retry", request_id="res")
        assert resolved.ref == waiting.call_id and resolved.seq > 0
        outcome = await client.wait_idle(sid)
        assert outcome is not None and outcome.status == "completed"

        ticket = next(t for t in state.summary["tasks"] if t["tool"] == "open_ticket")
        undo = await client.compensate(sid, ticket["call_id"], request_id="undo")
        assert undo.ref and undo.seq > 0
        assert (await client.compensate(sid, ticket["call_id"], request_id="undo")).duplicate
        # The compensation (close_ticket) needs an approval of its own.
        state = await until_state(client, sid, lambda s: s.pending_approvals)
        [closing] = state.pending_approvals
        assert closing.call_id == undo.ref  # listed under the tool it undoes
        await client.approve(sid, closing.call_id)
        state = await until_state(client, sid, lambda s: s.status == "idle")
        task = next(t for t in state.summary["tasks"] if t["call_id"] == undo.ref)
        assert task["phase"] == "completed"

    run(flavor, people_daemon, scenario)


TRACEPARENT = "00-" + "4bf92f3577b34da6a3ce929d0e0e4736" + "-" + "00f067aa0ba902b7" + "-01"


def test_input_while_busy_forks_deletes_and_scoped_tokens(
    flavor: str, approval_daemon: Daemon
) -> None:
    minted: list[perdure.client.SessionToken] = []
    sid = f"{flavor}-fork"

    async def scenario(client: Any) -> None:
        assert await client.whoami() == perdure.client.Grant("admin", None, None)
        await client.create_session(sid, if_busy="reject")
        first = await client.submit(sid, "deploy it", traceparent=TRACEPARENT)
        assert first.disposition == "queued"
        pending = await awaiting_approval(client, sid)
        with pytest.raises(Busy) as busy:  # the session's default while a run is busy
            await client.submit(sid, "and report back")
        assert busy.value.status == 409 and isinstance(busy.value, perdure.Refused)
        with pytest.raises(Busy):  # a busy session is not deleted
            await client.delete_session(sid)

        token = await client.mint_token(sid, scope="read", ttl_s=120)
        assert (token.session_id, token.scope) == (sid, "read") and token.token
        assert token.expires_at > time.time() + 60
        minted.append(token)

        await client.approve(sid, pending.call_id)
        outcome = await client.wait_idle(sid)
        assert outcome is not None and outcome.status == "completed"
        async with aclosing(client.events(sid, live=False)) as stream:
            accepted = [e async for e in stream if e.type == "InputAccepted"]
        assert [e.record["traceparent"] for e in accepted] == [TRACEPARENT]

        forked = await client.fork(sid, request_id="fork-1")
        assert isinstance(forked, perdure.Forked) and not forked.duplicate
        assert forked.source == sid and forked.position > 0
        assert await client.fork(sid, request_id="fork-1") == perdure.Forked(
            forked.session_id, sid, forked.position, duplicate=True
        )
        assert await client.transcript(forked.session_id) == await client.transcript(sid)
        at_run = await client.fork(sid, at=outcome.run_id, session_id=f"{sid}-copy")
        assert (at_run.session_id, at_run.position) == (f"{sid}-copy", forked.position)
        with pytest.raises(InvalidState):  # not a settled point of the source
            await client.fork(sid, at=pending_seq(accepted))

        removed = await client.delete_session(at_run.session_id)
        assert removed > 0
        with pytest.raises(NotFound):
            await client.state(at_run.session_id)
        with pytest.raises(NotFound):  # gone: a second delete has nothing to remove
            await client.delete_session(at_run.session_id)
        assert (await client.state(forked.session_id)).idle  # the other fork stays

    async def with_the_read_token(client: Any) -> None:
        grant = await client.whoami()
        assert grant == perdure.client.Grant("read", sid, minted[0].expires_at)
        assert (await client.state(sid)).idle
        with pytest.raises(Forbidden) as refused:
            await client.submit(sid, "a read token does not send")
        assert refused.value.status == 403
        with pytest.raises(Forbidden):
            await client.state(f"{flavor}-a")  # another session

    run(flavor, approval_daemon, scenario)
    run(flavor, approval_daemon, with_the_read_token, token=minted[0].token)


def pending_seq(accepted: list[Any]) -> int:
    """The seq of the input record: inside a run, so no settled point to fork at."""
    return int(accepted[0].seq)


WORKSPACE_SCRIPT = [
    {"tool_uses": [{"name": "write_file", "input": {"path": "a.txt", "content": "one\n"}}]},
    {"text": "written"},
]


def test_workspace_diff_rewind_and_fork_with_files_over_http(tmp_path: Path) -> None:
    """The daemon's diff and rewind routes and a fork with files, through the client."""
    daemon = Daemon(tmp_path, WORKSPACE_SCRIPT, tools="perdure.tools.workspace:TOOLS").start()
    (daemon.workspace / "keep.txt").write_text("kept\n")

    async def scenario(client: Any) -> None:
        await client.create_session("w")
        await client.submit("w", "write it")
        await client.wait_idle("w")
        (diff,) = await client.workspace_diff("w")
        assert (diff.tool_name, diff.changed) == ("write_file", ("a.txt",))
        assert "+one" in diff.patch
        assert [d.call_id for d in await client.workspace_diff("w", diff.call_id)] == [diff.call_id]
        done = await client.rewind("w", to=diff.call_id, request_id="rw")
        assert (done.tree, done.before) == (diff.before, diff.after)
        assert not (daemon.workspace / "a.txt").exists()
        assert (daemon.workspace / "keep.txt").read_text() == "kept\n"
        assert (await client.rewind("w", to=diff.call_id, request_id="rw")).duplicate
        with pytest.raises(perdure.Refused):
            await client.rewind("w", to="no-such-call")
        forked = await client.fork("w", session_id="w2", files=True)
        assert forked.session_id == "w2"
        assert (daemon.workspace / "a.txt").read_text() == "one\n"

    try:
        run("sync", daemon, scenario)
    finally:
        daemon.close()
