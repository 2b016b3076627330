"""Prometheus ``/metrics`` of a real ``perdure serve``, scraped over HTTP, checked against the log.

The exposition is parsed with prometheus_client's own parser; every counter that
mirrors records (tool calls by outcome, runs by status, retries, tokens, records
by type, commits) must equal what the log holds.
"""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from perdure.storage.records import (
    GenerationCompleted,
    InputAccepted,
    LogOpened,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    ToolCompleted,
    ToolOutcomeUnknown,
)
from tests.support.checker import read_log
from tests.support.daemon import idle, wait_for

SCRIPT = [
    {
        "text": "working",
        "fail_attempts": 1,
        "tool_uses": [
            {"name": "probe", "input": {"what": "disk"}},
            {"name": "charge", "input": {"amount": 5}},
            {"name": "transfer", "input": {"amount": 7}},
        ],
    },
    {"text": "done"},
]
TOOLS = "tests.observability.metrics_tools:TOOLS"
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(found: dict[Any, float], name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    return sum(
        v
        for (n, series), v in found.items()
        if n == name and all((k, w) in series for k, w in labels.items())
    )


def test_metrics_scraped_over_http_match_the_log(make_daemon: Any) -> None:
    port = free_port()
    daemon = make_daemon(SCRIPT, tools=TOOLS, extra_args=("--metrics-port", str(port)))
    daemon.start()
    with daemon.client() as c:
        for sid in ("a", "b"):
            assert c.post("/v1/sessions", json={"session_id": sid}).status_code in (200, 201)
            posted = c.post(
                f"/v1/sessions/{sid}/messages",
                json={"text": "go", "request_id": f"r-{sid}"},
                headers={**daemon.headers(), "traceparent": CALLER},
            )
            assert posted.status_code == 202, posted.text
        for sid in ("a", "b"):
            wait_for(c, sid, idle)
        scraped = c.get("/metrics")
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain")
        assert httpx.get(daemon.url + "/metrics").status_code == 401, "the API port needs the token"
    side = httpx.get(f"http://127.0.0.1:{port}/metrics")  # loopback, no token
    assert side.status_code == 200
    found = samples(scraped.text)
    assert daemon.stop() == 0

    log = [c.record for c in read_log(Path(daemon.log))]
    kinds = Counter(type(r).__name__ for r in log)
    completed = [r for r in log if isinstance(r, ToolCompleted)]
    # Tool calls by outcome, against the log's results.
    assert total(found, "perdure_tool_calls_total", outcome="ok") == sum(
        not r.is_error for r in completed
    )
    assert total(found, "perdure_tool_calls_total", outcome="error") == sum(
        r.is_error for r in completed
    )
    assert (
        total(found, "perdure_tool_calls_total", outcome="unknown") == kinds["ToolOutcomeUnknown"]
    )
    assert len(completed) == 4
    assert kinds["ToolOutcomeUnknown"] == 2
    # ... and by policy.
    assert value(found, "perdure_tool_calls_total", policy="safe", outcome="ok") == 2
    assert value(found, "perdure_tool_calls_total", policy="keyed", outcome="error") == 2
    assert value(found, "perdure_tool_calls_total", policy="never", outcome="unknown") == 2
    assert not any("session" in label for (_, series) in found for label, _ in series), (
        "no label may carry an id"
    )

    finished = Counter(r.status for r in log if isinstance(r, RunFinished))
    assert (
        value(found, "perdure_runs_finished_total", status="completed")
        == finished["completed"]
        == 2
    )
    retries = [r for r in log if isinstance(r, RetryPending)]
    assert total(found, "perdure_model_retries_total") == len(retries) == 2
    replies = [r for r in log if isinstance(r, GenerationCompleted)]
    assert value(found, "perdure_tokens_total", type="output") == sum(
        r.usage.output_tokens for r in replies
    )
    assert value(found, "perdure_tokens_total", type="input") == sum(
        r.usage.input_tokens for r in replies + retries
    )
    # Every record this process committed, by type; LogOpened is written on opening.
    for kind, n in kinds.items():
        if kind != LogOpened.__name__:
            assert value(found, "perdure_records_committed_total", type=kind) == n, kind
    commits = value(found, "perdure_commits_total")
    assert commits >= 1
    assert value(found, "perdure_commit_duration_seconds_count") == commits
    assert value(found, "perdure_commit_records_count") == commits
    assert value(found, "perdure_commit_records_sum") == sum(
        n for kind, n in kinds.items() if kind != LogOpened.__name__
    )
    assert value(found, "perdure_resident_sessions") == 2
    assert value(found, "perdure_event_stream_lagged") == 0
    # The HTTP caller's trace context is recorded with its input.
    assert {r.traceparent for r in log if isinstance(r, InputAccepted)} == {CALLER}
    assert samples(side.text).keys() >= {("perdure_commits_total", ())}


def test_metrics_only_count_what_the_new_process_committed_after_a_sigkill(
    make_daemon: Any,
) -> None:
    script = [
        {"text": "working", "tool_uses": [{"name": "slow_send", "input": {"text": "x"}}]},
        {"text": "done"},
    ]
    daemon = make_daemon(script, tools="tests.observability.metrics_tools:SLOW")
    daemon.start()
    with daemon.client() as c:
        c.post("/v1/sessions", json={"session_id": "s"})
        c.post("/v1/sessions/s/messages", json={"text": "go", "request_id": "r1"})
        wait_for(c, "s", lambda s: bool(s.get("unconfirmed")))
    daemon.kill()
    daemon.restart()
    with daemon.client() as c:
        wait_for(c, "s", idle)
        found = samples(c.get("/metrics").text)
    assert daemon.stop() == 0
    log = [c.record for c in read_log(Path(daemon.log))]
    unknown = [r for r in log if isinstance(r, ToolOutcomeUnknown)]
    assert len(unknown) == 1
    assert value(found, "perdure_tool_calls_total", policy="never", outcome="unknown") == 1
    decisions = Counter(r.action for r in log if isinstance(r, RecoveryDecision))
    assert decisions, "the restart decided something"
    for action, n in decisions.items():  # every decision was the second process's
        assert value(found, "perdure_recovery_decisions_total", action=action) == n
    # The first process's results are not counted by the second one.
    assert value(found, "perdure_runs_finished_total", status="interrupted") == 1
    assert value(found, "perdure_runs_finished_total", status="completed") == 1
