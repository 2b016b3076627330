"""The words the model reads beside the messages: a summary's request, a transcript, the
calls pinned after a summary, a revision's two lists, and the tool definitions a
request reuses.

``test_messages.py`` writes out the messages of a turn block by block; this file
does the same for the plain-text renderings of ``perdure.actors.conversation`` that
only the summary call and the revision notes use, so that a changed word, a dropped
field of the summary's request or a call pinned that should not be is a failing test
in the core, not only in the runtime suites that run a provider.
"""

from __future__ import annotations

import pytest

from perdure.actors import protocol
from perdure.actors.conversation import (
    MessageCache,
    messages,
    pinned_calls,
    request,
    revision_text,
    summary_request,
    summary_text,
    tool_definitions,
    transcript_text,
)
from perdure.actors.decide import compacting
from perdure.actors.entities import Revision
from perdure.providers.base import FailedAttempt, Message, TextBlock
from perdure.storage.records import CompactionAbandoned, CompactionPolicy
from tests.core.sim import TOOLS, Session, only
from tests.core.test_compaction import answer, session, summarised, summary_failed, two_runs
from tests.core.test_revision_results import TOOLS_WITH_SEARCH


def test_a_second_summarys_request_reads_the_first_then_the_covered_items() -> None:
    """The request of a summary made on a later attempt: the instruction, the previous
    summary, the covered items as plain text, one user message, no tools; it names the
    session, the compaction, the input the run answers and every failed attempt."""
    s, _ = two_runs(tokens=900, keep_recent=1)
    summarised(s, "FIRST")
    answer(s, "second answer", 950)
    s.command(protocol.Submit("r3", "third question"))
    summary_failed(s, jitter=1.0, provider="primary", fallback=True)
    pending = s.state.compacting
    assert pending is not None and s.state.run is not None
    req = summary_request(s.state, pending.started.compaction_id, 2)
    assert req.messages == (Message("user", req.messages[0].content),)
    assert req.messages[0].content[0].text == (  # type: ignore[union-attr]
        "Summarise this conversation of an agent with its user and tools.\n"
        "\n\n"
        "The summary of what came before:\n"
        "[perdure compacted the earlier conversation (2 items) into this summary; the full "
        "history is kept in the session's log.]\n\nFIRST\n"
        "\n\n"
        "The conversation:\n\nUser: second question\n\nAssistant: second answer"
    )
    assert req.tools == () and req.attempt == 2
    assert (req.session_id, req.generation_id) == ("s1", "s1.compaction2")
    assert req.submission_id == s.state.run.submission_id == "in3"
    assert req.failed == (FailedAttempt(attempt=1, provider="primary", fallback=True),)
    with pytest.raises(AssertionError):
        summary_request(s.state, "s1.compaction1", 2)  # not the compaction in progress


def test_a_summary_asked_for_while_idle_answers_no_input() -> None:
    """Compacting between runs: the summary's request names no input (there is no run)."""
    s = session(keep_recent=0)
    s.command(protocol.Submit("r1", "q"))
    answer(s, "a", 10)
    assert s.state.run is None
    s.command(protocol.CompactContext("k1"))
    pending = s.state.compacting
    assert pending is not None
    req = summary_request(s.state, pending.started.compaction_id, 1)
    assert req.submission_id == "" and req.failed == () and req.attempt == 1


