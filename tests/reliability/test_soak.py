"""Random soak: a daemon serving many sessions is SIGKILLed and SIGSTOPped at random.

Clients keep submitting (and re-sending with the same request id when the daemon
is down); the daemon is killed or paused at seeded random moments and restarted;
then, with faults stopped, every accepted input must complete (liveness) and the
history must satisfy every invariant. The seed is printed on failure; replay it
with ``PERDURE_SOAK_SEED=<seed>``; ``PERDURE_SOAK_CYCLES`` sets the length.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx

from perdure.storage.records import RunFinished
from tests.support.checker import check, read_log
from tests.support.daemon import Daemon
from tests.support.stats import record_stat

TOOLS = [
    ("lookup", {"query": "q"}),
    ("send_note", {"text": "n"}),
    ("book", {"item": "b"}),
    ("slow_lookup", {"query": "s", "seconds": 0.2}),
]
# Every input takes two model turns: one tool call, then the answer.
SCRIPT: list[dict[str, Any]] = []
for i in range(40):
    name, args = TOOLS[i % len(TOOLS)]
    SCRIPT += [
        {"text": f"step {i}", "delay": 0.05, "tool_uses": [{"name": name, "input": args}]},
        {"text": f"answer {i}"},
    ]


def _call(daemon: Daemon, method: str, path: str, body: Any = None, deadline: float = 60) -> Any:
    """Retry through restarts and pauses, re-sending the same body (same request id)."""
    end = time.monotonic() + deadline
    while True:
        try:
            resp = httpx.request(
                method, daemon.url + path, json=body, headers=daemon.headers(), timeout=5
            )
            if resp.status_code < 500:
                return resp
        except httpx.TransportError:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"{method} {path} kept failing")
        time.sleep(0.1)


def test_random_kills_and_pauses_then_everything_completes(
    make_daemon: Callable[..., Daemon],
) -> None:
    seed = int(os.environ.get("PERDURE_SOAK_SEED", random.randrange(1 << 30)))
    cycles = int(os.environ.get("PERDURE_SOAK_CYCLES", "8"))
    rng = random.Random(seed)
    daemon = make_daemon(SCRIPT, name="soak").start()
    sessions = [f"soak{i}" for i in range(10)]
    for sid in sessions:
        assert _call(daemon, "POST", "/v1/sessions", {"session_id": sid}).status_code in (200, 201)
    accepted: list[tuple[str, str]] = []
    kills = pauses = 0
    for cycle in range(cycles):
        for _ in range(rng.randint(1, 4)):
            sid = rng.choice(sessions)
            rid = f"{sid}-{cycle}-{len(accepted)}"
            resp = _call(
                daemon, "POST", f"/v1/sessions/{sid}/messages", {"text": rid, "request_id": rid}
            )
            assert resp.status_code == 202, (seed, resp.text)
            accepted.append((sid, rid))
        time.sleep(rng.uniform(0.05, 0.8))
        if rng.random() < 0.7:
            daemon.kill()
            kills += 1
            daemon.start()
        else:
            os.kill(daemon.pid, signal.SIGSTOP)
            time.sleep(rng.uniform(0.2, 0.6))
            os.kill(daemon.pid, signal.SIGCONT)
            pauses += 1
    # Faults stop: every accepted input must now complete without any new request.
    end = time.monotonic() + 120
    pending = set(sessions)
    while pending and time.monotonic() < end:
        for sid in list(pending):
            summary = _call(daemon, "GET", f"/v1/sessions/{sid}").json()
            if summary["status"] == "idle":
                pending.discard(sid)
        time.sleep(0.2)
    assert not pending, f"seed {seed}: sessions never finished: {pending}"
    assert daemon.stop() == 0
    report = check(daemon.log, daemon.workspace, settled=True)
    assert report.violations == [], f"seed {seed}: {report.violations}"
    assert report.counts["InputAccepted"] == len(accepted), f"seed {seed}"
    finished = [c.record for c in read_log(daemon.log) if isinstance(c.record, RunFinished)]
    completed = [r for r in finished if r.status == "completed"]
    assert len(completed) == len(accepted), f"seed {seed}: {len(completed)} of {len(accepted)}"
    assert kills + pauses == cycles
    assert report.counts["LogOpened"] == kills + 1
    record_stat("soak", cycles=cycles, kills=kills, pauses=pauses, inputs=len(accepted))
