"""The observer seam: telemetry that fails never stops a run, and sees only durable records."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

import perdure
from perdure.observability.hooks import check_traceparent
from perdure.providers.scripted import Reply, ScriptedProvider
from perdure.storage.records import Committed, Record
from perdure.view import SessionLookup


class Broken:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def before_commit(self, state: SessionLookup, records: Sequence[Record]) -> Sequence[Record]:
        raise RuntimeError("observer bug before")

    def after_commit(self, state: SessionLookup, committed: Sequence[Committed]) -> None:
        self.seen.extend(c.seq for c in committed)
        raise RuntimeError("observer bug after")

    def commit_failed(self, state: SessionLookup, records: Sequence[Record]) -> None:
        raise RuntimeError("observer bug failed")


async def test_a_failing_observer_is_logged_and_the_run_completes(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    with caplog.at_level(logging.ERROR, logger="perdure.session"):
        async with perdure.open_runtime(
            log_dir, provider=ScriptedProvider([Reply(text="hi")]), telemetry=broken
        ) as rt:
            sid = await rt.create_session("s1")
            await rt.submit(sid, "go")
            outcome = await rt.wait_idle(sid)
            seqs = [c.seq for c in await rt._journal.read_session(sid)]
    assert outcome is not None
    assert outcome.status == "completed"
    # It saw every record of the session's actor, each once it was durable.
    assert broken.seen == sorted(set(broken.seen)), "in commit order, each once"
    assert broken.seen == seqs[1:]  # all but SessionCreated (the supervisor writes it)
    messages = [r.getMessage() for r in caplog.records]
    assert any("an observer failed before a commit" in m for m in messages)
    assert any("an observer failed after a commit" in m for m in messages)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    ],
)
def test_malformed_traceparents_are_refused_clearly(bad: str) -> None:
    with pytest.raises(ValueError, match="not a W3C traceparent"):
        check_traceparent(bad)


def test_a_well_formed_traceparent_is_kept() -> None:
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert check_traceparent(good) == good
