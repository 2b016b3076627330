"""The rows for results tied to the goal revision, proven as data in, data out.

Every result records the revision its call answered (``ToolCompleted.goal_rev``; an
older log's result falls back to its call's); when a revision lands, the model's
next request says which earlier results came under which revision; a SAFE tool that
declares ``depends_on_goal`` is run once more under the new revision (a task of its
own, ``rerun_of``) before the model continues, and the model reads the new result.
"""

from __future__ import annotations

from typing import Annotated

import perdure
from perdure.actors import protocol
from perdure.actors.conversation import messages, revision_text
from perdure.actors.entities import Revision
from perdure.providers.base import TextBlock
from perdure.storage.records import (
    GenerationStarted,
    RecoveryDecision,
    ToolCompleted,
    ToolExecuting,
    ToolTaskCreated,
)
from tests.core.sim import TOOLS, Session, kinds, only, runs


@perdure.tool(replay=perdure.ReplayPolicy.SAFE, depends_on_goal=True)
async def search(route: str) -> str:
    """Search flights for what was asked."""
    return route


TOOLS_WITH_SEARCH = {**TOOLS, search.name: search}


def searched_then(*, revise_while_the_model_thinks: bool = True) -> Session:
    """A run that searched (goal-dependent) and looked something up, then was revised."""
    s = Session(TOOLS_WITH_SEARCH)
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply("looking", ("c1", "search", {"route": "LHR-OSL"}), ("c2", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="3 flights to Oslo")
    s.finish_tool("c2", output="the weather")
    assert s.state.current_generation().phase == "started"  # type: ignore[union-attr]
    if not revise_while_the_model_thinks:
        s.reply("and?", ("c3", "lookup", {"query": "more"}))
    return s


def last_user_text(s: Session) -> str:
    last = messages(s.state)[-1]
    assert last.role == "user"
    texts = [b.text for b in last.content if isinstance(b, TextBlock)]
    return texts[-1]


def test_every_result_records_the_revision_its_call_answered() -> None:
    s = searched_then()
    done = only(s.log, ToolCompleted)
    assert [(d.call_id, d.goal_rev) for d in done] == [("c1", 0), ("c2", 0)]
    s.command(protocol.Revise("v1", "fly to Bergen instead"))
    s.finish_tool("c1@rev1", output="2 flights to Bergen")
    assert only(s.log, ToolCompleted)[-1].goal_rev == 1
    assert s.state.tasks["c1@rev1"].result_rev == 1


def test_a_result_of_an_older_log_answers_the_revision_of_its_call() -> None:
    s = searched_then()
    task = s.state.tasks["c1"]
    assert task.result is not None
    task.result = ToolCompleted(session_id="s1", call_id="c1", output="x", at=1.0)
    assert task.result.goal_rev is None and task.result_rev == task.goal_rev == 0


def test_a_goal_dependent_result_is_run_again_under_the_new_revision_before_the_model() -> None:
    s = searched_then()
    step, _ = s.command(protocol.Revise("v1", "fly to Bergen instead"))
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.rerun_of, c.goal_rev, c.input) for c in created] == [
        ("c1@rev1", "c1", 1, {"route": "LHR-OSL"})
    ]
    assert runs(step) == [("c1@rev1", 1)], "the re-run runs at once; the lookup is not re-run"
    assert not only(step.records, GenerationStarted), "the model waits for the re-run"
    again = s.finish_tool("c1@rev1", output="2 flights to Bergen")
    assert "GenerationStarted" in kinds(again), "then the model continues"
    assert not only(again.records, ToolTaskCreated), "run again once, not once per settle"
    text = last_user_text(s)
    assert "(revision 1)" in text
    assert "- lookup (c2): revision 0" in text
    assert (
        "- search (c1): revision 0; its result depends on the request, so it was run again "
        "under revision 1, and the new result (c1@rev1) is: 2 flights to Bergen"
    ) in text


