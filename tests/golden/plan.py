"""The recovery plan of a log, normalised so it can be compared across builds.

For every active session of a log: fold its records, run ``decide.recover`` and
``decide.settle`` with a fixed environment (the test tools, a fixed clock), and
keep what was decided — record types with their identifying fields and effects —
but not free-text wording or timestamps, which may change without changing the
plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from perdure.actors import decide, protocol
from perdure.actors.state import SessionState
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Record
from tests.recovery.session_tools import AGENT_TOOLS
from tests.support.ledger_tools import ALL_TOOLS

_KEEP = (
    "call_id",
    "run_id",
    "submission_id",
    "generation_id",
    "subject",
    "found",
    "action",
    "status",
    "attempt",
    "resume_attempt",
    "resumed_from",
    "goal_rev",
    "replay",
    "idempotency_key",
    "args",
    "compensation_id",
    "compaction_id",
)


def _record(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(record).__name__}
    for name in _KEEP:
        if hasattr(record, name):
            out[name] = getattr(record, name)
    return out


def _effect(effect: protocol.Effect) -> str:
    """An effect by what identifies it (a tool effect by its call and attempt)."""
    if isinstance(effect, protocol.RunTool):
        fields: tuple[Any, ...] = (effect.call_id, effect.executing.attempt)
    elif isinstance(effect, protocol.Reconcile | protocol.Forget):
        fields = (effect.executing.call_id,)
    else:
        fields = attrs.astuple(effect)
    return f"{type(effect).__name__}{fields}"


def recovery_plan(log_dir: Path) -> dict[str, Any]:
    log = LmdbLog(log_dir, readonly=True)
    try:
        env = protocol.Env(tools={t.name: t for t in ALL_TOOLS + AGENT_TOOLS}, now=1_000_000.0)
        plan: dict[str, Any] = {}
        for sid in sorted(log.active_sessions()):
            state = SessionState.fold(sid, log.read_session(sid))
            step = decide.settle(state, env, protocol.View(), decide.recover(state, env))
            plan[sid] = {
                "records": [_record(r) for r in step.records],
                "effects": [_effect(e) for e in step.effects],
            }
        return plan
    finally:
        log.close()
