"""Sessions as a whole, decided in the core: create, fork, delete, keep, orphan.

The supervisor and ``perdure.retention`` read the log and persist; what to record,
and what to refuse, is ``perdure.actors.decide.sessions``. These tests ask it
directly, on records made by the same core (``tests.core.sim``).
"""

from __future__ import annotations

import re

import pytest

from perdure.actors import protocol
from perdure.actors.decide import sessions
from perdure.actors.decide.sessions import NewSession
from perdure.actors.protocol import Env
from perdure.errors import Refused, UnknownSession
from perdure.storage.backend import SessionInfo
from perdure.storage.records import (
    Budget,
    Committed,
    CompactionPolicy,
    InputAccepted,
    SessionCreated,
    SessionDeleted,
    SessionForked,
)
from tests.core.sim import TOOLS, Session, decide_committed


def committed(records: list) -> list[Committed]:  # type: ignore[type-arg]
    return [decide_committed(i, r) for i, r in enumerate(records, 1)]


def test_a_new_session_is_created_with_its_task_in_one_commit() -> None:
    task = protocol.Submit("agent:k:1", "find it")
    new = NewSession(session_id="p.agent-1", system="child", parent="p/c1", task=task)
    records = sessions.create(new, None, Env(tools=TOOLS, now=5.0), 5.0)
    created, accepted = records
    assert isinstance(created, SessionCreated) and created.parent == "p/c1"
    assert created.system == "child" and created.at == 5.0
    assert isinstance(accepted, InputAccepted)
    assert (accepted.request_id, accepted.text) == ("agent:k:1", "find it")


def test_creating_an_existing_session_records_nothing_unless_the_prompt_differs() -> None:
    first = committed([SessionCreated(session_id="s1", system="be brief", at=1.0)])
    env = Env(tools=TOOLS, now=2.0)
    assert sessions.create(NewSession(session_id="s1", system="be brief"), first, env, 2.0) == ()
    assert sessions.create(NewSession(session_id="s1"), [], env, 2.0) == ()
    with pytest.raises(Refused, match="different system prompt") as refused:
        sessions.create(NewSession(session_id="s1", system="be long"), first, env, 2.0)
    assert refused.value.code == "conflict"


def test_a_session_is_created_with_every_setting_it_was_asked_for() -> None:
    """The ``SessionCreated`` holds the session's own budget, busy rule, grant of tools
    and compaction policy (each read back after a restart), and the task accepted with
    it belongs to that session."""
    new = NewSession(
        session_id="p.agent-1",
        system="child",
        budget=Budget(run_tokens=500),
        if_busy="reject",
        parent="p/c1",
        tools=["lookup"],
        task=protocol.Submit("agent:k:1", "find it"),
        compaction=CompactionPolicy(keep_recent=2),
    )
    created, accepted, *_ = sessions.create(new, None, Env(tools=TOOLS, now=5.0), 5.0)
    assert created == SessionCreated(
        session_id="p.agent-1",
        system="child",
        budget=Budget(run_tokens=500),
        if_busy="reject",
        parent="p/c1",
        tools=["lookup"],
        compaction=CompactionPolicy(keep_recent=2),
        at=5.0,
    )
    assert isinstance(accepted, InputAccepted) and accepted.session_id == "p.agent-1"


def test_creating_a_session_again_with_another_grant_of_tools_is_a_conflict() -> None:
    """The same grant (in any order) records nothing; another grant, or a grant for a
    session created with every tool, is refused; a sub-agent found again by a re-run of
    its parent call keeps the grant it was created with."""
    env = Env(tools=TOOLS, now=2.0)
    granted = committed([SessionCreated(session_id="s1", tools=["a", "b"], at=1.0)])
    every = committed([SessionCreated(session_id="s1", at=1.0)])
    assert sessions.create(NewSession(session_id="s1", tools=["b", "a"]), granted, env, 2.0) == ()
    for existing, asked in ((granted, ["a"]), (every, ["a", "b"])):
        with pytest.raises(Refused) as refused:
            sessions.create(NewSession(session_id="s1", tools=asked), existing, env, 2.0)
        assert refused.value.code == "conflict"
        assert str(refused.value) == "session 's1' already exists with a different grant of tools"
    child = NewSession(session_id="s1", tools=["a"], parent="p/c1")
    assert sessions.create(child, granted, env, 2.0) == ()
    assert sessions.create(child, every, env, 2.0) == ()