def test_a_revision_after_the_turn_lists_the_results_of_every_earlier_turn() -> None:
    s = searched_then(revise_while_the_model_thinks=False)
    s.finish_tool("c3", output="more")
    s.command(protocol.Revise("v1", "fly to Bergen instead"))
    s.finish_tool("c1@rev1", output="Bergen")
    rev = next(i for i in s.state.conversation if isinstance(i, Revision))
    assert rev.earlier == ["c1", "c2", "c3"]
    text = revision_text(s.state, rev)
    assert "- lookup (c3): revision 0" in text and "- lookup (c2): revision 0" in text


def test_a_call_unfinished_at_the_revision_is_listed_with_its_fate_not_as_earlier() -> None:
    s = Session(TOOLS_WITH_SEARCH)
    s.command(protocol.Submit("r1", "fly"))
    s.reply("x", ("c1", "lookup", {"query": "q"}), ("c2", "send", {"text": "t"}))
    s.finish_tool("c1", output="found")
    s.command(protocol.Revise("v1", "fly later"))
    s.finish_tool("c2", output="sent")
    rev = next(i for i in s.state.conversation if isinstance(i, Revision))
    assert (rev.call_ids, rev.earlier) == (["c2"], ["c1"])


def test_a_second_revision_runs_the_latest_result_again_not_the_first() -> None:
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))
    s.finish_tool("c1@rev1", output="Bergen flights")
    s.reply("more?")  # the turn under revision 1 ends without calls; the run finishes
    s.command(protocol.Submit("r2", "and a hotel"))
    s.reply("searching", ("c4", "search", {"route": "BGO"}))
    s.finish_tool("c4", output="hotels")
    step, _ = s.command(protocol.Revise("v2", "Tromsø"))
    assert [c.call_id for c in only(step.records, ToolTaskCreated)] == ["c4@rev2"]


def test_a_revision_reruns_the_latest_of_a_chain_within_one_request() -> None:
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))
    s.finish_tool("c1@rev1", output="Bergen flights")
    step, _ = s.command(protocol.Revise("v2", "Tromsø"))
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.rerun_of) for c in created] == [("c1@rev1@rev2", "c1@rev1")]


def test_a_restart_during_the_rerun_runs_it_again_and_creates_no_second_one() -> None:
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))
    step = s.restart()
    assert not only(step.records, ToolTaskCreated)
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1@rev1")
    assert decision.action.startswith("re-run with the same idempotency key")
    assert runs(step) == [("c1@rev1", 2)]
    assert only(step.records, ToolExecuting)[0].idempotency_key == (
        s.state.tasks["c1@rev1"].executing.idempotency_key  # type: ignore[union-attr]
    )


def test_a_tool_that_no_longer_depends_on_the_goal_is_not_run_again() -> None:
    s = searched_then()
    s.tools = {**TOOLS, "search": perdure.tool(replay=perdure.ReplayPolicy.SAFE)(search.fn)}
    step, _ = s.command(protocol.Revise("v1", "Bergen"))
    assert not only(step.records, ToolTaskCreated)
    assert "GenerationStarted" in kinds(step)


def test_a_paused_session_runs_nothing_again_until_it_is_resumed() -> None:
    s = searched_then()
    s.command(protocol.Pause("p1"))
    step, _ = s.command(protocol.Revise("v1", "Bergen"))
    assert not runs(step) and not only(step.records, ToolTaskCreated)
    step, _ = s.command(protocol.Resume("p2"))
    assert runs(step) == [("c1@rev1", 1)]


def test_the_revision_text_says_a_rerun_still_runs_or_failed() -> None:
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))
    rev = next(i for i in s.state.conversation if isinstance(i, Revision))
    assert revision_text(s.state, rev).count("run again under revision 1 (still running)") == 1
    s.finish_tool("c1@rev1", output="the search service is down", outcome="error", is_error=True)
    assert (
        "so it was run again under revision 1, and that failed (c1@rev1): "
        "the search service is down"
    ) in revision_text(s.state, rev)


