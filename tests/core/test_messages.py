"""What the model reads: the messages and the request built from a session's state.

``perdure.actors.conversation`` is pure: these tests build a state with the core's
tiny shell (``tests.core.sim``) and compare the messages with ones written out by
hand, block by block. The runtime tests check the same words through a provider;
these are the proofs a change of the conversation module must answer to (the
mutation campaign, docs/RELIABILITY.md, found the module guarded only by tests that
compared its output with itself).
"""

from __future__ import annotations

from perdure.actors import conversation, protocol
from perdure.actors.conversation import MessageCache, messages
from perdure.providers.base import (
    FailedAttempt,
    Message,
    ModelReply,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import ThinkingBlock, ToolCall
from tests.core.sim import TOOLS, Session


def user(*blocks: object) -> Message:
    return Message("user", tuple(blocks))  # type: ignore[arg-type]


def assistant(*blocks: object) -> Message:
    return Message("assistant", tuple(blocks))  # type: ignore[arg-type]


def reply(s: Session, text: str, *calls: ToolCall, **kw: object) -> None:
    gen = s.state.current_generation()
    assert gen is not None
    model_reply = ModelReply(text=text, tool_calls=calls, **kw)  # type: ignore[arg-type]
    s.result(protocol.ModelReplied(gen.generation_id, gen.attempt, model_reply))


def test_a_turn_reads_the_input_the_reply_its_calls_and_every_result_in_call_order() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "look up a and b"))
    thinking = ThinkingBlock("the user wants two lookups", "sig-1")
    calls = (
        ToolCall(call_id="c1", name="lookup", input={"query": "a"}),
        ToolCall(call_id="c2", name="lookup", input={"query": "b"}),
        ToolCall(call_id="c3", name="lookup", input={"query": "c"}),
    )
    reply(s, "checking", *calls, thinking=(thinking,), stop_reason="tool_use")
    assert messages(s.state) == (
        user(TextBlock("look up a and b")),
        assistant(
            thinking,
            TextBlock("checking"),
            ToolUseBlock("c1", "lookup", {"query": "a"}),
            ToolUseBlock("c2", "lookup", {"query": "b"}),
            ToolUseBlock("c3", "lookup", {"query": "c"}),
        ),
    ), "calls without a result are left out"
    pending = messages(s.state, include_pending=True, cache=MessageCache())
    assert pending[-1] == user(
        ToolResultBlock("c1", "(executing)"),
        ToolResultBlock("c2", "(executing)"),
        ToolResultBlock("c3", "(executing)"),
    )
    s.finish_tool("c2", "")  # no output
    s.finish_tool("c1", "found a")
    s.finish_tool("c3", "no such entry", outcome="error")
    assert messages(s.state)[2:] == (
        user(
            ToolResultBlock("c1", "found a"),
            ToolResultBlock("c2", "(no output)"),
            ToolResultBlock("c3", "no such entry", is_error=True),
        ),
    )
    reply(s, "")  # an empty answer still answers
    assert messages(s.state)[3] == assistant(TextBlock("(empty reply)"))
    # The next input is a user message of its own: the empty reply stands between it
    # and the results.
    s.command(protocol.Submit("r2", "thanks"))
    assert messages(s.state)[4:] == (user(TextBlock("thanks")),)


def test_a_reply_of_calls_alone_has_no_text_block_and_merges_nothing_into_it() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "look"))
    reply(s, "", ToolCall(call_id="c1", name="lookup", input={"query": "a"}))
    s.finish_tool("c1", "found a")
    assert messages(s.state) == (
        user(TextBlock("look")),
        assistant(ToolUseBlock("c1", "lookup", {"query": "a"})),
        user(ToolResultBlock("c1", "found a")),
    )


def test_an_unknown_outcome_is_an_error_result_in_the_words_recovery_chose() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "send it"))
    reply(s, "sending", ToolCall(call_id="c1", name="send", input={"text": "hi"}))
    s.restart()  # NEVER, no reconcile: reported as outcome unknown
    unknown = s.state.tasks["c1"].result
    assert unknown is not None and unknown.output.startswith("perdure:")
    assert messages(s.state)[2] == user(ToolResultBlock("c1", unknown.output, is_error=True))


def test_the_end_of_a_request_is_told_as_a_note_and_merges_with_the_next_input() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "send it"))
    reply(s, "sending", ToolCall(call_id="c1", name="send", input={"text": "hi"}))
    s.command(protocol.Cancel("x1"))
    s.finish_tool("c1", "sent")
    s.command(protocol.Submit("r2", "never mind"))
    assert messages(s.state) == (
        user(TextBlock("send it")),
        assistant(TextBlock("sending"), ToolUseBlock("c1", "send", {"text": "hi"})),
        user(
            ToolResultBlock("c1", "sent"),
            TextBlock("[The user cancelled the request above.]"),
            TextBlock("never mind"),
        ),
    )


