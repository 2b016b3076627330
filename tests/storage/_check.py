"""A full consistency check of a log: records against every index, incrementally.

``LogModel`` folds the records it has checked into what the indexes must say;
``check_log`` reads the records after the model's last seq (each read verifies the
frame's checksum), requires the sequence to continue without a gap, and then
compares the per-session index, the ``sessions`` summaries and the ``active``
index with the model. Running it again after more appends checks only the new
records against the indexes, so a long crash sweep stays linear.
"""

from __future__ import annotations

from attrs import define, field

from perdure.storage import SessionInfo
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Committed, GoalRevised, LogOpened, active_delta


@define
class SessionModel:
    first_seq: int = 0
    last_seq: int = 0
    records: int = 0
    goal_rev: int = 0
    open_submissions: int = 0


@define
class LogModel:
    last_seq: int = 0
    sessions: dict[str, SessionModel] = field(factory=dict)
    epochs: list[int] = field(factory=list)


def check_log(log: LmdbLog, model: LogModel) -> list[Committed]:
    """Check everything after ``model.last_seq``, advance the model, return the new records."""
    before = model.last_seq
    new = log.read_global(after=before)
    seqs = [c.seq for c in new]
    assert seqs == list(range(before + 1, before + 1 + len(new))), (
        f"sequence numbers after {before} are not gap-free: {seqs[:5]}...{seqs[-5:]}"
    )
    assert log.last_seq() == before + len(new)
    for c in new:
        record = c.record
        if isinstance(record, LogOpened):
            assert not model.epochs or record.epoch > model.epochs[-1], (
                f"epoch went from {model.epochs[-1]} to {record.epoch} at seq {c.seq}"
            )
            model.epochs.append(record.epoch)
        sid = record.session_id
        if not sid:
            continue
        s = model.sessions.setdefault(sid, SessionModel())
        if not s.records:
            s.first_seq = c.seq
        s.last_seq = c.seq
        s.records += 1
        if isinstance(record, GoalRevised):
            s.goal_rev = record.goal_rev
        delta = active_delta(record)
        s.open_submissions = 0 if delta is None else s.open_submissions + delta
        assert s.open_submissions >= 0, f"{sid}: more runs finished than inputs at seq {c.seq}"
    model.last_seq = before + len(new)
    if model.epochs:
        assert log.stored_epoch() == model.epochs[-1]

    for sid, s in model.sessions.items():
        expected = [c for c in new if c.record.session_id == sid]
        assert log.read_session(sid, after=before) == expected, f"by_session index of {sid}"
        assert log.session_info(sid) == SessionInfo(
            session_id=sid,
            first_seq=s.first_seq,
            last_seq=s.last_seq,
            records=s.records,
            goal_rev=s.goal_rev,
            open_submissions=s.open_submissions,
        )
    assert sorted(info.session_id for info in log.sessions()) == sorted(model.sessions)
    assert log.active_sessions() == sorted(
        sid for sid, s in model.sessions.items() if s.open_submissions > 0
    )
    return new
