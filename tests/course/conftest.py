"""Fixtures for subprocess crash tests: a plan builder bound to a fresh log and workspace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.checker import Report, check

Plan = dict[str, Any]


@pytest.fixture
def make_plan(tmp_path: Path) -> Callable[..., Plan]:
    ws = tmp_path / "ws"
    ws.mkdir()

    def build(script: list[dict[str, Any]], inputs: list[str] | None = None, **extra: Any) -> Plan:
        texts = inputs if inputs is not None else ["go"]
        plan: Plan = {
            "log": str(tmp_path / "log"),
            "workspace": str(ws),
            "script": script,
            "sessions": {"s1": [{"text": t, "request_id": f"r{i}"} for i, t in enumerate(texts)]},
        }
        plan.update(extra)
        return plan

    return build


def assert_sound(plan: dict[str, Any], *, settled: bool = True) -> Report:
    report = check(Path(plan["log"]), Path(plan["workspace"]), settled=settled)
    assert report.violations == [], "\n".join(report.violations)
    return report
