"""A runtime with the shop MCP server, in a child process to be killed: crash tests.

``python -m tests.mcp_servers.child WORKDIR [--phase-of CALL] [--await-approval CALL]``

``WORKDIR/plan.json`` holds the tool uses of the model's first turn. The child opens
the runtime on ``WORKDIR/log`` with the shop server over stdio (annotations trusted;
its ledger is ``WORKDIR/ledger``), submits the same input with the same request id on
every run, waits until the session is idle and writes ``WORKDIR/summary.json``. The
parent kills it (``PERDURE_FAULT``, or SIGKILL when it sees what it waits for) and
runs it again on the same log.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import Reconciled, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.tools.mcp import McpServer
from perdure.view import SessionLookup
from tests.support.fold import fold_of

SESSION = "s"
SERVER = Path(__file__).with_name("shop_server.py")


async def _phase(rt: perdure.Runtime, call_id: str) -> str | None:
    def get(state: SessionLookup) -> str | None:
        task = state.task_view(call_id)
        return None if task is None else task.phase

    return await rt.state(SESSION, get)


async def _in_the_ledger(ctx: ToolContext, line: str) -> Reconciled:
    """Did the shop append ``line`` for this call? Its ledger has the request's key."""
    path = WORK / "ledger"
    entries = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    for entry in entries:
        if entry["tool"] == "append" and entry["key"] == ctx.idempotency_key:
            return Reconciled.applied(f"appended {entry['line']} (found in the shop's ledger)")
    return Reconciled.not_applied()


WORK = Path(".")


async def main(args: argparse.Namespace) -> None:
    work: Path = args.workdir
    plan = json.loads((work / "plan.json").read_text())
    uses = [ToolUse(name, input) for name, input in plan["uses"]]
    provider = ScriptedProvider([Reply(tool_uses=uses), Reply(text="all done")])
    overrides = {"append": {"reconcile": _in_the_ledger}} if args.reconcile else {}
    if args.url:  # the shop over streamable HTTP, run by the test
        shop = McpServer.http("shop", args.url, trust_annotations=True, overrides=overrides)
    else:
        shop = McpServer.stdio(
            "shop",
            sys.executable,
            [str(SERVER)],
            env={"SHOP_LEDGER": str(work / "ledger"), "SHOP_VARIANT": args.variant or ""},
            trust_annotations=True,
            overrides=overrides,
        )
    extra: dict[str, Any] = {}
    async with perdure.open_runtime(work / "log", provider=provider, mcp_servers=[shop]) as rt:
        await rt.create_session(SESSION)
        if args.phase_of:
            extra["phase_at_start"] = await _phase(rt, args.phase_of)
        await rt.submit(SESSION, "do the plan", request_id="r1")
        if args.await_approval:
            with trio.fail_after(30):
                while await _phase(rt, args.await_approval) != "awaiting_approval":  # noqa: ASYNC110
                    await trio.sleep(0.02)
            (work / "marker").write_text("awaiting")
            await trio.sleep_forever()
        if args.approve:
            with trio.fail_after(30):
                while await _phase(rt, args.approve) != "awaiting_approval":  # noqa: ASYNC110
                    await trio.sleep(0.02)
            await rt.approve(SESSION, args.approve, approved=True, request_id="ok-1")
        with trio.fail_after(60):
            await rt.wait_idle(SESSION)
        state = await fold_of(rt, SESSION)
    tasks = {}
    for call_id, task in state.tasks.items():
        result = task.result
        tasks[call_id] = {
            "phase": task.phase,
            "attempt": task.attempt,
            "key": task.executing.idempotency_key if task.executing else None,
            "replay": task.executing.replay if task.executing else None,
            "policy_reason": task.executing.policy_reason if task.executing else None,
            "output": getattr(result, "output", None),
            "is_error": getattr(result, "is_error", None),
        }
    summary = {
        "tasks": tasks,
        "decisions": [
            {"subject": d.subject, "found": d.found, "action": d.action, "reason": d.reason}
            for d in state.decisions
        ],
        "outcome": None if state.last_outcome is None else state.last_outcome.status,
        **extra,
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--phase-of", help="report this call's phase right after recovery")
    parser.add_argument("--await-approval", help="wait until this call awaits approval, hang")
    parser.add_argument("--approve", help="approve this call once it awaits approval")
    parser.add_argument("--variant", help="SHOP_VARIANT of the server (changed, gone)")
    parser.add_argument("--reconcile", action="store_true", help="append gets a reconcile")
    parser.add_argument("--url", help="connect to the shop at this streamable HTTP URL")
    ns = parser.parse_args()
    WORK = ns.workdir
    trio.run(main, ns)
    sys.exit(0)