def test_a_revision_tells_the_new_request_and_the_fate_of_every_unfinished_action() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "book Oslo"))
    reply(
        s,
        "booking",
        ToolCall(call_id="c1", name="lookup", input={"query": "a"}),
        ToolCall(call_id="c2", name="send", input={"text": "b"}),
        ToolCall(call_id="c3", name="deploy", input={"target": "t"}),
    )
    s.command(protocol.Revise("v1", "book Bergen"))
    s.finish_tool("c1", "found a", outcome="cancelled")
    s.finish_tool("c2", "sent")
    revision = next(m for m in messages(s.state) if "revised" in str(m))
    (text,) = [b.text for b in revision.content if isinstance(b, TextBlock) and "revised" in b.text]
    assert text == (
        "[The user revised the request (revision 1). It now reads: book Bergen\n"
        "Follow the revised request from here on; earlier instructions that conflict with "
        "it no longer apply.\n"
        "Actions that were unfinished when the request changed:\n"
        "- lookup (c1): cancelled; it did not complete\n"
        "- send (c2): completed after the change; its result is above\n"
        "- deploy (c3): cancelled; it did not complete]"
    )


def test_the_fate_of_each_phase_in_words() -> None:
    assert conversation._fate("completed", False) == "completed"
    assert conversation._fate("outcome_unknown", False) == (
        "outcome unknown; it may or may not have taken effect"
    )
    assert conversation._fate("executing", False) == "still executing"


def test_a_revision_with_nothing_unfinished_says_only_the_new_request() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "book Oslo"))
    s.command(protocol.Revise("v1", "book Bergen"))
    texts = [b.text for m in messages(s.state) for b in m.content if isinstance(b, TextBlock)]
    assert texts[-1] == (
        "[The user revised the request (revision 1). It now reads: book Bergen\n"
        "Follow the revised request from here on; earlier instructions that conflict with "
        "it no longer apply.]"
    )


def test_a_request_carries_the_system_the_tools_the_turn_and_its_failed_attempts() -> None:
    s = Session()
    s.state.system = "be brief"
    s.command(protocol.Submit("r1", "go"))
    gen = s.state.current_generation()
    assert gen is not None
    s.fail_model(provider="anthropic", fallback=True)
    tools = {"lookup": TOOLS["lookup"]}
    req = conversation.request(s.state, tools, gen.generation_id, 2)
    assert (req.system, req.attempt, req.session_id, req.generation_id, req.submission_id) == (
        "be brief",
        2,
        "s1",
        gen.generation_id,
        "in1",
    )
    assert req.messages == (user(TextBlock("go")),)
    assert req.tools == (
        ToolDefinition("lookup", TOOLS["lookup"].description, TOOLS["lookup"].input_schema),
    )
    assert req.failed == (FailedAttempt(attempt=1, provider="anthropic", fallback=True),)
    assert req.answered_by == "", "no earlier turn of this input"


def test_a_request_names_who_answered_the_inputs_previous_turn() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "look"))
    reply(
        s,
        "looking",
        ToolCall(call_id="c1", name="lookup", input={"query": "a"}),
        provider="openai",
    )
    s.finish_tool("c1", "found a")
    gen = s.state.current_generation()
    assert gen is not None and gen.reply is None, "the second turn is being asked"
    req = conversation.request(s.state, TOOLS, gen.generation_id, 1)
    assert req.answered_by == "openai"
    # A turn a revision abandoned has no reply: the one before it still answered.
    s.command(protocol.Revise("v1", "look for b instead"))
    current = s.state.current_generation()
    assert current is not None and current.generation_id != gen.generation_id
    assert s.state.generations[gen.generation_id].reply is None
    cache = MessageCache()
    req = conversation.request(s.state, TOOLS, current.generation_id, 1, cache)
    assert req.answered_by == "openai"
    assert cache.state is s.state and cache.items > 0, "the request fills the cache it is given"


# -- the cache renders the same messages -------------------------------------------------


def test_a_cache_follows_its_own_state_and_skips_only_what_is_settled() -> None:
    cache = MessageCache()
    s = Session()
    s.command(protocol.Submit("r1", "look"))
    reply(s, "looking", ToolCall(call_id="c1", name="lookup", input={"query": "a"}))
    first = messages(s.state, cache=cache)
    assert first == (
        user(TextBlock("look")),
        assistant(TextBlock("looking"), ToolUseBlock("c1", "lookup", {"query": "a"})),
    )
    s.finish_tool("c1", "found a")  # the unsettled turn is rendered again, with its result
    assert messages(s.state, cache=cache)[2] == user(ToolResultBlock("c1", "found a"))
    assert cache.items == 2, "the input and the answered turn are settled"
    other = Session()  # a longer conversation than the cache's
    for n in range(3):
        other.command(protocol.Submit(f"r{n}", f"question {n}"))
        reply(other, f"answer {n}")
    assert messages(other.state, cache=cache) == tuple(
        m
        for n in range(3)
        for m in (user(TextBlock(f"question {n}")), assistant(TextBlock(f"answer {n}")))
    ), "a cache never lends one state's messages to another"
    empty = MessageCache()
    assert messages(Session().state, cache=empty) == () and empty.messages == ()
    cache.clear()
    assert (cache.state, cache.items, cache.messages) == (None, 0, ())
