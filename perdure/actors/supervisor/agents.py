"""The supervisor's sub-agents job: a tool call's child sessions, and orphans after a crash.

A tool runs a sub-agent with ``ctx.run_agent(task)``; the tool actor hands that to
``SubAgents.run``, which the supervisor gives its actors (``ActorContext.agents``), so
the actors reach the sessions through the object that owns them, never through the
runtime's public face. A child is a session of its own, named after the parent call's
idempotency key and its place among the call's sub-agents (``child_session_id``), so
every step is idempotent: a re-run of the call after a crash finds the child it
started (created once with its task, in one commit), links it again, and waits for the
outcome the child reached meanwhile. The parent learns of its child through ``link``
(an ``AgentStarted`` record): its stream, pause, resume and cancel reach the child.

Orphans (``stop_orphans``): a crash between a parent's cancel (or revision) and its
child's leaves a child nobody waits for. Once every session of this process has
recovered, and so every parent's recovery has settled its calls, each recovered
sub-agent is checked against its parent call (``decide.sessions.orphaned`` decides;
this reads the two logs and sends the cancel).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

import trio

from perdure import retention
from perdure.actors import protocol
from perdure.actors.decide.sessions import orphaned
from perdure.actors.mailbox import CommandMsg
from perdure.errors import Refused
from perdure.storage import LogError
from perdure.storage.records import SessionCreated, ToolExecuting

if TYPE_CHECKING:
    from perdure.actors.supervisor.lifecycle import Supervisor

log = logging.getLogger("perdure.supervisor")

AGENT_MARK = ".agent-"  # in every sub-agent's session id


def child_session_id(call: ToolExecuting, n: int) -> str:
    """The session id of the ``n``-th sub-agent of a call: stable across re-runs."""
    digest = hashlib.sha256(f"{call.idempotency_key}\x00{n}".encode()).hexdigest()[:16]
    return f"{call.session_id[:96]}{AGENT_MARK}{digest}"


class SubAgents:
    """Runs the sub-agents of tool calls as child sessions of ``sessions``' supervisor."""

    def __init__(self, sessions: Supervisor, caller_trace: Callable[[], str] | None) -> None:
        self._sessions = sessions
        # The caller's current trace context, when tracing is on (perdure.observability).
        self._caller_trace = caller_trace

    async def run(
        self,
        call: ToolExecuting,
        n: int,
        task: str,
        system: str | None,
        tools: list[str] | None,
        stopping: Callable[[], bool],
        link: Callable[[str], Awaitable[None]],
    ) -> str:
        """The ``n``-th sub-agent of a tool call, run to its outcome; its final text.

        ``stopping`` says whether the parent call was told to stop (a cancel, a
        revision), as opposed to the runtime shutting down: only then is the child
        cancelled with it. ``link`` records the child in the parent once it exists.
        """
        sup = self._sessions
        if tools is not None:
            unknown = sorted(set(tools) - set(sup.ctx.tools))
            if unknown:
                raise ValueError(f"run_agent: no tool named {', '.join(unknown)}")
        tools = await self._grant(call.session_id, tools)
        child = child_session_id(call, n)
        parent = f"{call.session_id}/{call.call_id}"
        # The child is created with its task in one commit: it never exists without it,
        # so it always reaches an outcome (a crash or a cancel right after included).
        submit = protocol.Submit(
            request_id=f"agent:{call.idempotency_key}:{n}",
            text=task,
            traceparent=self._caller_trace() if self._caller_trace is not None else "",
        )
        with trio.CancelScope(shield=True):  # the commit happens; its caller must learn it
            created = await sup.create_session(
                child, system, None, None, parent=parent, tools=tools, task=submit
            )
        # The parent records its child (once it exists): its stream and its pause,
        # resume and cancel reach the child through that link.
        await link(child)
        try:
            if not created:  # found again by a re-run of the call: submitted once, by its id
                await sup.ask(child, lambda: CommandMsg[protocol.Accepted](submit))
            outcome = await sup.wait_idle(child)
        except trio.Cancelled:
            # (A submit already handed to the child's mailbox is taken before this cancel.)
            if stopping():  # the parent's run was cancelled or revised: so is the child's
                with trio.CancelScope(shield=True):
                    await self._cancel(child, f"agent-stop:{call.idempotency_key}:{n}")
            raise
        if outcome is None or outcome.status != "completed":
            status = outcome.status if outcome is not None else "no outcome"
            why = f": {outcome.reason}" if outcome is not None and outcome.reason else ""
            raise RuntimeError(f"the sub-agent {child} did not complete ({status}{why})")
        return outcome.final_text

    async def stop_orphans(self, sessions: Iterable[str]) -> list[str]:
        """Cancel the recovered sub-agents whose parent call is over without them: the
        core decides (``decide.sessions.orphaned``), this reads what it needs and tells them."""
        journal = self._sessions.journal
        stopped: list[str] = []
        # Only ids named as sub-agents (``child_session_id``) can be one: no read for others.
        for sid in (s for s in sessions if AGENT_MARK in s):
            try:
                first = await journal.read_session(sid, 0, 1)
                stop = orphaned(first, await retention.parent_history(journal, first))
                if stop is not None:
                    await self._cancel(sid, stop.request_id)
                    stopped.append(sid)
            except (LogError, Refused) as exc:
                # The log cannot be read now, or the child cannot be told: it runs on,
                # and the next start looks again.
                log.warning("sub-agent %s: its parent call could not be checked: %s", sid, exc)
        return stopped

    async def _cancel(self, child: str, request_id: str) -> protocol.Done:
        command = protocol.Cancel(request_id)
        return await self._sessions.ask(child, lambda: CommandMsg[protocol.Done](command))

    async def _grant(self, parent: str, asked: list[str] | None) -> list[str] | None:
        """A sub-agent's grant: what it asked for, never more than its parent's grant
        (a child of a limited session asking for nothing gets the parent's grant)."""
        first = await self._sessions.journal.read_session(parent, 0, 1)
        created = first[0].record if first else None
        if not isinstance(created, SessionCreated) or created.tools is None:
            return asked
        if asked is None:
            return list(created.tools)
        beyond = [n for n in asked if n not in created.tools]
        if beyond:
            raise ValueError(
                f"run_agent: {', '.join(beyond)} not granted to session {parent} "
                "(a sub-agent gets at most its parent's tools)"
            )
        return asked
