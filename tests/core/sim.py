"""A tiny driver that plays the trio shell around the pure core, for fast unit tests.

``Session`` feeds commands and results to ``decide``, keeps what would be
committed, folds it into the state, and can simulate a restart (fold the kept
records from scratch, nothing in flight, ``recover``).
"""

from __future__ import annotations

from typing import Any

import perdure
from perdure.actors import decide, protocol
from perdure.actors.protocol import Env, Reconcile, RunTool, Step, View
from perdure.actors.state import SessionState
from perdure.providers.base import ModelReply
from perdure.settings import Limits
from perdure.storage import codec
from perdure.storage.records import Committed, Record, SessionCreated, ToolCall, ToolCompleted


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def lookup(query: str, limit: int = 3) -> str:
    """Look up."""
    return query


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def send(text: str) -> str:
    """Send."""
    return text


async def _reconcile(ctx: perdure.ToolContext, text: str) -> perdure.Reconciled:
    return perdure.Reconciled.unknown()


@perdure.tool(name="send_checked", replay=perdure.ReplayPolicy.NEVER, reconcile=_reconcile)
async def send_checked(text: str) -> str:
    """Send, with a reconcile."""
    return text


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, requires_approval=True)
async def deploy(target: str) -> str:
    """Deploy."""
    return target


TOOLS = {t.name: t for t in (lookup, send, send_checked, deploy)}


class Session:
    """Plays the trio shell: decide, settle, 'commit' (keep), fold."""

    def __init__(self, tools: dict[str, Any] | None = None, **env: Any) -> None:
        self.state = SessionState("s1")
        self.log: list[Record] = []
        self.tools = TOOLS if tools is None else tools
        self.env_options = env
        self.now = 1000.0
        self.view = View()
        self._commit(Step((SessionCreated(session_id="s1", at=self.now),)))

    def env(self) -> Env:
        return Env(tools=self.tools, now=self.now, limits=Limits(**self.env_options))

    def _commit(self, first: Step, *, recovering: bool = False) -> Step:
        step = decide.settle(self.state, self.env(), self.view, first, recovering=recovering)
        for record in step.records:
            # What the core decides is what a restart reads back: every field well typed,
            # so the strict codec returns the very record (a None id would not decode).
            seq = len(self.log) + 1
            assert codec.decode(seq, codec.encode(record, seq)) == record, record
            # Every result records the goal revision its call answered, whichever row
            # decided it (a run, a retry given up, a reconcile, a person's answer).
            if isinstance(record, ToolCompleted) and record.call_id in self.state.tasks:
                answered = self.state.tasks[record.call_id].goal_rev
                assert record.goal_rev == answered, (record, answered)
            self.log.append(record)
        for effect in step.effects:  # the shell marks what it started
            if isinstance(effect, protocol.CallModel):
                self.view = View(
                    models=self.view.models | {effect.generation_id}, tools=self.view.tools
                )
            elif isinstance(effect, protocol.Summarize):
                self.view = View(
                    models=self.view.models | {effect.compaction_id}, tools=self.view.tools
                )
            elif isinstance(effect, protocol.RunTool | protocol.Reconcile):
                self.view = View(models=self.view.models, tools=self.view.tools | {effect.call_id})
        return step

    def command(self, cmd: protocol.Command) -> tuple[Step, protocol.Answer]:
        first, answer = decide.command(self.state, self.env(), cmd)
        return self._commit(first), answer

    def result(self, result: protocol.Result) -> Step:
        if isinstance(result, protocol.ModelReplied | protocol.ModelFailed):
            self.view = View(
                models=self.view.models - {result.generation_id}, tools=self.view.tools
            )
        else:
            self.view = View(models=self.view.models, tools=self.view.tools - {result.call_id})
        return self._commit(decide.on_result(self.state, self.env(), result))

    def reply(self, text: str, *calls: tuple[str, str, dict[str, Any]]) -> Step:
        gen = self.state.current_generation()
        assert gen is not None
        tool_calls = tuple(ToolCall(call_id=c, name=n, input=i) for c, n, i in calls)
        return self.result(
            protocol.ModelReplied(
                gen.generation_id, gen.attempt, ModelReply(text=text, tool_calls=tool_calls)
            )
        )

    def fail_model(self, error: str = "overloaded_error: busy", **kw: Any) -> Step:
        """The current model attempt fails; retryable unless ``retryable=False``."""
        gen = self.state.current_generation()
        assert gen is not None
        return self.result(
            protocol.ModelFailed(
                **{
                    "generation_id": gen.generation_id,
                    "attempt": gen.attempt,
                    "error": error,
                    "retryable": True,
                    **kw,
                }
            )
        )

    def finish_tool(self, call_id: str, output: str = "ok", **kw: Any) -> Step:
        task = self.state.tasks[call_id]
        return self.result(
            protocol.ToolFinished(
                **{
                    "call_id": call_id,
                    "attempt": task.attempt,
                    "outcome": "ok",
                    "output": output,
                    **kw,
                }
            )
        )

    def restart(self, **env: Any) -> Step:
        """A new process: fold the kept log from scratch, nothing in flight, recover."""
        self.state = SessionState.fold(
            "s1", [decide_committed(i, r) for i, r in enumerate(self.log, start=1)]
        )
        self.view = View()
        self.env_options.update(env)
        return self._commit(decide.recover(self.state, self.env()), recovering=True)


def decide_committed(seq: int, record: Record) -> Committed:
    return Committed(seq, record)


def kinds(step: Step) -> list[str]:
    return [type(r).__name__ for r in step.records]


def runs(step: Step) -> list[tuple[str, int]]:
    """The tool attempts a step starts: (call id, attempt)."""
    return [(e.call_id, e.executing.attempt) for e in step.effects if isinstance(e, RunTool)]


def reconciles(step: Step) -> list[str]:
    """The calls a step asks to reconcile."""
    return [e.call_id for e in step.effects if isinstance(e, Reconcile)]


def only(records: list[Record] | tuple[Record, ...], kind: type) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, requires_approval=True)
async def close_ticket(ctx: perdure.ToolContext, result: str, title: str) -> str:
    """Close the ticket a create_ticket call opened."""
    return f"closed {result}"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, compensate=close_ticket)
async def create_ticket(ctx: perdure.ToolContext, title: str) -> str:
    """Open a ticket."""
    return "T-1"


async def _release(ctx: perdure.ToolContext, result: str, **args: Any) -> str:
    return "released"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, compensate=_release, compensate_automatically=True)
async def hold_seat(ctx: perdure.ToolContext, seat: str) -> str:
    """Hold a seat (released automatically when the plan changes)."""
    return f"held {seat}"


COURSE_TOOLS = {**TOOLS, **{t.name: t for t in (create_ticket, hold_seat)}}