def test_a_transcript_states_each_call_its_arguments_and_its_result_or_phase() -> None:
    """Every item as plain text: the input, the reply (or that it had no text) with each
    call's tool, id and arguments (sorted keys, characters as written) and its result or,
    while unfinished, its phase, and a revision in the words the model reads."""
    s = Session(TOOLS_WITH_SEARCH)
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply(
        "", ("c1", "search", {"route": "LHR-OSL"}), ("c2", "lookup", {"query": "Å", "limit": 2})
    )
    s.finish_tool("c1", output="3 flights")
    s.command(protocol.Revise("v1", "fly to Bergen"))
    user, turn, revision = (transcript_text(s.state, i) for i in s.state.conversation)
    assert user == "User: fly to Oslo"
    assert turn == (
        "Assistant: (no text)\n"
        'Tool call search (c1) with arguments {"route": "LHR-OSL"}\n'
        "Tool result (completed): 3 flights\n"
        'Tool call lookup (c2) with arguments {"limit": 2, "query": "Å"}\n'
        "Tool result (executing): (executing)"
    )
    assert revision == (
        "[The user revised the request (revision 1). It now reads: fly to Bergen\n"
        "Follow the revised request from here on; earlier instructions that conflict with "
        "it no longer apply.\n"
        "Actions that were unfinished when the request changed:\n"
        "- lookup (c2): still executing\n"
        "Results already given above, and the revision of the request each one answered "
        "(one of an earlier revision may not fit the request as it reads now):\n"
        "- search (c1): revision 0]"
    )


def test_an_unfinished_call_run_again_under_the_revision_says_so_with_its_fate() -> None:
    """A goal-dependent call unfinished when the request changed is run again once it
    finishes; the revision lists it with its fate and its re-run."""
    s = Session(TOOLS_WITH_SEARCH)
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply("looking", ("c1", "search", {"route": "LHR-OSL"}))
    s.command(protocol.Revise("v1", "fly to Bergen"))
    s.finish_tool("c1", output="3 flights")
    assert s.state.tasks["c1"].reruns == {1: "c1@rev1"}
    rev = next(i for i in s.state.conversation if isinstance(i, Revision))
    assert revision_text(s.state, rev).endswith(
        "Actions that were unfinished when the request changed:\n"
        "- search (c1): completed after the change; its result is above; its result depends "
        "on the request, so it was run again under revision 1 (still running)]"
    )


def test_only_a_compensation_of_a_summarised_call_is_pinned_after_the_summary() -> None:
    """A compensation in flight is stated after the summary, in full, for a call inside
    it; a call the model still reads verbatim is not repeated there."""
    s = session(keep_recent=2)
    s.command(protocol.Submit("r1", "open a ticket"))
    answer(s, "opening", 100, ("c1", "create_ticket", {"title": "risk"}))
    s.finish_tool("c1", output="T-7")
    answer(s, "opened T-7", 100)
    s.command(protocol.Submit("r2", "another"))
    answer(s, "opening", 100, ("c2", "create_ticket", {"title": "late"}))
    s.finish_tool("c2", output="T-8")
    answer(s, "opened T-8", 100)
    s.command(protocol.Compensate("c1", "undo-1"))
    s.command(protocol.Compensate("c2", "undo-2"))
    s.command(protocol.CompactContext("k1"))
    pending = s.state.compacting
    assert pending is not None and pending.started.end == 4, "c2's turn stays verbatim"
    summarised(s, "S")
    assert pinned_calls(s.state) == [
        '- create_ticket (c1) with arguments {"title": "risk"}: completed; its compensation '
        "comp-c1 is in flight (awaiting_approval), so its effect may or may not be undone yet"
    ]


def test_a_summary_given_up_on_says_the_model_calls_failure_in_full() -> None:
    """Giving up on the summary after a non-retryable failure: the reason, whole."""
    s, _ = two_runs(tokens=900)
    step = summary_failed(s, retryable=False)
    abandoned = only(step.records, CompactionAbandoned)[0]
    assert abandoned.reason == (
        "the summary's model call failed after a non-retryable error: overloaded"
    )


def test_a_request_keeps_its_tool_definitions_in_the_cache_and_reuses_them() -> None:
    """A request with a cache makes the tool definitions once: the next request with the
    same tools gets the very same tuple; with no tools it is an empty tuple."""
    s = Session(compaction=CompactionPolicy())
    s.command(protocol.Submit("r1", "go"))
    gen = s.state.current_generation()
    assert gen is not None
    cache = MessageCache()
    first = request(s.state, TOOLS, gen.generation_id, 1, cache)
    assert cache.definitions is first.tools and len(first.tools) == len(TOOLS)
    assert request(s.state, TOOLS, gen.generation_id, 2, cache).tools is first.tools
    assert tool_definitions({}, MessageCache()) == ()


