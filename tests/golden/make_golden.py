"""Produce the golden logs of the current record format, and their expected plans.

    python -m tests.golden.make_golden

Run it when a record format version is released (and commit the result under
``tests/golden/v<N>/``). Each scenario runs the child runtime and kills it in a
different crash window, leaving a log whose recovery has work to do. Logs of
every released version stay in the repository: every later build must read them
and decide the same recovery plan (``test_golden.py``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from perdure.storage.records import RECORD_VERSIONS
from tests.golden.plan import recovery_plan
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


def main() -> None:
    versions = set(RECORD_VERSIONS.values())
    assert len(versions) == 1, "mixed record versions: name the golden directory by hand"
    target = HERE / f"v{versions.pop()}"
    for name, (script, fault, actions) in SCENARIOS.items():
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
        out = target / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        shutil.copy(work / "log" / "data.mdb", out / "data.mdb")
        expected = recovery_plan(out)
        (out / "lock.mdb").unlink(missing_ok=True)
        assert expected, f"{name}: nothing to recover"
        (out / "expected_plan.json").write_text(json.dumps(expected, indent=1, sort_keys=True))
        shutil.rmtree(work)
        print(f"{out.relative_to(HERE)}: {(out / 'data.mdb').stat().st_size} bytes")


if __name__ == "__main__":
    main()
