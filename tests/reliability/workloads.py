"""The reference workloads of the crash sweeps, as child-runtime plans.

Each workload names the replay policies and record types it must exercise, so a
sweep that silently did nothing fails (non-vacuity).
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen


@frozen
class Workload:
    name: str
    script: list[dict[str, Any]]
    sessions: dict[str, list[dict[str, str]]]
    actions: list[dict[str, Any]] = field(factory=list)
    policies: frozenset[str] = frozenset()  # replay policies it must execute
    records: frozenset[str] = frozenset()  # record types its clean run must contain
    tools: tuple[str, ...] = ()  # tools whose tool.before/tool.after points are swept
    final_status: str = "completed"

    def plan(self, log: str, workspace: str) -> dict[str, Any]:
        return {
            "log": log,
            "workspace": workspace,
            "script": self.script,
            "sessions": self.sessions,
            "actions": self.actions,
            "options": {"retry_base": 0.05},
        }


def _one(text: str = "go") -> dict[str, list[dict[str, str]]]:
    return {"s1": [{"text": text, "request_id": "r1"}]}


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "input": args}


SEQUENTIAL = Workload(
    "sequential tools",
    script=[
        {"text": "note", "tool_uses": [_call("send_note", text="one")]},
        {"text": "look", "tool_uses": [_call("lookup", query="q")]},
        {"text": "book", "tool_uses": [_call("book", item="room")]},
        {"text": "done"},
    ],
    sessions=_one(),
    policies=frozenset({"never", "safe", "keyed"}),
    records=frozenset({"ToolExecuting", "ToolCompleted", "RunFinished"}),
    tools=("send_note", "lookup", "book"),
)

PARALLEL = Workload(
    "three parallel tools",
    script=[
        {
            "text": "three",
            "tool_uses": [
                _call("lookup", query="a"),
                _call("book", item="b"),
                _call("send_note_reconciled", text="c"),
            ],
        },
        {"text": "done"},
    ],
    sessions=_one(),
    policies=frozenset({"never", "safe", "keyed"}),
    records=frozenset({"ToolExecuting", "ToolCompleted"}),
    tools=("lookup", "book", "send_note_reconciled"),
)

APPROVAL = Workload(
    "approval",
    script=[
        {"text": "deploying", "tool_uses": [_call("deploy", target="prod")]},
        {"text": "deployed"},
    ],
    sessions=_one(),
    actions=[
        {"kind": "wait_for", "session": "s1", "record": "ToolAwaitingApproval"},
        {"kind": "approve", "session": "s1", "call_id": "toolu_001_1", "request_id": "yes"},
    ],
    policies=frozenset({"never"}),
    records=frozenset({"ToolAwaitingApproval", "ApprovalDecided"}),
    tools=("deploy",),
)

RETRY = Workload(
    "retry back-off",
    script=[
        {
            "text": "note",
            "fail_attempts": 2,
            "retry_after": 0.05,
            "tool_uses": [_call("send_note", text="x")],
        },
        {"text": "done"},
    ],
    sessions=_one(),
    policies=frozenset({"never"}),
    records=frozenset({"RetryPending"}),
    tools=("send_note",),
)

REVISION = Workload(
    "goal revision mid-run",
    script=[
        {
            "text": "plan",
            "tool_uses": [_call("slow_book", item="a", seconds=0.3), _call("deploy", target="x")],
        },
        {"text": "revised", "tool_uses": [_call("lookup", query="new")]},
        {"text": "done"},
    ],
    sessions=_one(),
    actions=[
        {"kind": "wait_for", "session": "s1", "record": "ToolAwaitingApproval"},
        {"kind": "revise", "session": "s1", "text": "no deploy", "request_id": "v1"},
    ],
    policies=frozenset({"keyed", "safe"}),
    records=frozenset({"GoalRevised", "ToolCancelled"}),
    tools=("slow_book", "lookup"),
)

QUEUED = Workload(
    "queued follow-up input",
    script=[
        {"text": "first", "tool_uses": [_call("slow_lookup", query="a", seconds=0.2)]},
        {"text": "first done"},
        {"text": "second", "tool_uses": [_call("send_note", text="b")]},
        {"text": "second done"},
    ],
    sessions={
        "s1": [{"text": "one", "request_id": "r1"}, {"text": "two", "request_id": "r2"}],
    },
    policies=frozenset({"safe", "never"}),
    records=frozenset({"InputAccepted", "RunFinished"}),
    tools=("slow_lookup", "send_note"),
)

MANY = Workload(
    "20 concurrent sessions",
    script=[
        {"text": "note", "tool_uses": [_call("send_note", text="n"), _call("lookup", query="q")]},
        {"text": "done"},
    ],
    sessions={f"s{i:02d}": [{"text": f"task {i}", "request_id": f"r{i}"}] for i in range(20)},
    policies=frozenset({"never", "safe"}),
    records=frozenset({"ToolCompleted"}),
    tools=("send_note", "lookup"),
)

ALL = (SEQUENTIAL, PARALLEL, APPROVAL, RETRY, REVISION, QUEUED, MANY)