def test_a_failed_goal_dependent_call_is_run_again_too_a_denied_one_is_not() -> None:
    s = Session(TOOLS_WITH_SEARCH)
    s.command(protocol.Submit("r1", "fly"))
    s.reply("x", ("c1", "search", {"route": "A"}), ("c2", "search", {"route": 5}))
    s.finish_tool("c1", output="timeout upstream", outcome="error", is_error=True)
    assert s.state.tasks["c2"].executing is None, "invalid arguments: it never ran"
    step, _ = s.command(protocol.Revise("v1", "fly elsewhere"))
    assert [c.call_id for c in only(step.records, ToolTaskCreated)] == ["c1@rev1"]


@perdure.tool(replay=perdure.ReplayPolicy.SAFE, depends_on_goal=True)
async def quote(route: str, api_key: Annotated[str, perdure.Secret]) -> str:
    """Quote a fare for what was asked (with a secret key)."""
    return route


def test_a_call_stopped_by_the_revision_does_not_keep_a_later_result_from_its_rerun() -> None:
    """Every completed goal-dependent result of the request is run again, wherever it
    stands among calls that ended otherwise; a re-run masks the secrets its call did."""
    s = Session({**TOOLS_WITH_SEARCH, quote.name: quote})
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply(
        "looking",
        ("c1", "lookup", {"query": "q"}),
        ("c2", "search", {"route": "LHR-OSL"}),
        ("c3", "quote", {"route": "LHR-OSL", "api_key": "k"}),
    )
    s.finish_tool("c2", output="3 flights to Oslo")
    s.finish_tool("c3", output="120 EUR")
    s.command(protocol.Revise("v1", "fly to Bergen instead"))  # c1 is still running: stopped
    step = s.finish_tool("c1", output="stopped", outcome="cancelled")
    assert s.state.tasks["c1"].phase == "cancelled"
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.secret) for c in created] == [("c2@rev1", []), ("c3@rev1", ["api_key"])]


def test_a_rerun_stopped_by_a_second_revision_is_run_again_under_it() -> None:
    """A re-run that a newer revision stopped produced nothing: the call it stood for is
    run once more under the newest revision, so the model never continues on the result
    of the first goal alone."""
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))  # c1@rev1 starts
    s.command(protocol.Revise("v2", "Tromsø"))  # ... and is stopped before it finishes
    step = s.finish_tool("c1@rev1", output="stopped", outcome="cancelled")
    assert s.state.tasks["c1@rev1"].phase == "cancelled"
    tasks = [*only(s.log, ToolTaskCreated)]
    assert [(c.call_id, c.rerun_of, c.goal_rev) for c in tasks[-1:]] == [("c1@rev2", "c1", 2)]
    s.finish_tool("c1@rev2", output="Tromsø flights")
    assert "Tromsø flights" in str(messages(s.state))
    assert step is not None


@perdure.tool(replay=perdure.ReplayPolicy.SAFE, depends_on_goal=True, requires_approval=True)
async def search_approved(route: str) -> str:
    """Search flights for what was asked, once a person approves the search."""
    return route


@perdure.tool(replay=perdure.ReplayPolicy.SAFE, depends_on_goal=True, cancellable=False)
async def search_to_the_end(route: str) -> str:
    """Search flights for what was asked; a started search is never stopped."""
    return route


def searched_with(tool: perdure.Tool) -> Session:
    """A run whose one call, of ``tool``, completed; the model thinks about its result."""
    s = Session({**TOOLS, tool.name: tool})
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply("looking", ("c1", tool.name, {"route": "LHR-OSL"}))
    if tool.requires_approval:
        s.command(protocol.Approve("c1", True, "a1"))
    s.finish_tool("c1", output="3 flights to Oslo")
    return s


def test_a_rerun_called_off_before_it_started_is_run_again_under_the_second_revision() -> None:
    """A re-run a second revision calls off while it waits (here for its approval) never
    ran: the call it stood for is run once more under the revision in force, and the
    model reads that result, not only the one of the first goal."""
    s = searched_with(search_approved)
    s.command(protocol.Revise("v1", "Bergen"))
    assert s.state.tasks["c1@rev1"].phase == "awaiting_approval"
    step, _ = s.command(protocol.Revise("v2", "Tromsø"))
    assert s.state.tasks["c1@rev1"].phase == "cancelled"
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.rerun_of, c.goal_rev) for c in created] == [("c1@rev2", "c1", 2)]
    s.command(protocol.Approve("c1@rev2", True, "a2"))
    done = s.finish_tool("c1@rev2", output="2 flights to Tromsø")
    assert "GenerationStarted" in kinds(done), "then the model continues"
    assert (
        "- search_approved (c1): revision 0; its result depends on the request, so it was "
        "run again under revision 2, and the new result (c1@rev2) is: 2 flights to Tromsø"
    ) in last_user_text(s)


