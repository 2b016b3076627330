"""One owner at a time: a live owner refuses a second, a dead one is taken over, a stopped
one is fenced.

Owners are real processes (``_child.py owner``), killed and stopped with real signals:

* while a live process owns the log, opening it again raises ``LogBusy`` naming the
  owner's pid, and the owner is not disturbed (it appends on, in its epoch);
* a SIGKILLed owner's lock dies with it: the next open needs no takeover, the epoch
  rises and every record of the dead owner is intact;
* a SIGSTOPped owner can be taken over with ``takeover=True``; when it wakes and
  appends it gets ``LogFenced`` (and exits with ``FENCED_EXIT``), writing nothing,
  even when the new owner grew the map past the old owner's map size meanwhile;
* epochs (``LogOpened`` records and ``stored_epoch``) only ever rise.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perdure.storage import LogBusy
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import LogOpened, ToolCompleted
from tests.storage._check import LogModel, check_log
from tests.storage._child import FENCED_EXIT
from tests.storage._procs import Child
from tests.support.stats import record_stat

Spawn = Callable[..., Child]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start ``_child.py`` processes; each is killed (if need be) and reaped after the test."""
    children: list[Child] = []

    def start(*args: str) -> Child:
        child = Child(*args, stderr_path=tmp_path / f"child-{len(children)}.err")
        children.append(child)
        return child

    yield start
    for child in children:
        child.close()


def epochs(log: LmdbLog) -> list[int]:
    return [c.record.epoch for c in log.read_global() if isinstance(c.record, LogOpened)]


def test_second_live_owner_is_refused_with_the_owners_pid(tmp_path: Path, spawn: Spawn) -> None:
    path = tmp_path / "log"
    owner = spawn("owner", str(path))
    hello = owner.read()
    assert hello == {"pid": owner.pid, "epoch": 1, "seq": 2}

    with pytest.raises(LogBusy, match=rf"owned by pid {owner.pid} on .* \(epoch 1\)"):
        LmdbLog(path)
    with pytest.raises(LogBusy, match=rf"pid {owner.pid}"):
        LmdbLog(path)  # and again: a refused open leaves nothing behind

    # The owner never noticed: same epoch, its appends go on.
    owner.send("append")
    assert owner.read() == {"seq": 3}
    owner.send("exit")
    assert owner.wait() == 0

    log = LmdbLog(path)
    try:
        assert epochs(log) == [1, 2]
        check_log(log, LogModel())
    finally:
        log.close()
    record_stat("takeover", refused=1)


def test_sigkilled_owner_is_taken_over_without_asking(tmp_path: Path, spawn: Spawn) -> None:
    path = tmp_path / "log"
    owner = spawn("owner", str(path))
    assert owner.read()["epoch"] == 1
    owner.send("append")
    assert owner.read() == {"seq": 3}
    os.kill(owner.pid, signal.SIGKILL)
    assert owner.wait() == -signal.SIGKILL

    log = LmdbLog(path)  # no takeover=True: the dead owner's flock is gone
    try:
        assert log.epoch == 2
        assert log.stored_epoch() == 2
        records = [c.record for c in log.read_global()]
        assert isinstance(records[0], LogOpened)
        assert records[0].pid == owner.pid
        assert records[2] == ToolCompleted(
            session_id=f"owner-{owner.pid}", call_id="call-1", output="from the owner", at=2.0
        )
        opened = records[3]
        assert isinstance(opened, LogOpened)
        assert (opened.epoch, opened.pid) == (2, os.getpid())
        check_log(log, LogModel())
    finally:
        log.close()
    record_stat("takeover", takeovers=1)


@pytest.mark.parametrize("grow_map", [False, True], ids=["same-map", "map-grown-meanwhile"])
def test_stopped_owner_is_fenced_after_takeover(
    tmp_path: Path, spawn: Spawn, grow_map: bool
) -> None:
    path = tmp_path / "log"
    old = spawn("owner", str(path), "--map-size", str(64 << 10))
    assert old.read()["epoch"] == 1
    old.send("append")
    assert old.read() == {"seq": 3}

    os.kill(old.pid, signal.SIGSTOP)
    try:
        with pytest.raises(LogBusy):
            LmdbLog(path)  # stopped is not dead: without takeover, still refused
        new = LmdbLog(path, takeover=True)
    finally:
        os.kill(old.pid, signal.SIGCONT)
    try:
        assert new.epoch == 2
        size = 200_000 if grow_map else 100
        ours = [
            ToolCompleted(session_id="new", call_id=f"n{i}", output="n" * size, at=3.0)
            for i in range(6)
        ]
        (done,) = new.commit([(ours, None)])
        assert isinstance(done, list)
        if grow_map:
            assert new.stat()["map_size"] > 6 * size  # well past the old owner's 64 KiB

        old.send("append")  # the old owner wakes up and tries to write
        answer = old.read()
        assert "fenced" in answer, f"expected LogFenced, got {answer}{old.stderr()}"
        assert "no longer owns the log" in answer["fenced"]
        assert old.wait() == FENCED_EXIT

        records = [c.record for c in new.read_global()]
        assert records[-6:] == ours  # the new owner's records, and nothing after them
        assert not any(getattr(r, "call_id", None) == "call-2" for r in records)
        model = LogModel()
        check_log(new, model)
        assert model.epochs == [1, 2]
    finally:
        new.close()

    again = LmdbLog(path)  # both owners are gone now
    try:
        assert again.epoch == 3
        assert epochs(again) == [1, 2, 3]
    finally:
        again.close()
    record_stat("takeover", takeovers=1, fenced=1)
