"""The fold refuses a compaction record that does not follow the summary it names.

A log is replayed by the fold on every start; a record about a summary that is not the
one pending (a second start while one is pending, a result for another summary or for
none) is a corrupt or foreign log, and the fold must stop there naming the session, the
summary, the phase it found and the record, rather than build a state the dead process
never had. A summary with no run of its own (asked for while idle) spends on the
session itself.
"""

from __future__ import annotations

import attrs
import pytest

from perdure.actors import protocol
from perdure.actors.lifecycle import ImpossibleTransition
from perdure.storage.records import (
    CompactionAbandoned,
    CompactionRetryPending,
    CompactionStarted,
    ContextCompacted,
    Record,
    Usage,
)
from tests.core.sim import Session, only
from tests.core.test_compaction import answer, session, summarised, summary_failed, two_runs


def _pending() -> tuple[Session, str]:
    s, _ = two_runs(tokens=900)
    pending = s.state.compacting
    assert pending is not None
    return s, pending.started.compaction_id


def _results() -> list[Record]:
    """One of each record that ends or retries a summary, taken from real sessions."""
    s, _ = _pending()
    compacted = only(summarised(s).records, ContextCompacted)[0]
    s, _ = _pending()
    retry = only(summary_failed(s, jitter=1.0).records, CompactionRetryPending)[0]
    s, _ = _pending()
    abandoned = only(summary_failed(s, retryable=False).records, CompactionAbandoned)[0]
    return [compacted, retry, abandoned]


def test_a_second_summary_cannot_start_while_one_is_pending() -> None:
    s, compaction_id = _pending()
    again = attrs.evolve(s.state.compacting.started, compaction_id="c-other")  # type: ignore[union-attr]
    with pytest.raises(ImpossibleTransition) as refused:
        s.state.apply(again)
    err = refused.value
    assert (err.session_id, err.subject, err.phase, err.event) == (
        s.state.session_id,
        "c-other",
        "compacting",
        "CompactionStarted",
    )
    assert s.state.compacting is not None
    assert s.state.compacting.started.compaction_id == compaction_id, "the pending one kept"


def test_a_result_for_another_summary_names_the_one_pending() -> None:
    for record in _results():
        s, compaction_id = _pending()
        foreign = attrs.evolve(record, compaction_id="c-other")  # type: ignore[arg-type]
        with pytest.raises(ImpossibleTransition) as refused:
            s.state.apply(foreign)
        err = refused.value
        assert (err.session_id, err.subject, err.phase, err.event) == (
            s.state.session_id,
            "c-other",
            "compacting " + compaction_id,
            type(record).__name__,
        )


def test_a_result_with_no_summary_pending_is_refused_as_before_it_exists() -> None:
    for record in _results():
        s = session()
        s.command(protocol.Submit("r1", "q"))
        answer(s, "a", 10)
        assert s.state.compacting is None
        with pytest.raises(ImpossibleTransition) as refused:
            s.state.apply(record)
        err = refused.value
        assert (err.phase, err.event) == (None, type(record).__name__)
        assert "before it exists" in str(err)


def test_each_summary_started_is_counted() -> None:
    s, _ = _pending()
    assert s.state.compactions_started == 1
    before = s.state.compactions_started
    summarised(s)
    assert s.state.compacting is None
    started = attrs.evolve(
        only(_first_start(), CompactionStarted)[0],
        session_id=s.state.session_id,
        compaction_id="c-next",
        start=s.state.compacted_end,
        end=len(s.state.conversation),
    )
    s.state.apply(started)
    assert s.state.compactions_started == before + 1 == 2


def _first_start() -> list[Record]:
    _, step = two_runs(tokens=900)
    return list(step.records)


def test_a_summary_attempt_is_spent_under_the_model_that_made_it() -> None:
    """In a run, a failed or abandoned summary's cost counts for the run and the session
    under the summary's model; asked for while idle, it counts for the session alone."""
    s, _ = _pending()
    run_id = s.state.compacting.started.run_id  # type: ignore[union-attr]
    summary_failed(s, jitter=1.0)
    assert s.state.spend["small"] == s.state.runs[run_id].spend["small"] == Usage(input_tokens=3)
    summary_failed(s, retryable=False)
    assert s.state.spend["small"] == Usage(input_tokens=6)

    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 900)
    before, by_model = s.state.usage, dict(s.state.spend)
    s.command(protocol.CompactContext("k1"))
    assert s.state.compacting is not None and s.state.compacting.started.run_id == ""
    summary_failed(s, jitter=1.0)
    assert s.state.usage == before + Usage(input_tokens=3)
    assert s.state.spend == {**by_model, "small": Usage(input_tokens=3)}
    summary_failed(s, retryable=False)
    assert s.state.spend["small"] == Usage(input_tokens=6), "added to what it spent before"
