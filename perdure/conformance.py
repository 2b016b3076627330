"""``perdure conformance``: crash-test YOUR tools against the replay policy they declare.

For each tool, a scripted model calls it once in a scratch workspace. A clean run
shows what one execution does to the world. Then the runtime is killed at every
crash point of that workload — right before the tool's side effect, right after
it, and after every single commit — a new process recovers, and the world is
compared with the clean run:

* the same world: the effect happened exactly once (whatever recovery decided);
* no effect, and the model was told the outcome is unknown: honest (NEVER tools);
* anything else is flagged: a tool declared SAFE or KEYED whose re-run changed the
  world twice, a reconcile that claimed "applied" for an effect that never
  happened, a "not applied" that led to a second effect.

The world is the scratch workspace's files (the tools' own state directory
excepted) plus, with ``--world-command``, the output of a command you provide
(e.g. one that lists the tickets in your service). Arguments come from
``--examples`` (a JSON object: tool name -> arguments) or are synthesised from the
tool's schema. Every run is a real child process killed with SIGKILL.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attrs import define, field

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import (
    RecoveryDecision,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
    ToolTaskCreated,
)
from perdure.tools.contract import Tool

STATE_DIRS = frozenset({".perdure-tools"})
CALL_ID = "toolu_001_1"


@define
class PointResult:
    point: str
    decision: str  # what recovery decided for the call, or "-" (no decision needed)
    result: str  # how the call ended: completed / reconciled / unknown / error ...
    verdict: str
    flagged: bool


@define
class ToolReport:
    tool: str
    replay: str
    has_reconcile: bool
    args: dict[str, Any]
    commits: int = 0
    points: list[PointResult] = field(factory=list)
    error: str = ""

    @property
    def flagged(self) -> bool:
        return bool(self.error) or any(p.flagged for p in self.points)


def example_args(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> Any:
    """A plain value that satisfies ``schema`` (as pydantic derives them for ``@tool``;
    ``$ref`` resolved in the top schema's ``$defs``)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return example_args(defs.get(ref.removeprefix("#/$defs/"), {}), defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return example_args(schema["anyOf"][0], defs)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if not isinstance(kind, str):
        return "conformance"
    if kind == "object":
        props = schema.get("properties", {})
        return {name: example_args(props[name], defs) for name in schema.get("required", [])}
    return {
        "string": "conformance",
        "integer": 1,
        "number": 1.0,
        "boolean": True,
        "array": [],
        "null": None,
    }.get(kind, "conformance")


def world(workspace: Path, command: str | None) -> str:
    """A digest of the world: every workspace file (state dirs excepted), and the command."""
    h = hashlib.sha256()
    for path in sorted(workspace.rglob("*")):
        rel = path.relative_to(workspace)
        if rel.parts and rel.parts[0] in STATE_DIRS:
            continue
        h.update(str(rel).encode() + b"\0")
        if path.is_file() and not path.is_symlink():
            h.update(hashlib.sha256(path.read_bytes()).digest())
    if command:
        out = subprocess.run(
            command, shell=True, cwd=workspace, capture_output=True, text=True, timeout=60
        )
        h.update(out.stdout.encode())
    return h.hexdigest()


def _plan(root: Path, tools_spec: str, tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "log": str(root / "log"),
        "workspace": str(root / "ws"),
        "tools": tools_spec.split(","),
        # Of several versions of the tool, the child registers the one under test only.
        "tool": tool.name,
        "version": tool.version,
        "script": [
            {"text": f"calling {tool.name}", "tool_uses": [{"name": tool.name, "input": args}]},
            {"text": "done"},
        ],
    }


def _child(
    plan: dict[str, Any], fault: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    if fault:
        env["PERDURE_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "perdure.conformance", json.dumps(plan)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _fresh(root: Path, template: Path | None) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if template is not None:
        shutil.copytree(template, root / "ws")
    else:
        (root / "ws").mkdir()
    return root


def _outcome(log_dir: Path) -> tuple[str, str]:
    """(what recovery decided for the call, how the call ended), from the log."""
    log = LmdbLog(log_dir, readonly=True)
    try:
        records = [c.record for c in log.read_session("conformance")]
    finally:
        log.close()
    decisions = [
        r.action for r in records if isinstance(r, RecoveryDecision) and r.subject == CALL_ID
    ]
    result = "-"
    for r in records:
        if isinstance(r, ToolCompleted) and r.call_id == CALL_ID:
            result = (
                "reconciled" if r.kind == "reconciled" else r.kind if r.is_error else "completed"
            )
        elif isinstance(r, ToolOutcomeUnknown) and r.call_id == CALL_ID:
            result = "unknown"
        elif isinstance(r, ToolCancelled) and r.call_id == CALL_ID:
            result = "cancelled"
    if not any(isinstance(r, ToolTaskCreated) for r in records):
        result = "not called"
    return ("; ".join(decisions) or "-"), result


def check_tool(
    tool: Tool,
    tools_spec: str,
    args: dict[str, Any],
    scratch: Path,
    *,
    template: Path | None = None,
    world_command: str | None = None,
    timeout: float = 120.0,
    progress: Callable[[str], None] = lambda text: None,
    label: str = "",
) -> ToolReport:
    report = ToolReport(label or tool.name, tool.replay.value, tool.reconcile is not None, args)
    root = _fresh(scratch / "untouched", template)
    untouched = world(root / "ws", world_command)
    root = _fresh(scratch / "clean", template)
    clean = _child(_plan(root, tools_spec, tool, args), None, timeout)
    if clean.returncode != 0:
        report.error = f"the clean run failed: {clean.stderr.strip()[-500:]}"
        return report
    summary = json.loads(clean.stdout.strip().splitlines()[-1])
    if summary["result"] != "completed":
        report.error = f"the clean run did not complete the call: {summary}"
        return report
    report.commits = summary["appends"]
    once = world(root / "ws", world_command)
    points = [f"tool.before:{tool.name}", f"tool.after:{tool.name}"]
    points += [f"commit@{n}" for n in range(1, report.commits + 1)]
    for point in points:
        progress(f"{tool.name}: {point}")
        root = _fresh(scratch / "point", template)
        plan = _plan(root, tools_spec, tool, args)
        first = _child(plan, point, timeout)
        if first.returncode != -9:
            report.points.append(PointResult(point, "-", "-", "the fault did not fire", True))
            continue
        second = _child(plan, None, timeout)
        if second.returncode != 0:
            tail = second.stderr.strip()[-300:]
            report.points.append(PointResult(point, "-", "-", f"recovery failed: {tail}", True))
            continue
        decision, result = _outcome(root / "log")
        now = world(root / "ws", world_command)
        report.points.append(_verdict(point, decision, result, now, once, untouched))
    return report


def _verdict(
    point: str, decision: str, result: str, now: str, once: str, untouched: str
) -> PointResult:
    if now == once and result != "unknown":
        return PointResult(point, decision, result, "ok: one effect", False)
    if now == once:
        return PointResult(point, decision, result, "ok: one effect, stated as unknown", False)
    if now == untouched and result in ("unknown", "not called", "cancelled"):
        return PointResult(point, decision, result, "ok: no effect, and the model knows", False)
    if now == untouched:
        why = f"LOST: the call ended '{result}' but the world shows no effect"
        return PointResult(point, decision, result, why, True)
    why = "DOUBLE or DIVERGENT effect: the world differs from one clean execution"
    return PointResult(point, decision, result, why, True)


def run(
    tools: Sequence[Tool],
    tools_spec: str,
    *,
    examples: dict[str, dict[str, Any]] | None = None,
    template: Path | None = None,
    world_command: str | None = None,
    progress: Callable[[str], None] = lambda text: None,
) -> list[ToolReport]:
    scratch = Path(tempfile.mkdtemp(prefix="perdure-conformance-"))
    try:
        out = []
        names = [t.name for t in tools]
        for t in tools:
            args = (examples or {}).get(t.name)
            if args is None:
                args = example_args(t.input_schema)
            # Several versions of one tool are checked one by one, each named so.
            versioned = names.count(t.name) > 1
            out.append(
                check_tool(
                    t,
                    tools_spec,
                    args,
                    scratch / f"{t.name}@{t.version}",
                    template=template,
                    world_command=world_command,
                    progress=progress,
                    label=f"{t.name} version {t.version}" if versioned else t.name,
                )
            )
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- the child ---------------------------------------------------------------------------


async def _child_main(plan: dict[str, Any]) -> dict[str, Any]:
    from contextlib import aclosing

    import trio

    from perdure._runtime import open_runtime
    from perdure._setup import load_tools
    from perdure.providers.scripted import Reply as ScriptReply
    from perdure.providers.scripted import ScriptedProvider, _converter

    replies = _converter.structure(plan["script"], list[ScriptReply])
    async with open_runtime(
        plan["log"],
        provider=ScriptedProvider(replies),
        tools=[
            t
            for t in load_tools(plan["tools"])
            if t.name != plan.get("tool") or t.version == plan.get("version")
        ],
        workspace=plan["workspace"],
        retry_base=0.05,
    ) as rt:
        sid = await rt.create_session("conformance")
        await rt.submit(sid, "call the tool once", request_id="conformance-1")

        async def approve_everything() -> None:
            async with aclosing(rt.events(sid)) as events:
                async for event in events:
                    if event.kind == "ToolAwaitingApproval" and event.record is not None:
                        call_id = getattr(event.record, "call_id", "")
                        await rt.approve(sid, call_id, request_id=f"auto-{call_id}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(approve_everything)
            outcome = await rt.wait_idle(sid)
            nursery.cancel_scope.cancel()
        task = await rt.state(sid, lambda s: s.task_view(CALL_ID), wake=False)
        return {
            "status": outcome.status if outcome else None,
            "result": task.phase if task else "not called",
            "appends": rt.stats().appends,
        }


if __name__ == "__main__":
    import trio

    print(json.dumps(trio.run(_child_main, json.loads(sys.argv[1]))))
