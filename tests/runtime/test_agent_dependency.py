"""A sub-agent's session is kept while the parent call that waits for it is unfinished.

The child answers, then its parent's call still runs (it has not returned the answer
yet): deleting the child then must be refused, or a re-run of that call after a crash
would find no child and start a second sub-agent, doing its work twice. The log itself
refuses only sessions with unfinished work, and the child has none: the dependency
check (``perdure.retention``) is what keeps it.

* in one process: ``delete_session`` and ``prune`` refuse the child while the call
  waits, and delete it once the call is over;
* across a real crash: the process that was refused is SIGKILLed with the call still
  waiting; the restarted runtime re-runs the KEYED call, which finds the one child and
  its answer: the sub-agent's model is not called again, and the log holds one child.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import perdure
from perdure.check import check_log
from tests.runtime.agent_parent import Model, Parent
from tests.support.procs import ROOT


async def test_a_child_is_kept_while_its_parent_call_waits(log_dir: Path) -> None:
    parent, model = Parent(hold=True), Model()
    async with perdure.open_runtime(log_dir, provider=model, tools=[parent.tool]) as rt:
        await rt.create_session("p")
        await rt.submit("p", "what is the capital of Portugal?", request_id="r1")
        with trio.fail_after(20):
            await parent.answered.wait()
        (child,) = [i.session_id for i in await rt.sessions() if i.session_id != "p"]
        with pytest.raises(perdure.Refused) as refused:
            await rt.delete_session(child)
        assert refused.value.code == "busy"
        assert "parent call" in refused.value.message and "still waits" in refused.value.message
        deleted, kept = await rt.prune(finished_before=4e9)
        assert deleted == [] and [sid for sid, _ in kept] == [child]
        assert child in {i.session_id for i in await rt.sessions()}

        parent.release.set()  # the call returns the answer; the child is free to go
        with trio.fail_after(20):
            outcome = await rt.wait_idle("p")
        assert outcome is not None and outcome.final_text == "Lisbon, says the researcher."
        assert await rt.delete_session(child) > 0
        assert [i.session_id for i in await rt.sessions()] == ["p"]
    assert model.researcher_calls == 1
    report = check_log(log_dir)
    assert report.violations == [], "\n".join(report.violations)


def _run(log_dir: Path, what: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.agent_parent", str(log_dir), what],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_after_a_crash_the_rerun_call_finds_its_one_child(log_dir: Path) -> None:
    holding = _run(log_dir, "hold")
    try:
        assert holding.stdout is not None
        line = holding.stdout.readline()  # printed once the deletion was tried
        assert line, holding.communicate(timeout=30)[1]
        tried = json.loads(line)
        assert tried["deleted"] is False and tried["code"] == "busy", tried
        holding.send_signal(signal.SIGKILL)  # the parent call still waits
        assert holding.wait(timeout=30) == -signal.SIGKILL
    finally:
        if holding.poll() is None:
            holding.kill()
        holding.communicate()

    finishing = _run(log_dir, "finish")
    out, err = finishing.communicate(timeout=60)
    assert finishing.returncode == 0, err
    done = json.loads(out.splitlines()[-1])
    assert done["final"] == "Lisbon, says the researcher."
    # The re-run call found the child and its answer: no second sub-agent ran.
    assert done["researcher_calls"] == 0
    assert done["sessions"] == sorted(["p", tried["child"]])
    report = check_log(log_dir)
    assert report.violations == [], "\n".join(report.violations)
