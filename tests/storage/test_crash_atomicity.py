"""A batch is all-or-nothing when its process is SIGKILLed mid-commit, and acknowledged
batches survive.

A child process (forked from a warm ``_child.py zygote``) opens the log and a
Journal and appends batches of ``N`` records from several concurrent tasks, until
the test kills it with SIGKILL at a random moment (a fifth of them while they
start up and open the log, the others within 50 ms of being ready, when the
writer thread is nearly always inside a commit). After every kill the test
reopens the log as its new owner (the dead child's flock went with it, so no
takeover is needed) and checks:

* every batch present is complete: ``N`` records, in order, on consecutive seqs;
* every batch the child reported as committed is present, at the seqs it was told;
* sequence numbers are gap-free from 1, every frame's checksum verifies;
* the per-session index, the session summaries and the ``active`` index agree with
  the records (``_check.check_log``), and owner epochs only rise.

The log accumulates over all iterations, so recovery after a crash is itself
crashed into. Seeded: a failure names the seed; ``PERDURE_CRASH_SEED=n`` replays it.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections import defaultdict
from pathlib import Path

from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Committed
from tests.storage._check import LogModel, check_log
from tests.storage._child import batch_mark
from tests.storage._procs import Child
from tests.support.stats import record_stat

ITERATIONS = 50
TIME_BUDGET = 25.0  # seconds; the sweep stops early (after MIN_ITERATIONS) when spent
MIN_ITERATIONS = 12
BATCH = 6
TASKS = 3
EARLY_KILLS = 0.2  # share of children killed at a random moment of their start-up
MAX_DELAY = 0.05  # seconds: the others are killed this long at most after they are ready

_MARK = re.compile(r"^(?P<bid>.+)#(?P<i>\d+)/(?P<n>\d+)$")


def _check_batches(new: list[Committed], acknowledged: dict[str, tuple[int, int]]) -> int:
    """Every batch among ``new`` is whole and contiguous; return how many there were."""
    by_batch: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for c in new:
        mark = batch_mark(c.record)
        if mark is None:
            continue
        m = _MARK.match(mark)
        assert m, f"seq {c.seq}: unexpected mark {mark!r}"
        by_batch[m["bid"]].append((c.seq, int(m["i"]), int(m["n"])))
    for bid, parts in by_batch.items():
        seqs = [seq for seq, _, _ in parts]
        assert [i for _, i, _ in parts] == list(range(BATCH)), (
            f"batch {bid} is torn: it has records {[i for _, i, _ in parts]} of {BATCH}"
        )
        assert {n for _, _, n in parts} == {BATCH}
        assert seqs == list(range(seqs[0], seqs[0] + BATCH)), f"batch {bid} is not contiguous"
        if bid in acknowledged:
            assert (seqs[0], seqs[-1]) == acknowledged[bid], f"batch {bid} moved"
    missing = sorted(set(acknowledged) - set(by_batch))
    assert not missing, f"acknowledged batches lost after SIGKILL: {missing[:5]}"
    return len(by_batch)


def _wait_ready(progress: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not (progress.exists() and progress.read_text().startswith("ready")):
        assert time.monotonic() < deadline, "the appender never became ready"
        time.sleep(0.002)


def _read_progress(path: Path) -> tuple[bool, dict[str, tuple[int, int]]]:
    ready = False
    acknowledged: dict[str, tuple[int, int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["ready"]:
                ready = True
            elif parts[:1] == ["ok"] and len(parts) == 4:
                acknowledged[parts[1]] = (int(parts[2]), int(parts[3]))
    return ready, acknowledged


def test_sigkill_mid_commit_leaves_whole_batches(tmp_path: Path) -> None:
    seed = int(os.environ.get("PERDURE_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    path = tmp_path / "log"
    model = LogModel()
    LmdbLog(path).close()  # create it: epoch 1, seq 1
    zygote = Child("zygote", stderr_path=tmp_path / "zygote.err")
    start = time.monotonic()
    iterations = batches = after_commits = 0
    pid = 0  # the appender alive at this moment, if any
    try:
        for it in range(ITERATIONS):
            if it >= MIN_ITERATIONS and time.monotonic() - start > TIME_BUDGET:
                break
            progress = tmp_path / f"progress-{it}.txt"
            spec = {
                "path": str(path),
                "tag": f"i{it}",
                "tasks": TASKS,
                "n": BATCH,
                "progress": str(progress),
            }
            zygote.send(f"fork {json.dumps(spec)}")
            pid = zygote.read()["pid"]
            if rng.random() < EARLY_KILLS:
                time.sleep(rng.uniform(0, 0.03))  # while it opens the log, or soon after
            else:
                _wait_ready(progress)
                time.sleep(rng.uniform(0, MAX_DELAY))
            os.kill(pid, signal.SIGKILL)
            zygote.send(f"reap {pid}")
            status = zygote.read()
            pid = 0
            assert status["signal"] == signal.SIGKILL, (
                f"seed {seed}, iteration {it}: the child died on its own: {status}{zygote.stderr()}"
            )
            ready, acknowledged = _read_progress(progress)
            after_commits += bool(acknowledged)
            log = LmdbLog(path)  # no takeover: the flock died with the child
            try:
                new = check_log(log, model)
                batches += _check_batches(new, acknowledged)
                assert ready or not acknowledged
            except AssertionError as exc:
                raise AssertionError(f"seed {seed}, iteration {it}: {exc}") from exc
            finally:
                log.close()
            iterations += 1
        zygote.send("quit")
        assert zygote.wait() == 0
    finally:
        if pid:  # a failed check must not leave an appender running
            os.kill(pid, signal.SIGKILL)
        zygote.close()
    # Once more from scratch: the whole accumulated log, every index, every checksum.
    log = LmdbLog(path)
    try:
        check_log(log, LogModel())
    finally:
        log.close()
    assert iterations >= MIN_ITERATIONS
    # The sweep must really have killed children in the middle of appending.
    assert after_commits >= iterations // 3, (
        f"seed {seed}: only {after_commits} of {iterations} children committed anything"
    )
    assert batches > iterations
    record_stat("mid_commit_kills", kills=iterations, batches=batches)