def test_a_rerun_left_to_finish_after_the_second_revision_is_itself_run_again() -> None:
    """A re-run that cannot be stopped finishes under the first revision after the second
    one landed: its result answers the first goal, so it is run again under the second
    (the call it stood for is not run a second time beside it)."""
    s = searched_with(search_to_the_end)
    s.command(protocol.Revise("v1", "Bergen"))
    step, _ = s.command(protocol.Revise("v2", "Tromsø"))
    assert not any(isinstance(e, protocol.CancelTool) for e in step.effects)
    assert s.state.tasks["c1@rev1"].phase == "executing", "nothing stops it: it runs to its end"
    late = s.finish_tool("c1@rev1", output="2 flights to Bergen")
    created = only(late.records, ToolTaskCreated)
    assert [(c.call_id, c.rerun_of, c.goal_rev) for c in created] == [
        ("c1@rev1@rev2", "c1@rev1", 2)
    ]
    s.finish_tool("c1@rev1@rev2", output="4 flights to Tromsø")
    assert (
        "- search_to_the_end (c1@rev1): completed after the change; its result is above; "
        "its result depends on the request, so it was run again under revision 2, and the "
        "new result (c1@rev1@rev2) is: 4 flights to Tromsø"
    ) in last_user_text(s)


def test_the_latest_rerun_stands_for_its_call_not_an_earlier_stopped_one() -> None:
    """Once a call's re-run under the second revision has its result, a third revision
    runs that result again; the re-run the second revision stopped no longer counts."""
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))
    s.command(protocol.Revise("v2", "Tromsø"))
    s.finish_tool("c1@rev1", output="stopped", outcome="cancelled")
    s.finish_tool("c1@rev2", output="Tromsø flights")
    step, _ = s.command(protocol.Revise("v3", "Bodø"))
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.rerun_of) for c in created] == [("c1@rev2@rev3", "c1@rev2")]


def test_a_rerun_stopped_under_the_revision_in_force_is_not_run_again() -> None:
    """A re-run the runtime stopped while no newer revision came is that revision's
    answer: it failed, the model reads so and goes on; nothing is run a second time
    under the same revision."""
    s = searched_then()
    s.command(protocol.Revise("v1", "Bergen"))
    step = s.finish_tool("c1@rev1", output="stopped", outcome="cancelled")
    assert not only(step.records, ToolTaskCreated)
    assert "GenerationStarted" in kinds(step)
    assert (
        "so it was run again under revision 1, and that failed (c1@rev1): perdure: this "
        "call was stopped while it was running: the runtime stopped it."
    ) in last_user_text(s)


def test_a_call_whose_rerun_was_stopped_is_run_again_beside_one_whose_rerun_stands() -> None:
    """Each goal-dependent call of a turn is judged on its own: one whose re-run has its
    result stands for it (that re-run is run again), and the next one in the same turn,
    whose re-run a newer revision stopped, is run again itself."""
    s = Session(TOOLS_WITH_SEARCH)
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply("looking", ("c1", "search", {"route": "LHR-OSL"}), ("c2", "search", {"route": "OSL"}))
    s.finish_tool("c1", output="3 flights to Oslo")
    s.finish_tool("c2", output="2 hotels in Oslo")
    s.command(protocol.Revise("v1", "Bergen"))
    s.finish_tool("c1@rev1", output="2 flights to Bergen")  # c2@rev1 still runs
    step, _ = s.command(protocol.Revise("v2", "Tromsø"))
    step += s.finish_tool("c2@rev1", output="stopped", outcome="cancelled")
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.rerun_of) for c in created] == [
        ("c2@rev2", "c2"),
        ("c1@rev1@rev2", "c1@rev1"),
    ]
