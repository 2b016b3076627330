"""A person's command applied to a log that no process owns: recorded, nothing run.

``perdure cancel``, ``approve``, ``deny``, ``resolve``, ``pause``, ``resume`` and
``revise`` talk to the daemon that owns a log. When no process owns it, they come
here: take the log for a moment (as ``perdure prune`` does), fold the one session
from its records, let the pure core decide the command exactly as the session actor
would (``decide.command``: the same refusals, the same request-id deduplication),
commit the records it decided under the session's goal-revision guard in one
append, and give the log back.

Nothing else is decided or performed here: no recovery, no dispatch, no model call,
no tool. What the command makes possible (an approved call to run, a cancelled run
to wind down, a revision to take up) is decided by ``recover`` and ``advance`` in
the next process that owns the log, from the command's records like any others.
So a session whose run was in progress when its process died stays as it was, plus
the command: its next owner's recovery honours it (a cancelled run is finished
``cancelled`` instead of resumed, its executing calls reported with an unknown
outcome; a paused session resumes its run without dispatching anything; an approval,
a resolution or a revision is acted on by the resumed run).

Why not open the runtime on the log: its start recovers and continues every session
with unfinished work, model calls and tool effects included, which is no part of a
person's command (and would need the model, and every tool's reconcile to decide a
crashed call's fate correctly).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import trio
from attrs import evolve

from perdure._runtime import running_children
from perdure.actors import decide, protocol
from perdure.actors.decide.sessions import allowed_tools
from perdure.actors.state import SessionState
from perdure.errors import UnknownSession
from perdure.settings import Settings
from perdure.storage import Guard, open_log
from perdure.storage.journal import Journal, open_journal
from perdure.tools.contract import Tool


class UnownedLog:
    """One log owned by this process for the duration of a command (``owning``)."""

    def __init__(
        self,
        journal: Journal,
        tools: Mapping[str, Tool],
        clock: Callable[[], float],
        settings: Settings,
    ) -> None:
        self.journal = journal
        self.tools = tools
        self.clock = clock
        self.settings = settings

    async def state(self, session_id: str) -> SessionState:
        """The session folded from its records; ``UnknownSession`` if there is none."""
        if await self.journal.session_info(session_id) is None:
            raise UnknownSession(session_id)
        records = await self.journal.read_session(session_id)
        return SessionState.fold(session_id, records)

    async def apply(self, state: SessionState, command: protocol.Command) -> protocol.Done:
        """Decide ``command`` on ``state`` and commit what it records; the answer the
        runtime would give (``Refused`` and its kin when the session cannot take it)."""
        env = protocol.Env(
            tools=allowed_tools(self.tools, state.allowed_tools),
            now=self.clock(),
            limits=self.settings.limits,
        )
        step, answer = decide.command(state, env, command)
        assert isinstance(answer, protocol.Done), "a person's commands answer Done"
        # A command's own decision only records; what follows it is advance's, in the
        # next owner of the log (see the module docstring).
        assert not step.effects, f"{command.kind} decided effects: {step.effects}"
        if step.records:
            committed = await self.journal.append(
                list(step.records), guard=Guard(state.session_id, state.goal_rev)
            )
            if not answer.seq:
                answer = evolve(answer, seq=committed[0].seq)
        if isinstance(command, protocol.Pause | protocol.Resume):
            await self._children(state, command)
        return answer

    async def _children(
        self, state: SessionState, command: protocol.Pause | protocol.Resume
    ) -> None:
        """Pause and resume reach the sub-agents of the session's unfinished calls, with
        request ids derived from the parent's (as ``Runtime.pause`` does)."""
        for child in running_children(state):
            try:
                child_state = await self.state(child)
            except UnknownSession:
                continue  # a sub-agent named before it was created: nothing to hold
            rid = f"{command.request_id}/{child}"
            derived = (
                protocol.Pause(rid) if isinstance(command, protocol.Pause) else protocol.Resume(rid)
            )
            await self.apply(child_state, derived)


@asynccontextmanager
async def owning(
    log_dir: str | os.PathLike[str],
    tools: Mapping[str, Tool],
    clock: Callable[[], float] = time.time,
    *,
    settings: Settings,
) -> AsyncIterator[UnownedLog]:
    """Own the LMDB log at ``log_dir`` for the block (``LogBusy`` if a process does);
    commands are decided under ``settings``, as a runtime opened with them would."""
    log = await trio.to_thread.run_sync(lambda: open_log(log_dir))
    try:
        async with open_journal(log) as journal:
            yield UnownedLog(journal, tools, clock, settings)
    finally:
        await trio.to_thread.run_sync(log.close)
