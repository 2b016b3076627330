"""A runtime in a child process, for crash tests: ``python -m tests.tools.child WORKDIR [flags]``.

The parent writes ``WORKDIR/plan.json`` (the tool uses of the model's first turn,
and the port of a local service if one is needed), runs this program (possibly with
``PERDURE_FAULT`` set, or kills it with SIGKILL itself), and runs it again on the
same log to check what recovery did. Every run submits the same input with the same
request id (a duplicate after the first run), waits until the session is idle and
writes ``WORKDIR/summary.json``: each task's phase, attempt, idempotency key and
result as recorded, the recovery decisions, and the tool results in the transcript.

The test tools write ``ws/ledger.jsonl`` (one line per real execution), so the
parent can count side effects.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import Reconciled, ReplayPolicy, ToolContext, tool
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import ToolAwaitingApproval
from perdure.tools.workspace import workspace_tools
from perdure.view import SessionLookup
from tests.support.fold import fold_of

SESSION = "s"
WORKDIR = Path(".")


def _ledger() -> Path:
    return WORKDIR / "ws" / "ledger.jsonl"


async def _note(ctx: ToolContext, tool_name: str, **data: Any) -> None:
    line = json.dumps(
        {"tool": tool_name, "key": ctx.idempotency_key, "attempt": ctx.attempt, **data}
    )

    def write() -> None:
        with open(_ledger(), "a") as f:
            f.write(line + "\n")

    await trio.to_thread.run_sync(write)


def ledger_entries() -> list[dict[str, Any]]:
    path = _ledger()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@tool(replay=ReplayPolicy.KEYED)
async def ledger(ctx: ToolContext, note: str) -> str:
    """Note something, idempotently by key (a stand-in for a deduplicating service)."""
    await _note(ctx, "ledger", note=note)
    return f"noted {note}"


async def _found_in_ledger(ctx: ToolContext, note: str) -> Reconciled:
    for entry in ledger_entries():
        if entry["key"] == ctx.idempotency_key:
            return Reconciled.applied(f"noted {note} (found in the ledger)")
    return Reconciled.not_applied()


@tool(replay=ReplayPolicy.NEVER, reconcile=_found_in_ledger)
async def note_checked(ctx: ToolContext, note: str) -> str:
    """Note something; reconcile looks for the call's key in the ledger."""
    await _note(ctx, "note_checked", note=note)
    return f"noted {note}"


async def _cannot_tell(ctx: ToolContext, note: str) -> Reconciled:
    return Reconciled.unknown("the ledger is offline; cannot tell")


@tool(replay=ReplayPolicy.NEVER, reconcile=_cannot_tell)
async def note_unsure(ctx: ToolContext, note: str) -> str:
    """Note something; reconcile cannot tell."""
    await _note(ctx, "note_unsure", note=note)
    return f"noted {note}"


async def _raises(ctx: ToolContext, note: str) -> Reconciled:
    raise RuntimeError("ledger index corrupt")


@tool(replay=ReplayPolicy.NEVER, reconcile=_raises)
async def note_broken(ctx: ToolContext, note: str) -> str:
    """Note something; reconcile raises."""
    await _note(ctx, "note_broken", note=note)
    return f"noted {note}"


@tool(replay=ReplayPolicy.NEVER)
async def note_plain(ctx: ToolContext, note: str) -> str:
    """Note something; no reconcile."""
    await _note(ctx, "note_plain", note=note)
    return f"noted {note}"


@tool(replay=ReplayPolicy.NEVER, reconcile=_found_in_ledger)
async def slow_note(ctx: ToolContext, note: str) -> str:
    """Note something after a while; reconcile looks for the call's key in the ledger."""
    await trio.sleep(2)
    await _note(ctx, "slow_note", note=note)
    return f"noted {note}"


async def _transfer_done(ctx: ToolContext, amount: int) -> Reconciled:
    for entry in ledger_entries():
        if entry["key"] == ctx.idempotency_key:
            return Reconciled.applied(f"transferred {amount} (found in the ledger)")
    return Reconciled.not_applied()


