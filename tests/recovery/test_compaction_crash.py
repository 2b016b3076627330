"""SIGKILL at every commit of a context compaction: one summary per range, same request.

One child process (``_compaction_child``) per window runs two inputs against the fake
Anthropic server; the first reply fills the 1000-token window, so the second input's
turn waits for a summary. ``PERDURE_FAULT`` kills the child at one of the
compaction's commits; a second child, without the fault, finishes. Checked for every
window: the run completes, the log holds one ``CompactionStarted`` and one
``ContextCompacted`` (never two summaries of one range), and the request the model
gets after the compaction is the very request of a run that never crashed. The
windows are one loop (one test) to keep the number of Python processes small.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from perdure.storage.records import (
    CompactionStarted,
    ContextCompacted,
    GenerationCompleted,
    RecoveryDecision,
)
from tests.fake_anthropic import Action, FakeAnthropic, FakeUsage, Reply, Text
from tests.providers._kill import ROOT, child_env, of, read_log

FIRST = Reply(content=[Text("Paris.")], usage=FakeUsage(input_tokens=900))
SUMMARY = Reply(content=[Text("Asked: capital.")], usage=FakeUsage(input_tokens=60))
SECOND = Reply(content=[Text("About 2.1 million.")], usage=FakeUsage(input_tokens=100))

# fault -> what the restarted child still needs from the server
WINDOWS: dict[str, tuple[Action, ...]] = {
    # the start is durable, the summary call not made: the summary (still queued) and
    # the second turn
    "summary.before": (SECOND,),
    # the summary came back, not committed: asked again, then the second turn
    "model.after@2": (SUMMARY, SECOND),
    # the summary is durable (with the next turn's start): the second turn only
    "compaction.after": (SECOND,),
}


def run_child(
    log: Path, env: dict[str, str], fault: str | None
) -> subprocess.CompletedProcess[str]:
    child_vars = dict(env, PERDURE_FAULT=fault) if fault else env
    return subprocess.run(
        [sys.executable, "-m", "tests.recovery._compaction_child", str(log)],
        cwd=ROOT,
        env=child_vars,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_crash_at_every_commit_of_a_compaction(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        env = child_env(anthropic=fake.url)
        fake.script(FIRST, SUMMARY, SECOND)
        clean = run_child(tmp_path / "clean", env, None)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        baseline = [r.body for r in fake.requests]
        assert len(baseline) == 3
        for fault, then in WINDOWS.items():
            log = tmp_path / fault
            sent = len(fake.requests)
            fake.script(FIRST, SUMMARY)
            died = run_child(log, env, fault)
            assert died.returncode == -9, f"{fault}: {died.stdout}{died.stderr}"
            fake.script(*then)
            done = run_child(log, env, None)
            assert done.returncode == 0, f"{fault}: {done.stdout}{done.stderr}"
            outcome = json.loads(done.stdout.strip().splitlines()[-1])
            assert outcome == {"status": "completed", "text": "About 2.1 million."}, fault
            records = read_log(log)
            assert len(of(CompactionStarted, records)) == 1, fault
            (compacted,) = of(ContextCompacted, records)
            assert (compacted.start, compacted.end, compacted.summary) == (
                0,
                1,
                "Asked: capital.",
            ), fault
            assert [g.text for g in of(GenerationCompleted, records)] == [
                "Paris.",
                "About 2.1 million.",
            ], fault
            bodies = [r.body for r in fake.requests[sent:]]
            assert bodies[-1] == baseline[-1], f"{fault}: the request after it differs"
            summaries = [b for b in bodies if b["system"][0]["text"] != "You are a test."]
            assert all(b == baseline[1] for b in summaries), f"{fault}: another summary asked"
            if fault != "compaction.after":
                assert any(
                    d.subject == compacted.compaction_id for d in of(RecoveryDecision, records)
                ), fault
