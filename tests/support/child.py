"""A runtime in a child process, driven by a JSON plan; used by every crash test.

    python -m tests.support.child PLAN_JSON

The plan names the log, the workspace, the scripted replies, the tools (from
``ledger_tools``) and, per session, the inputs to submit (with request ids, so a
restarted child re-submits the same inputs and relies on deduplication). The child
opens the runtime (which recovers whatever a previous child left), submits, waits
until every session is idle, prints one JSON line per session with its outcome,
and exits 0. Faults come from PERDURE_FAULT in the environment.

The log may be a directory or a ``postgresql://`` URL; then several children can
run at once on it as nodes (options ``node_id``, ``lease_ttl``, ``takeover``,
``rebalance``). A
session taken over by another node while this one waits is reported as
``{"session": sid, "lost": why}``. With ``"linger": true`` the child stays up after
its own sessions are idle, serving (taking over a dead node's sessions) until no
session of the log has unfinished work (and at least ``expect_sessions`` exist).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from contextlib import aclosing
from typing import Any

import trio

import perdure
from perdure.providers.scripted import Reply, ScriptedProvider, _converter
from perdure.view import SessionLookup
from tests.support import ledger_tools


async def main(plan: dict[str, Any]) -> None:
    replies = _converter.structure(plan["script"], list[Reply])
    by_system = _converter.structure(plan.get("by_system", {}), dict[str, list[Reply]])
    wanted = plan.get("tools")
    # Suites may bring their own ledger tools: "module:ATTR" names a list of them.
    extra = []
    for spec in plan.get("extra_tools", []):
        module, _, attr = spec.partition(":")
        extra += getattr(importlib.import_module(module), attr)
    available = ledger_tools.ALL_TOOLS + extra
    tools = [t for t in available if wanted is None or t.name in wanted]
    # A later deploy may change a tool's declared policy; recovery must honour both.
    for name, policy in plan.get("policy_override", {}).items():
        tools = [
            perdure.tool(name=t.name, replay=perdure.ReplayPolicy(policy))(t.fn)
            if t.name == name
            else t
            for t in tools
        ]
    options = plan.get("options", {})
    telemetry: Any = "auto"
    if plan.get("trace_file"):  # spans exported to a file as each ends (SIGKILL-proof)
        from tests.observability.spans import file_tracing

        telemetry = file_tracing(plan["trace_file"])
    log_options = {k: options[k] for k in ("node_id", "lease_ttl", "takeover") if k in options}
    async with perdure.open_runtime(
        plan["log"],
        provider=ScriptedProvider(replies, by_system),
        tools=tools,
        workspace=plan["workspace"],
        retry_base=options.get("retry_base", 0.05),
        resume_budget=options.get("resume_budget", 3),
        shutdown_grace=options.get("shutdown_grace", 10.0),
        budget=perdure.Budget(**options["budget"]) if "budget" in options else None,
        rebalance=options.get("rebalance", True),
        telemetry=telemetry,
        **log_options,
    ) as rt:
        started = {
            "started": True,
            "recovered": rt.recovered_sessions,
            "node": rt.node_id,
            "pid": os.getpid(),
        }
        print(json.dumps(started), flush=True)
        sessions: dict[str, list[dict[str, str]]] = plan["sessions"]
        for sid, inputs in sessions.items():
            grant = plan.get("grants", {}).get(sid)  # the session's tools (None: all)
            await rt.create_session(sid, system=plan.get("system"), tools=grant)
            for item in inputs:
                await rt.submit(
                    sid,
                    item["text"],
                    request_id=item["request_id"],
                    traceparent=item.get("traceparent"),
                )
        for action in plan.get("actions", []):
            try:
                await _act(rt, action)
            except perdure.Refused as exc:
                # A restarted child repeats its actions; one that no longer applies
                # (e.g. a revision after the run finished) is refused, and that is fine.
                print(json.dumps({"refused": action["kind"], "why": str(exc)}), flush=True)
        if plan.get("wait", True):
            for sid in [*sessions, *plan.get("also_wait", [])]:
                try:
                    outcome = await rt.wait_idle(sid)
                except perdure.Refused as exc:
                    if exc.code != "not_owner":
                        raise
                    print(json.dumps({"session": sid, "lost": str(exc)}), flush=True)
                    continue
                print(
                    json.dumps(
                        {
                            "session": sid,
                            "status": outcome.status if outcome else None,
                            "final_text": outcome.final_text if outcome else None,
                            "reason": outcome.reason if outcome else None,
                        }
                    ),
                    flush=True,
                )
        if plan.get("linger"):
            await _linger(rt, plan.get("expect_sessions", 0))
        print(json.dumps({"taken_over": rt.taken_over_sessions}), flush=True)
        moved = {"received": rt.received_sessions, "handed_over": rt.handed_over_sessions}
        print(json.dumps(moved), flush=True)
        print(json.dumps({"stats": [rt.stats().appends, rt.stats().transactions]}), flush=True)


async def _linger(rt: perdure.Runtime, expect: int) -> None:
    """Serve until every session of the log is idle (the other nodes' ones too)."""
    while True:
        infos = await rt.sessions()
        if len(infos) >= expect and all(i.open_submissions == 0 for i in infos):
            return
        await trio.sleep(0.2)


async def _act(rt: perdure.Runtime, action: dict[str, Any]) -> None:
    kind = action["kind"]
    if kind == "sleep":
        await trio.sleep(action["seconds"])
    elif kind == "cancel":
        await rt.cancel(action["session"], request_id=action["request_id"])
    elif kind == "pause":
        await rt.pause(action["session"], request_id=action["request_id"])
    elif kind == "resume":
        await rt.resume(action["session"], request_id=action["request_id"])
    elif kind == "approve":
        await rt.approve(
            action["session"],
            action["call_id"],
            approved=action.get("approved", True),
            request_id=action["request_id"],
        )
    elif kind == "revise":
        await rt.revise(action["session"], action["text"], request_id=action["request_id"])
    elif kind == "submit":
        await rt.submit(
            action["session"],
            action["text"],
            request_id=action["request_id"],
            if_busy=action.get("if_busy"),
        )
    elif kind == "compensate":
        await rt.compensate(action["session"], action["call_id"], request_id=action["request_id"])
    elif kind == "resolve":
        await rt.resolve(
            action["session"],
            action["call_id"],
            action=action["action"],
            result=action.get("result"),
            request_id=action["request_id"],
        )
    elif kind == "fork":
        forked = await rt.fork(
            action["session"],
            at=action.get("at"),
            session_id=action.get("fork"),
            request_id=action["request_id"],
        )
        print(json.dumps({"forked": forked.session_id, "position": forked.position}), flush=True)
        for item in action.get("inputs", []):
            await rt.submit(forked.session_id, item["text"], request_id=item["request_id"])
    elif kind == "wait_for":
        await _wait_for(rt, action["session"], action["record"], action.get("where", {}))
    elif kind == "state":
        # Through the session's actor, so answered once its recovery step is committed
        # and everything queued before it is handled: a barrier, not a guess of time.
        seen = await rt.state(action["session"], _phases)
        print(json.dumps({"state": action["session"], **seen}), flush=True)
    else:
        raise ValueError(f"unknown action {kind!r}")


def _phases(state: SessionLookup) -> dict[str, Any]:
    tasks = {t.call_id: t.phase for t in state.task_views()}
    return {"paused": state.view().paused, "tasks": tasks}


async def _wait_for(
    rt: perdure.Runtime, session: str, record: str, where: dict[str, Any] | None = None
) -> None:
    """Block until a record of that type (with the fields ``where`` gives) is committed
    in the session (replay or live)."""
    async with aclosing(rt.events(session)) as events:
        async for event in events:
            fields = where or {}
            if event.kind == record and all(
                getattr(event.record, k, None) == v for k, v in fields.items()
            ):
                return


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