def _finished_session() -> list[Committed]:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("done")
    return committed(s.log)


def test_a_fork_copies_the_prefix_and_is_idempotent_by_its_request_id() -> None:
    history = _finished_session()
    decided = sessions.fork("s1", "f1", None, "fk1", existing=None, history=history, now=9.0)
    assert decided.forked.position == history[-1].seq and not decided.forked.duplicate
    created, forked, *copies = decided.records
    assert isinstance(forked, SessionForked) and forked.request_id == "fk1"
    assert len(copies) == len(history) - 1 and all(r.session_id == "f1" for r in copies)
    again = sessions.fork(
        "s1", "f1", None, "fk1", existing=committed([created, forked]), history=[], now=10.0
    )
    assert again.forked.duplicate and again.records == ()
    assert again.forked.position == decided.forked.position
    with pytest.raises(Refused, match="is not this fork"):
        sessions.fork(
            "s1", "f1", None, "other", existing=committed([created, forked]), history=[], now=10.0
        )
    with pytest.raises(UnknownSession):
        sessions.fork("nope", "f2", None, "fk2", existing=None, history=[], now=10.0)


def _parent(call_phase_done: bool) -> list[Committed]:
    """The log of a parent session s1 whose call c1 runs (or has finished)."""
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    if call_phase_done:
        s.finish_tool("c1", output="the child's answer")
    return committed(s.log)


def test_a_sub_agent_is_kept_while_its_parent_call_waits_and_is_an_orphan_after() -> None:
    first = committed([SessionCreated(session_id="s1.agent-x", parent="s1/c1", at=1.0)])
    waiting = _parent(call_phase_done=False)
    assert sessions.dependency(first, waiting) == "its parent call s1/c1 still waits for it"
    assert sessions.orphaned(first, waiting) is None
    done = _parent(call_phase_done=True)
    assert sessions.dependency(first, done) is None
    stop = sessions.orphaned(first, done)
    assert stop == protocol.Cancel(request_id="orphan:s1/c1")
    assert sessions.orphaned(first, []) == stop  # its parent is gone
    assert sessions.dependency(first, []) is None
    other_call = committed([SessionCreated(session_id="s1.agent-y", parent="s1/c9", at=1.0)])
    assert sessions.dependency(other_call, waiting) is None  # c9 is no call of s1
    plain = committed([SessionCreated(session_id="s2", at=1.0)])
    assert sessions.parent_call(plain) is None
    assert sessions.dependency(plain, done) is None and sessions.orphaned(plain, done) is None


def test_a_deletion_names_why_it_is_refused() -> None:
    info = SessionInfo("s1", 1, 4, 4, 0, 0)
    marker = sessions.deletion("s1", info, None, "pruned", 7.0)
    assert marker == SessionDeleted(deleted="s1", reason="pruned", at=7.0)
    with pytest.raises(UnknownSession):
        sessions.deletion("s1", None, None, "", 7.0)
    with pytest.raises(Refused, match="not deleted: its parent call s1/c1 still waits"):
        sessions.deletion("s1", info, "its parent call s1/c1 still waits for it", "", 7.0)
    sessions.refuse_unfinished("s1", info)
    sessions.refuse_unfinished("s1", None)
    with pytest.raises(Refused, match="unfinished work") as busy:
        sessions.refuse_unfinished("s1", SessionInfo("s1", 1, 4, 4, 0, 1))
    assert busy.value.code == "busy"


def _two_runs() -> list[Committed]:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("first")
    s.command(protocol.Submit("r2", "again"))
    s.reply("second")
    return committed(s.log)


