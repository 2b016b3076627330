"""Produce the golden logs of the current build's record format, and what they must give.

    python -m tests.golden.make_golden
    python -m tests.golden.make_golden --add NAME   # one new scenario, before a release

Run it when a version is released and commit the result under
``tests/golden/perdure-<version>/`` (an existing directory is never rewritten:
its logs are the record of what that release wrote; ``--add`` writes one scenario
the directory of the unreleased version lacks, such as a new kind of record). Each
crash scenario runs the child runtime and kills it in a different crash window,
leaving a log whose recovery has work to do (``sub-agents``: a parent call whose
sub-agent was linked, ``AgentStarted``, killed while the child works); the
``features`` log (``features.py``) holds every newer kind of fact: reasoning blocks,
model and tool retries, heartbeats, a budget, a fallback, calls that wait for a
person; the ``compaction`` log (``compaction.py``) a context compaction and a second
one waiting out a back-off. Logs of every release stay in the repository (``v1/`` is
the first record format, before releases were named): every later build must read
them, fold them and decide the same recovery plan (``test_golden.py``).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

from perdure.storage.lmdb_log import LmdbLog
from tests.golden.compaction import write_compaction_log
from tests.golden.features import describe, write_features_log
from tests.golden.plan import recovery_plan
from tests.support.checker import read_log
from tests.support.procs import run_child

HERE = Path(__file__).resolve().parent


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "input": args}


SCENARIOS: dict[str, tuple[list[dict[str, Any]], str, list[dict[str, Any]]]] = {
    "never-executing": (
        [{"text": "x", "tool_uses": [_call("send_note", text="a")]}, {"text": "done"}],
        "tool.after:send_note",
        [],
    ),
    "three-parallel": (
        [
            {
                "text": "x",
                "tool_uses": [
                    _call("lookup", query="a"),
                    _call("book", item="b"),
                    _call("send_note_reconciled", text="c"),
                ],
            },
            {"text": "done"},
        ],
        "tool.after:send_note_reconciled",
        [],
    ),
    "retry-pending": (
        [{"text": "x", "fail_attempts": 1, "retry_after": 30.0}, {"text": "done"}],
        "commit@3",
        [],
    ),
    "awaiting-approval": (
        [{"text": "x", "tool_uses": [_call("deploy", target="prod")]}, {"text": "done"}],
        "commit@3",
        [],
    ),
    "revised-then-crashed": (
        [
            {"text": "x", "tool_uses": [_call("slow_book", item="a"), _call("deploy", target="p")]},
            {"text": "revised"},
        ],
        "commit@4",
        [
            {"kind": "wait_for", "session": "s1", "record": "ToolAwaitingApproval"},
            {"kind": "revise", "session": "s1", "text": "no deploy", "request_id": "v1"},
        ],
    ),
    "queued-input": (
        [
            {"text": "x", "tool_uses": [_call("slow_lookup", query="a")]},
            {"text": "one"},
            {"text": "two"},
        ],
        "tool.after:slow_lookup",
        [],
    ),
}


def _keep(log: Path, out: Path) -> None:
    """Copy the log's data file to ``out`` with its expected plan and replay."""
    out.mkdir(parents=True)
    shutil.copy(log / "data.mdb", out / "data.mdb")
    expected = recovery_plan(out)
    assert expected, f"{out.name}: nothing to recover"
    (out / "expected_plan.json").write_text(json.dumps(expected, indent=1, sort_keys=True))
    reader = LmdbLog(out, readonly=True)
    try:
        replay = describe(reader.read_global())
    finally:
        reader.close()
    (out / "expected_replay.json").write_text(json.dumps(replay, indent=1, sort_keys=True))
    (out / "lock.mdb").unlink(missing_ok=True)
    print(f"{out.relative_to(HERE)}: {(out / 'data.mdb').stat().st_size} bytes")


def write_sub_agent_log(work: Path) -> Path:
    """A parent session whose call ran a sub-agent, killed at the first commit after the
    child was linked (``AgentStarted``) while the child still works; the log's path."""
    plan = {
        "script": [
            {"text": "delegating", "tool_uses": [_call("research", task="look it up")]},
            {"text": "answered"},
        ],
        "by_system": {
            "researcher": [
                {"text": "noting", "tool_uses": [_call("send_note", text="found")]},
                {"text": "child done", "delay": 2.0},
            ]
        },
        "extra_tools": ["tests.recovery.session_tools:AGENT_TOOLS"],
        "sessions": {"s1": [{"text": "go", "request_id": "r1"}]},
        "actions": [],
    }
    for n in range(1, 40):
        attempt = work / f"commit-{n}"
        (attempt / "ws").mkdir(parents=True)
        plan |= {"log": str(attempt / "log"), "workspace": str(attempt / "ws")}
        assert run_child(plan, fault=f"commit@{n}").killed, n
        records = [c.record for c in read_log(attempt / "log")]
        linked = [r for r in records if type(r).__name__ == "AgentStarted"]
        finished = {r.session_id for r in records if type(r).__name__ == "RunFinished"}
        if linked and linked[0].child not in finished:
            return attempt / "log"
    raise AssertionError("no commit left a linked sub-agent at work")


def main() -> None:
    target = HERE / f"perdure-{version('perdure')}"
    if sys.argv[1:2] == ["--add"]:
        name = sys.argv[2]
        if (target / name).exists():
            raise SystemExit(f"{target / name} exists: a golden log is never rewritten")
        work = Path(tempfile.mkdtemp())
        if name == "sub-agents":
            _keep(write_sub_agent_log(work), target / name)
        elif name == "compaction":
            write_compaction_log(work / "log")
            _keep(work / "log", target / name)
        else:
            raise SystemExit(f"--add knows the scenarios sub-agents and compaction, not {name!r}")
        shutil.rmtree(work)
        return
    if target.exists():
        raise SystemExit(f"{target} exists: the golden logs of a release are never rewritten")
    for name, (script, fault, actions) in SCENARIOS.items():
        if (target / name).exists():
            continue  # the golden logs of a release are never rewritten
        work = Path(tempfile.mkdtemp())
        (work / "ws").mkdir()
        inputs = [{"text": "go", "request_id": "r1"}]
        if name == "queued-input":
            inputs.append({"text": "and then", "request_id": "r2"})
        plan = {
            "log": str(work / "log"),
            "workspace": str(work / "ws"),
            "script": script,
            "sessions": {"s1": inputs},
            "actions": actions,
        }
        assert run_child(plan, fault=fault).killed, name
        _keep(work / "log", target / name)
        shutil.rmtree(work)
    work = Path(tempfile.mkdtemp())
    _keep(write_sub_agent_log(work), target / "sub-agents")
    shutil.rmtree(work)
    work = Path(tempfile.mkdtemp())
    write_features_log(work / "log")
    _keep(work / "log", target / "features")
    shutil.rmtree(work)
    work = Path(tempfile.mkdtemp())
    write_compaction_log(work / "log")
    _keep(work / "log", target / "compaction")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
