"""The pure fold behind the frontend protocols (perdure.server.protocols.parts).

What a client assembles from the parts must be the committed reply, exactly once,
however the live deltas and the commit interleave, wherever the stream is resumed,
and across a restart that lost the live part.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from perdure.server.protocols.ag_ui import AgUiEncoder
from perdure.server.protocols.ai_sdk import AiSdkEncoder
from perdure.server.protocols.parts import Follower, Part, parse_approval_id
from perdure.storage.bus import Event
from perdure.storage.records import (
    GenerationCompleted,
    GenerationStarted,
    InputAccepted,
    LogOpened,
    Record,
    RunFinished,
    RunStarted,
    ThinkingBlock,
    ToolAwaitingApproval,
    ToolCall,
    ToolCompleted,
    ToolTaskCreated,
)

SID = "s"


def rec(seq: int, record: Record) -> Event:
    return Event(SID, type(record).__name__, seq, record)


def live(kind: str, **data: Any) -> Event:
    return Event(SID, kind, data={"generation_id": "g1", "submission_id": "in1", **data})


def head(text: str = "hello", sub: str = "in1", run: str = "r1") -> list[Event]:
    return [
        rec(
            1,
            InputAccepted(
                session_id=SID, submission_id=sub, request_id="rq", text=text, body_hash="h", at=0.0
            ),
        ),
        rec(2, RunStarted(session_id=SID, run_id=run, submission_id=sub, goal_rev=0, at=0.0)),
        rec(
            3,
            GenerationStarted(
                session_id=SID,
                run_id=run,
                generation_id="g1",
                goal_rev=0,
                submission_id=sub,
                at=0.0,
            ),
        ),
    ]


def completed(seq: int, text: str, thinking: str = "", calls: tuple[ToolCall, ...] = ()) -> Event:
    return rec(
        seq,
        GenerationCompleted(
            session_id=SID,
            run_id="r1",
            generation_id="g1",
            text=text,
            submission_id="in1",
            thinking=[ThinkingBlock(thinking, "sig")] if thinking else [],
            tool_calls=list(calls),
            at=0.0,
        ),
    )


def finished(seq: int, status: str = "completed", text: str = "") -> Event:
    return rec(
        seq,
        RunFinished(
            session_id=SID, run_id="r1", submission_id="in1", status=status, final_text=text, at=0.0
        ),
    )  # type: ignore[arg-type]


def feed(events: list[Event], follower: Follower | None = None) -> list[Part]:
    f = follower or Follower()
    out: list[Part] = []
    for e in events:
        parts = f.feed(e)
        if not f.hidden(e):
            out += parts
    return out


def assembled(parts: list[Part], kind: str = "text") -> dict[str, str]:
    """What a client shows: the text of each part id, checking opens and closes."""
    texts: dict[str, str] = {}
    open_ids: set[str] = set()
    for p in parts:
        if p.kind == f"{kind}_start":
            assert p.data["id"] not in texts, "a part opened twice"
            texts[p.data["id"]] = ""
            open_ids.add(p.data["id"])
        elif p.kind == f"{kind}_delta":
            assert p.data["id"] in open_ids
            texts[p.data["id"]] += p.data["delta"]
        elif p.kind == f"{kind}_end":
            open_ids.remove(p.data["id"])
    assert not open_ids, "a part left open"
    return texts


@given(
    text=st.text(min_size=1, max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
    joined=st.integers(min_value=0, max_value=7),
    delivered=st.integers(min_value=0, max_value=7),
)
def test_live_deltas_and_the_commit_give_the_reply_once(
    text: str, cuts: list[int], joined: int, delivered: int
) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    # The subscriber joined before the attempt started (it sees its model_call) or
    # while the model was writing (it missed the first ``joined`` deltas); some deltas
    # arrive, then the committed reply.
    start = [live("model_call", attempt=1)] if joined == 0 else []
    events = head() + start + [live("text_delta", text=p) for p in pieces[joined:delivered]]
    events += [completed(4, text), finished(5, text=text)]
    texts = assembled(feed(events))
    assert list(texts.values()) == [text]


def test_a_follower_that_joined_mid_reply_shows_it_whole_once_committed() -> None:
    # The daemon's stream opened while the model wrote "Deployed: all done.": the
    # deltas before "ne." went by unseen. Showing "ne." would put it before the reply.
    events = [*head(), live("text_delta", text="ne."), completed(4, "Deployed: all done.")]
    parts = feed(events)
    assert list(assembled(parts).values()) == ["Deployed: all done."]
    assert [p.kind for p in parts if p.kind.startswith("text_")] == [
        "text_start",
        "text_delta",
        "text_end",
    ]


def test_replay_matches_live_and_ids_are_positions() -> None:
    events = [*head(), live("model_call", attempt=1), live("thinking_delta", thinking="hmm")]
    events.append(live("text_delta", text="hel"))
    events += [completed(4, "hello", thinking="hmm"), finished(5, text="hello")]
    live_parts = feed(events)
    replayed = feed([e for e in events if e.seq is not None])
    for parts in (live_parts, replayed):
        assert list(assembled(parts).values()) == ["hello"]
        assert list(assembled(parts, "reasoning").values()) == ["hmm"]
    # Reasoning cut short by the text: the rest follows in a part of its own.
    events[4] = live("thinking_delta", thinking="hm")
    assert list(assembled(feed(events), "reasoning").values()) == ["hm", "m"]
    # A replay gives each part the same id as when it streamed live.
    ids = [p.data.get("id") for p in live_parts if p.kind.startswith("text_")]
    assert set(ids) == {p.data.get("id") for p in replayed if p.kind.startswith("text_")}
    kinds = [p.kind for p in replayed]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.index("reasoning_end") < kinds.index("text_start")  # reasoning first


def test_a_restart_closes_what_the_dead_process_streamed() -> None:
    events = [*head(), live("model_call", attempt=1), live("text_delta", text="hel")]
    events.append(rec(4, LogOpened(epoch=2, pid=1, host="h", at=0.0, session_id="")))
    events += [completed(5, "hello"), finished(6, text="hello")]
    parts = feed(events)
    texts = assembled(parts)
    assert list(texts.values()) == ["hel", "hello"]  # the lost one closed, then the reply
    assert next(p.data["name"] for p in parts if p.kind == "fact") == "restart"


def test_a_cut_hides_what_came_before_but_keeps_the_context() -> None:
    call = ToolCall(call_id="c1", name="deploy", input={"to": "prod"})
    events = [*head(), completed(4, "deploying", calls=(call,))]
    events.append(
        rec(
            5,
            ToolTaskCreated(
                session_id=SID,
                generation_id="g1",
                call_id="c1",
                tool_name="deploy",
                input={"to": "prod"},
                goal_rev=0,
                at=0.0,
            ),
        )
    )
    events.append(rec(6, ToolAwaitingApproval(session_id=SID, call_id="c1", reason="ok?", at=0.0)))
    whole = feed(events)
    blocked = [p for p in whole if p.kind == "blocked"]
    assert blocked and blocked[0].data["approvals"][0]["approval_id"] == "c1@6"
    assert parse_approval_id("c1@6") == ("c1", 6) and parse_approval_id("c1") is None
    events.append(rec(7, ToolCompleted(session_id=SID, call_id="c1", output="done", at=0.0)))
    events.append(finished(8, text="deployed"))
    after = feed(events, Follower(submission="in1", cut=6))
    assert [p.kind for p in after] == ["tool_output", "step_end", "run_end"]
    # An encoder fed the hidden parts too knows the step is open and closes it once.
    encoder = AgUiEncoder(SID)
    f = Follower(submission="in1", cut=6)
    sent: list[dict[str, Any]] = []
    for e in events:
        parts = f.feed(e)
        chunks = [c for p in parts for c in encoder.encode(p)]
        if not f.hidden(e):
            sent += chunks
    assert [c["type"] for c in sent] == ["TOOL_CALL_RESULT", "STEP_FINISHED", "RUN_FINISHED"]


def test_another_submission_is_left_out() -> None:
    events = head()
    events.append(
        rec(
            4,
            InputAccepted(
                session_id=SID,
                submission_id="in2",
                request_id="r2",
                text="later",
                body_hash="h",
                at=0.0,
            ),
        )
    )
    events += [completed(5, "hello"), finished(6, text="hello")]
    mine = feed(events, Follower(submission="in2"))
    assert mine == []
    theirs = Follower(submission="in1")
    assert [p.kind for p in feed(events, theirs)][-1] == "run_end" and theirs.done


def test_ai_sdk_encoding_of_a_failed_run() -> None:
    encoder = AiSdkEncoder()
    chunks = [c for p in feed([*head(), finished(4, status="failed")]) for c in encoder.encode(p)]
    assert chunks[0]["type"] == "start" and chunks[0]["messageId"] == "msg_in1"
    assert [c["type"] for c in chunks[-2:]] == ["error", "finish"]
    assert chunks[-1]["finishReason"] == "error"


def test_a_secret_argument_is_masked_in_the_frontends_tool_parts() -> None:
    call = ToolCall(
        call_id="c1", name="login", input={"user": "ann", "token": "t0p"}, secret=["token"]
    )
    parts = feed([*head(), completed(4, "", calls=(call,))])
    shown = [p for p in parts if p.kind in ("tool_args", "tool_input")]
    assert [p.kind for p in shown] == ["tool_args", "tool_input"]
    assert shown[1].data["input"] == {"user": "ann", "token": "[secret]"}
    assert "t0p" not in repr(parts) and '"token":"[secret]"' in shown[0].data["delta"]