def test_a_fork_answers_with_its_ids_and_is_taken_where_asked_at_the_time_given() -> None:
    history = _two_runs()
    ends = [c for c in history if type(c.record).__name__ == "RunFinished"]
    first_end = ends[0]
    decided = sessions.fork(
        "s1", "f1", first_end.record.run_id, "fk1", existing=None, history=history, now=9.0
    )
    assert (decided.forked.session_id, decided.forked.source) == ("f1", "s1")
    assert decided.forked.position == first_end.seq < history[-1].seq  # not the latest point
    assert all(r.at == 9.0 for r in decided.records[:2])  # created and forked: now
    created, forked = decided.records[:2]
    again = sessions.fork(
        "s1", "f1", None, "fk1", existing=committed([created, forked]), history=[], now=10.0
    )
    assert (again.forked.session_id, again.forked.source) == ("f1", "s1")


def test_a_fork_over_a_session_that_is_not_this_fork_is_a_conflict() -> None:
    plain = committed([SessionCreated(session_id="f1", at=1.0)])
    for existing in (plain, []):  # another session of that id (or one not readable yet)
        with pytest.raises(Refused, match="is not this fork") as refused:
            sessions.fork("s1", "f1", None, "fk1", existing=existing, history=[], now=2.0)
        assert refused.value.code == "conflict"
    with pytest.raises(UnknownSession) as unknown:
        sessions.fork("nope", "f2", None, "fk2", existing=None, history=[], now=2.0)
    assert unknown.value.session_id == "nope"


def test_a_parent_call_id_may_hold_a_slash() -> None:
    """A session id never holds "/" (``check_session_id``), a model's call id may: the
    link "session/call" is split at its first "/"."""
    first = committed([SessionCreated(session_id="p.agent-1", parent="p/call/7", at=1.0)])
    assert sessions.parent_call(first) == ("p", "call/7")
    assert sessions.parent_call([]) is None  # nothing read: not a sub-agent


def test_a_deletion_refused_names_the_session_and_says_busy() -> None:
    info = SessionInfo("s1", 1, 4, 4, 0, 0)
    with pytest.raises(UnknownSession) as unknown:
        sessions.deletion("s1", None, None, "", 7.0)
    assert unknown.value.session_id == "s1"
    with pytest.raises(Refused) as kept:
        sessions.deletion("s1", info, "its parent call s1/c1 still waits for it", "", 7.0)
    assert kept.value.code == "busy"


def test_a_grant_of_tools_is_recorded_in_order_once_each_or_refused_by_name() -> None:
    """``check_grant``: None grants every tool; a grant keeps its order with each name
    once; a string, a name that is not a string or a tool not registered is refused
    with an error that names it (and the tools that are registered)."""
    assert sessions.check_grant(None, TOOLS) is None
    assert sessions.check_grant(iter(["send", "lookup", "send"]), TOOLS) == ["send", "lookup"]
    with pytest.raises(
        ValueError, match=r"^tools must be a list of tool names, not the string 'lookup'$"
    ):
        sessions.check_grant("lookup", TOOLS)
    with pytest.raises(ValueError, match=r"^tools must be tool names \(strings\), not \[3\]$"):
        sessions.check_grant(["lookup", 3], TOOLS)  # type: ignore[list-item]
    named = (
        "tools: no tool named 'fly', 'swim' is registered "
        "(registered: deploy, lookup, send, send_checked)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(named)}$"):
        sessions.check_grant(["lookup", "fly", "swim"], TOOLS)
    with pytest.raises(ValueError, match=r"\(registered: none\)$"):
        sessions.check_grant(["lookup"], {})


def test_a_session_sees_only_the_tools_it_is_granted() -> None:
    """``allowed_tools`` narrows the registered tools to a session's grant (None: all)."""
    assert sessions.allowed_tools(TOOLS, None) is TOOLS
    assert sessions.allowed_tools(TOOLS, iter(["send", "fly"])) == {"send": TOOLS["send"]}
    assert sessions.allowed_tools(TOOLS, []) == {}
