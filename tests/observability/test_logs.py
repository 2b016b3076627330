"""Structured logs of a real ``perdure serve --log-format json``.

A session whose record is damaged on disk: its actor cannot load it, crashes, is
restarted and parked. Every line about it is one JSON object carrying its session
id; the damage is told in one clear line per attempt, never with a traceback, and a
later start, with the session parked, says nothing more about it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from io import StringIO
from typing import Any

import trio

from perdure.observability import logs
from tests.server.test_recovery import APPROVAL_SCRIPT, flip_marker
from tests.support.daemon import Daemon, awaiting_approval, wait_for


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_damaged_session_is_one_clear_json_line_not_repeated_tracebacks(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(APPROVAL_SCRIPT, extra_args=("--log-format", "json")).start()
    with daemon.client() as c:
        c.post("/v1/sessions", json={"session_id": "hurt"})
        seq = c.post(
            "/v1/sessions/hurt/messages",
            json={"text": "MARKER-damage-me please", "request_id": "r1"},
        ).json()["seq"]
        wait_for(c, "hurt", awaiting_approval)
    assert daemon.stop() == 0
    assert flip_marker(daemon.log, b"MARKER-damage-me") >= 1

    daemon.restart()
    with daemon.client() as c:
        resp = c.post("/v1/sessions/hurt/messages", json={"text": "x", "request_id": "r2"})
        assert resp.status_code == 423, resp.text
    assert daemon.stop() == 0
    lines = json_lines(daemon.stderr())
    about = [line for line in lines if "hurt" in line["message"]]
    crashes = [line for line in about if "actor crashed (" in line["message"]]
    assert crashes, daemon.stderr()
    for line in about:
        assert line["session_id"] == "hurt"
        assert line["logger"].startswith("perdure.")
        assert "exception" not in line
        assert "Traceback" not in line["message"]
    for line in crashes:
        assert f"record {seq}" in line["message"]
        assert line["message"].count("\n") == 0, "one line"
    # One error says what is damaged; its repeats (the restarts) are below that level.
    assert [line["level"] for line in crashes] == ["error"] + ["info"] * (len(crashes) - 1)
    (parked,) = [line for line in about if "hurt parked:" in line["message"]]
    assert parked["level"] == "error"
    assert "Traceback" not in daemon.stderr()

    daemon.restart()  # parked: not started again, nothing more said about it
    with daemon.client() as c:
        assert c.get("/v1/sessions").status_code == 200
    assert daemon.stop() == 0
    assert not [line for line in json_lines(daemon.stderr()) if "hurt" in line["message"]]


async def test_lines_carry_the_ids_bound_in_the_task_that_logs_them() -> None:
    out = StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.ContextFilter())
    logger = logging.getLogger("perdure.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:

        async def tool_task() -> None:
            logger.info("inside a call")

        logs.bind(session_id="s1")
        async with trio.open_nursery() as nursery:
            with logs.bound(run_id="s1.r0", call_id="c1"):
                nursery.start_soon(tool_task)  # the child inherits the ids bound here
            logger.info("in the session")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("message", "session_id")} == {
        "message": "in the session",
        "session_id": "s1",
    }
    assert "call_id" not in first
    assert second["message"] == "inside a call"
    assert (second["session_id"], second["run_id"], second["call_id"]) == ("s1", "s1.r0", "c1")
    assert second["level"] == "info"
    assert second["logger"] == "perdure.test_logs"
