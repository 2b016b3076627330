"""``perdure.tune_gc``: what it changes in the collector, and that nothing else does.

A library must not change the process's collector behind the application's back: a
runtime opened and used leaves the thresholds and the frozen set as they were; only an
explicit ``tune_gc`` (as ``perdure serve`` calls) changes them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from perdure.providers.scripted import Reply, ScriptedProvider


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_tune_gc_raises_the_young_threshold_and_freezes(collector: None) -> None:
    _, middle, oldest = gc.get_threshold()
    gc.unfreeze()
    perdure.tune_gc(12_345)
    assert gc.get_threshold() == (12_345, middle, oldest)
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
    perdure.tune_gc(freeze=False)
    assert gc.get_threshold()[0] == perdure.collector.YOUNG_THRESHOLD
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError, match="positive"):
        perdure.tune_gc(0)


async def test_a_runtime_leaves_the_collector_alone(collector: None, tmp_path: Path) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    provider = ScriptedProvider([Reply(text="done")])
    async with perdure.open_runtime(tmp_path / "log", provider=provider) as rt:
        sid = await rt.create_session()
        await rt.submit(sid, "hi", request_id="r")
        await rt.wait_idle(sid)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
