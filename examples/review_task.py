"""The external-action crash windows, end to end, against a real ticket service.

An agent compares two API spec files in its workspace, finds compatibility risks
and opens a review ticket in a ticket service (``ticket_service.py``, a real HTTP
server on 127.0.0.1). The model is scripted so the example runs offline.

``create_ticket`` is KEYED: it sends perdure's idempotency key as the
``Idempotency-Key`` header, and its ``reconcile`` looks the ticket up by that key.
Each crash window runs in fresh processes — the agent is SIGKILLed, a new process
recovers it:

1. before the request reached the service      (PERDURE_FAULT=tool.before:create_ticket)
2. after the service created the ticket, before perdure recorded it
                                               (PERDURE_FAULT=tool.after:create_ticket)
3. after perdure recorded it                   (PERDURE_FAULT=model.after@3)

In every case exactly one ticket exists afterwards. A second variant uses a
service that does not deduplicate and has no lookup, with a NEVER tool: after a
crash in window 2 nothing is retried automatically, and the model is told the
outcome is unknown.

    python examples/review_task.py          # runs all windows, prints what happened
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure.providers import Reply, ScriptedProvider, ToolUse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ticket_service

OLD_SPEC = {
    "endpoints": {
        "/users": {"fields": ["id", "name", "email"]},
        "/orders": {"fields": ["id", "total", "currency"]},
        "/coupons": {"fields": ["code"]},
    }
}
NEW_SPEC = {
    "endpoints": {
        "/users": {"fields": ["id", "name"]},
        "/orders": {"fields": ["id", "total", "currency", "status"]},
    }
}


def _http(method: str, url: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Idempotency-Key", key)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


# -- tools ------------------------------------------------------------------------------


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def compare_specs(ctx: perdure.ToolContext, old: str, new: str) -> dict[str, Any]:
    """Compare two API spec files of the workspace; list removed endpoints and fields."""
    assert ctx.workspace is not None
    before = json.loads(await trio.Path(ctx.workspace / old).read_text())["endpoints"]
    after = json.loads(await trio.Path(ctx.workspace / new).read_text())["endpoints"]
    risks = [f"endpoint {path} removed" for path in before if path not in after]
    for path, spec in before.items():
        if path in after:
            gone = sorted(set(spec["fields"]) - set(after[path]["fields"]))
            risks += [f"{path}: field '{field}' removed" for field in gone]
    return {"risks": risks}


async def _find_ticket(ctx: perdure.ToolContext, title: str, body: str) -> perdure.Reconciled:
    url = os.environ["TICKET_URL"] + "/tickets?key=" + ctx.idempotency_key
    status, found = await trio.to_thread.run_sync(_http, "GET", url)
    if status == 200:
        return perdure.Reconciled.applied(f"ticket {found['id']} created: {found['title']}")
    if status == 404:
        return perdure.Reconciled.not_applied()
    return perdure.Reconciled.unknown(f"lookup answered {status}")


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, reconcile=_find_ticket)
async def create_ticket(ctx: perdure.ToolContext, title: str, body: str) -> str:
    """Open a review ticket (deduplicated by the service on the idempotency key)."""
    url = os.environ["TICKET_URL"] + "/tickets"
    payload = {"title": title, "body": body}
    status, ticket = await trio.to_thread.run_sync(_http, "POST", url, payload, ctx.idempotency_key)
    if status not in (200, 201):
        raise RuntimeError(f"ticket service answered {status}: {ticket}")
    return f"ticket {ticket['id']} created: {ticket['title']}"


@perdure.tool(name="create_ticket", replay=perdure.ReplayPolicy.NEVER)
async def create_ticket_unchecked(ctx: perdure.ToolContext, title: str, body: str) -> str:
    """Open a review ticket in a service that cannot deduplicate or look tickets up."""
    url = os.environ["TICKET_URL"] + "/tickets"
    status, ticket = await trio.to_thread.run_sync(
        _http, "POST", url, {"title": title, "body": body}
    )
    if status not in (200, 201):
        raise RuntimeError(f"ticket service answered {status}: {ticket}")
    return f"ticket {ticket['id']} created: {ticket['title']}"


SCRIPT = [
    Reply(
        text="Let me compare the two specs.",
        tool_uses=[ToolUse("compare_specs", {"old": "api-v1.json", "new": "api-v2.json"})],
    ),
    Reply(
        text="There are breaking changes; opening a review ticket.",
        tool_uses=[
            ToolUse(
                "create_ticket",
                {
                    "title": "API v2 compatibility review",
                    "body": "v2 removes /coupons and the users.email field.",
                },
            )
        ],
    ),
    Reply(text="I opened the review ticket for the breaking changes."),
]


async def agent(root: Path, variant: str) -> dict[str, Any]:
    tool = create_ticket if variant == "keyed" else create_ticket_unchecked
    async with perdure.open_runtime(
        root / "log",
        provider=ScriptedProvider(SCRIPT),
        tools=[compare_specs, tool],
        workspace=root / "ws",
    ) as rt:
        sid = await rt.create_session("review")
        await rt.submit(sid, "Compare the API specs and open a review ticket.", request_id="r-1")
        outcome = await rt.wait_idle(sid)
        tasks = await rt.state(sid, lambda s: s.task_views())
        result = next((t.result for t in tasks if t.tool_name == "create_ticket"), None)
        return {
            "status": outcome.status if outcome else None,
            "ticket_result": result.output if result else None,
            "result_kind": type(result).__name__ if result else None,
        }


# -- the windows ---------------------------------------------------------------------------

WINDOWS = [
    ("crash before the request", "tool.before:create_ticket"),
    ("crash after the service created it, before perdure recorded it", "tool.after:create_ticket"),
    ("crash after perdure recorded it", "model.after@3"),
]


def _run(root: Path, url: str, variant: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TICKET_URL=url)
    env.pop("PERDURE_FAULT", None)
    if fault:
        env["PERDURE_FAULT"] = fault
    return subprocess.run(
        [sys.executable, __file__, "child", str(root), variant],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def window(name: str, fault: str, variant: str = "keyed") -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="perdure-review-"))
    try:
        (root / "ws").mkdir()
        (root / "ws" / "api-v1.json").write_text(json.dumps(OLD_SPEC))
        (root / "ws" / "api-v2.json").write_text(json.dumps(NEW_SPEC))
        server, url = ticket_service.start(root / "tickets.jsonl", dedup=variant == "keyed")
        try:
            crashed = _run(root, url, variant, fault)
            if crashed.returncode != -9:
                raise SystemExit(
                    f"{name}: expected SIGKILL, got {crashed.returncode}\n{crashed.stderr}"
                )
            done = _run(root, url, variant, None)
            if done.returncode != 0:
                raise SystemExit(f"{name}: recovery failed\n{done.stderr}")
            _, stats = _http("GET", url + "/stats")
        finally:
            server.shutdown()
        return {"window": name, "variant": variant, **stats, **json.loads(done.stdout)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    results = [window(name, fault) for name, fault in WINDOWS]
    results.append(window(WINDOWS[1][0], "tool.after:create_ticket", variant="never"))
    ok = True
    for r in results:
        print(f"[{r['variant']:5}] {r['window']}")
        print(f"        tickets: {r['tickets']}   POST requests: {r['posts']}   run: {r['status']}")
        print(f"        the model was told: {r['ticket_result']}")
        ok &= r["tickets"] == 1 and r["status"] == "completed"
    never = results[-1]
    ok &= never["posts"] == 1 and never["result_kind"] == "ToolOutcomeUnknown"
    print(json.dumps({"ok": ok, "results": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "child":
        print(json.dumps(trio.run(agent, Path(sys.argv[2]), sys.argv[3])))
    else:
        raise SystemExit(main())