@tool(
    replay=ReplayPolicy.NEVER,
    reconcile=_transfer_done,
    requires_approval=lambda args: args["amount"] > 100,
)
async def transfer(ctx: ToolContext, amount: int) -> str:
    """Transfer money; amounts above 100 need a human's approval."""
    await _note(ctx, "transfer", amount=amount)
    return f"transferred {amount}"


@tool(replay=ReplayPolicy.KEYED, timeout=10)
async def create_object(ctx: ToolContext, name: str) -> str:
    """Create an object on the local deduplicating service."""
    port = json.loads((WORKDIR / "plan.json").read_text())["port"]

    def post() -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/objects",
            data=json.dumps({"name": name}).encode(),
            headers={"Idempotency-Key": ctx.idempotency_key, "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)  # type: ignore[no-any-return]

    created = await trio.to_thread.run_sync(post)
    await _note(ctx, "create_object", object_id=created["id"])
    return f"created {created['id']}"


def _sync_note(ctx: ToolContext, tool_name: str, note: str) -> str:
    """A plain ``def`` tool's body: note the start, and on the first attempt write the
    marker and block (the parent kills the process while this thread sleeps)."""
    line = json.dumps(
        {"tool": tool_name, "key": ctx.idempotency_key, "attempt": ctx.attempt, "note": note}
    )
    with open(_ledger(), "a") as f:
        f.write(line + "\n")
    if ctx.attempt == 1:
        (WORKDIR / "marker").write_text("in the thread")
        time.sleep(60)
    return f"noted {note}"


@tool(replay=ReplayPolicy.KEYED)
def sync_keyed(ctx: ToolContext, note: str) -> str:
    """A plain def tool, KEYED: re-run with the same key after a crash."""
    return _sync_note(ctx, "sync_keyed", note)


@tool(replay=ReplayPolicy.NEVER)
def sync_never(ctx: ToolContext, note: str) -> str:
    """A plain def tool, NEVER: an unknown outcome after a crash, not re-run."""
    return _sync_note(ctx, "sync_never", note)


@tool(replay=ReplayPolicy.NEVER, changes_workspace=True)
async def render_and_post(ctx: ToolContext, name: str) -> str:
    """A declared workspace tool with an effect outside it (here, a post nobody can
    check): it writes two files of the workspace, then 'posts' them."""

    def write() -> None:
        (WORKDIR / "ws" / f"{name}.html").write_text(f"<h1>{name}</h1>\n")
        (WORKDIR / "ws" / f"{name}.txt").write_text(f"{name}\n")

    await trio.to_thread.run_sync(write)
    return f"rendered and posted {name}"


TEST_TOOLS = [
    render_and_post,
    sync_keyed,
    sync_never,
    ledger,
    note_checked,
    note_unsure,
    note_broken,
    note_plain,
    slow_note,
    transfer,
    create_object,
]


async def _phase(rt: perdure.Runtime, call_id: str) -> str | None:
    def get(state: SessionLookup) -> str | None:
        task = state.task_view(call_id)
        return None if task is None else task.phase

    return await rt.state(SESSION, get)


async def _wait_phase(rt: perdure.Runtime, call_id: str, phase: str) -> None:
    with trio.fail_after(15):
        while await _phase(rt, call_id) != phase:  # noqa: ASYNC110 (a query, not an event)
            await trio.sleep(0.02)


def _summary(state: Any, transcript: list[Any], extra: dict[str, Any]) -> dict[str, Any]:
    tasks = {}
    for call_id, task in state.tasks.items():
        result = task.result
        tasks[call_id] = {
            "tool": task.tool_name,
            "phase": task.phase,
            "attempt": task.attempt,
            "key": task.executing.idempotency_key if task.executing else None,
            "record": type(result).__name__ if result is not None else None,
            "kind": getattr(result, "kind", None),
            "output": getattr(result, "output", None),
            "is_error": getattr(result, "is_error", None),
            "reason": getattr(result, "reason", None),
        }
    results = {}
    for message in transcript:
        for block in message.content:
            if hasattr(block, "tool_use_id"):
                results[block.tool_use_id] = {"content": block.content, "is_error": block.is_error}
    outcome = state.last_outcome
    return {
        "tasks": tasks,
        "decisions": [
            {"subject": d.subject, "found": d.found, "action": d.action, "reason": d.reason}
            for d in state.decisions
        ],
        "results": results,
        "outcome": None if outcome is None else outcome.status,
        "final_text": None if outcome is None else outcome.final_text,
        **extra,
    }


async def main(args: argparse.Namespace) -> None:
    plan = json.loads((WORKDIR / "plan.json").read_text())
    uses = [ToolUse(u["name"], u.get("input", {})) for u in plan["uses"]]
    if plan.get("sequential"):  # one call per model turn, in order
        replies = [Reply(tool_uses=[use]) for use in uses]
    else:
        replies = [Reply(tool_uses=uses)]
    provider = ScriptedProvider([*replies, Reply(text="all done")])
    tools = [*TEST_TOOLS, *workspace_tools(include_bash=True)]
    extra: dict[str, Any] = {}
    async with perdure.open_runtime(
        WORKDIR / "log", provider=provider, tools=tools, workspace=WORKDIR / "ws"
    ) as rt:
        await rt.create_session(SESSION)
        if args.phase_of:
            extra["phase_at_start"] = await _phase(rt, args.phase_of)
        await rt.submit(SESSION, "do the plan", request_id="r1")
        if args.await_approval:
            await _wait_phase(rt, args.await_approval, "awaiting_approval")
            (WORKDIR / "marker").write_text("awaiting")
            await trio.sleep_forever()
        if args.pause_and_approve:
            await _wait_phase(rt, args.pause_and_approve, "awaiting_approval")
            await rt.pause(SESSION, request_id="pause-1")
            await rt.approve(SESSION, args.pause_and_approve, approved=True, request_id="ok-1")
            (WORKDIR / "marker").write_text("approved")
            await trio.sleep_forever()
        if args.pause_while:
            await _wait_phase(rt, args.pause_while, "executing")
            await rt.pause(SESSION, request_id="pause-1")
            (WORKDIR / "marker").write_text("paused")
            await trio.sleep_forever()
        if args.approve:
            await _wait_phase(rt, args.approve, "awaiting_approval")
            await rt.approve(SESSION, args.approve, approved=True, request_id="ok-1")
        if args.resume:
            await rt.resume(SESSION, request_id="resume-1")
        await rt.wait_idle(SESSION)
        if args.rewind_to:
            to = int(args.rewind_to) if args.rewind_to.isdigit() else args.rewind_to
            done = await rt.rewind(SESSION, to=to, request_id=f"rewind-{args.rewind_to}")
            extra["rewound"] = {"tree": done.tree, "before": done.before}
        state = await fold_of(rt, SESSION)
        extra["checkpoints"] = [
            {"call_id": m.call_id, "before": m.before, "after": m.after, "changed": m.changed}
            for m in state.checkpoints
        ]
        transcript = await rt.transcript(SESSION)
        asked = 0
        async for event in rt.events(SESSION, live=False):
            asked += isinstance(event.record, ToolAwaitingApproval)
        extra["approval_requests"] = asked
    summary = _summary(state, transcript, extra)
    (WORKDIR / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--phase-of", help="report this call's phase right after recovery")
    parser.add_argument("--await-approval", help="wait until this call awaits approval, hang")
    parser.add_argument("--pause-and-approve", help="pause, approve this call, then hang")
    parser.add_argument("--pause-while", help="pause while this call executes, then hang")
    parser.add_argument("--approve", help="approve this call")
    parser.add_argument("--resume", action="store_true", help="resume the paused session")
    parser.add_argument("--rewind-to", help="once idle, rewind the files to this call or seq")
    ns = parser.parse_args()
    WORKDIR = ns.workdir
    trio.run(main, ns)
    sys.exit(0)