def test_a_call_named_with_an_empty_id_is_no_other_calls_rerun() -> None:
    """A provider may give a call an empty id; the revision still says a re-run only of
    a call that was run again (none here: lookup does not depend on the request)."""
    s = Session()
    s.command(protocol.Submit("r1", "look"))
    s.reply("x", ("", "lookup", {"query": "a"}), ("c2", "lookup", {"query": "b"}))
    s.finish_tool("", output="found a")
    s.command(protocol.Revise("v1", "look again"))
    rev = next(i for i in s.state.conversation if isinstance(i, Revision))
    text = revision_text(s.state, rev)
    assert "run again" not in text
    assert "\n- lookup (c2): still executing\n" in text
    assert text.endswith("\n- lookup (): revision 0]")


def test_after_a_summary_the_model_reads_it_as_a_user_message_and_the_log_keeps_all() -> None:
    """The summary is the first message, a user's, in the words ``summary_text`` gives
    (the summary, then every pinned call under its heading); ``history`` renders every
    item as if no summary were made, and never fills a cache it is handed."""
    s = session(keep_recent=2)
    s.command(protocol.Submit("r1", "open a ticket"))
    answer(s, "opening", 100, ("c1", "create_ticket", {"title": "risk"}))
    s.finish_tool("c1", output="T-7")
    answer(s, "opened T-7", 100)
    s.command(protocol.Submit("r2", "thanks"))
    answer(s, "welcome", 100)
    s.command(protocol.Compensate("c1", "undo-1"))
    whole = messages(s.state)
    s.command(protocol.CompactContext("k1"))
    summarised(s, "S")
    head = summary_text(s.state)
    assert head == (
        "[perdure compacted the earlier conversation (3 items) into this summary; the full "
        "history is kept in the session's log.]\n\nS\n\n"
        "[Calls from the summarised part whose effect may have happened, stated verbatim "
        "whatever their age:]\n\n" + pinned_calls(s.state)[0]
    )
    sent = messages(s.state)
    assert sent[0] == Message("user", (TextBlock(head), TextBlock("thanks")))
    cache = MessageCache()
    assert messages(s.state, history=True, cache=cache) == whole
    assert cache.state is None, "the history is never cached"
    assert messages(s.state, history=True)[0] == Message("user", (TextBlock("open a ticket"),))


def test_a_revision_is_summarised_only_once_nothing_can_change_its_words() -> None:
    """A revision made while paused, after its turn's calls finished, still waits for the
    re-run of its goal-dependent call: until a turn of the revision starts, it is not
    settled, so no summary covers it; once its own turn runs, it is."""
    s = Session(TOOLS_WITH_SEARCH, compaction=CompactionPolicy(window=1000, keep_recent=0))
    s.command(protocol.Submit("r1", "fly to Oslo"))
    s.reply("looking", ("c1", "search", {"route": "LHR-OSL"}))
    s.command(protocol.Pause("p1"))
    s.finish_tool("c1", output="3 flights to Oslo")
    s.command(protocol.Revise("v1", "Bergen"))
    assert s.state.tasks["c1"].reruns == {}, "nothing is run again while paused"
    assert compacting.compaction_range(s.state, 0) == (0, 2), "the revision is not settled"
    s.command(protocol.Resume("p2"))
    s.finish_tool("c1@rev1", output="2 flights to Bergen")
    gen = s.state.current_generation()
    assert gen is not None and gen.goal_rev == 1 and gen.reply is None
    assert compacting.compaction_range(s.state, 0) == (0, 3), "its own turn runs: settled"
