"""Pydantic-typed tools through the real SDKs: anthropic, and openai on both its APIs.

A tool whose argument is a nested pydantic model (with an Enum and a datetime) is
sent to the fake vendor servers (which refuse what the real APIs refuse: a schema
that is not a JSON Schema object, a bad name, a strict schema that breaks OpenAI's
rules); the model's call comes back through the SDK, the tool receives model
instances, its pydantic result reaches the model as JSON, and a wrong nested value
is answered with its path without running the tool.
"""

from __future__ import annotations

import datetime
import enum
import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

import perdure
from perdure import ReplayPolicy
from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.openai import Api, OpenAIProvider
from perdure.storage.records import ToolCompleted
from tests import fake_anthropic as fa
from tests import fake_openai as fo
from tests.providers._agent import ask, of, records, runtime

_CLOSED = pydantic.ConfigDict(extra="forbid")


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Room(pydantic.BaseModel):
    model_config = _CLOSED
    name: str
    floor: int = pydantic.Field(ge=0, description="0 is the ground floor")


class Booking(pydantic.BaseModel):
    model_config = _CLOSED
    room: Room
    starts: datetime.datetime
    guests: list[str]
    priority: Priority


class Confirmation(pydantic.BaseModel):
    reference: str
    room: Room
    starts: datetime.datetime


RECEIVED: list[Booking] = []


@perdure.tool(replay=ReplayPolicy.NEVER)
async def book(booking: Booking) -> Confirmation:
    """Book a meeting room.

    Args:
        booking: the room, the time and who comes.
    """
    RECEIVED.append(booking)
    return Confirmation(reference="BK-1", room=booking.room, starts=booking.starts)


@perdure.tool(replay=ReplayPolicy.SAFE)
def rooms(floor: int = 0) -> list[Room]:
    """List the rooms of a floor (a plain def: run in a worker thread)."""
    return [Room(name="Blue", floor=floor)]


GOOD = {
    "booking": {
        "room": {"name": "Blue", "floor": 2},
        "starts": "2026-03-01T09:30:00",
        "guests": ["ann", "bo"],
        "priority": "high",
    }
}
BAD = {"booking": {**GOOD["booking"], "room": {"name": "Blue", "floor": -1}}}
EXPECTED = Booking(
    room=Room(name="Blue", floor=2),
    starts=datetime.datetime(2026, 3, 1, 9, 30),
    guests=["ann", "bo"],
    priority=Priority.HIGH,
)


@pytest.fixture(autouse=True)
def _reset() -> None:
    RECEIVED.clear()


def _check_outputs(committed: list[Any]) -> None:
    done = {r.call_id: r for r in of(ToolCompleted, committed)}
    assert RECEIVED == [EXPECTED]  # converted: a Booking, its Room, a datetime, an Enum
    assert json.loads(done["c1"].output) == {
        "reference": "BK-1",
        "room": {"name": "Blue", "floor": 2},
        "starts": "2026-03-01T09:30:00",
    }
    assert not done["c1"].is_error
    assert done["c2"].is_error and done["c2"].kind == "invalid_args"
    assert "booking.room.floor: Input should be greater than or equal to 0" in done["c2"].output
    assert json.loads(done["c3"].output) == [{"name": "Blue", "floor": 3}]


async def test_anthropic_round_trip_with_a_nested_model(
    fake: fa.FakeAnthropic, provider: AnthropicProvider, log_dir: Path
) -> None:
    fake.script(
        fa.Reply(
            content=[
                fa.ToolUse("c1", "book", GOOD),
                fa.ToolUse("c2", "book", BAD),
                fa.ToolUse("c3", "rooms", {"floor": 3}),
            ]
        ),
        fa.Reply(content=[fa.Text("Booked.")]),
    )
    async with runtime(log_dir, provider, tools=[book, rooms]) as rt:
        sid, outcome = await ask(rt, "Book Blue.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    _check_outputs(committed)
    sent = {t["name"]: t for t in fake.requests[0].body["tools"]}
    schema = sent["book"]["input_schema"]
    assert sent["book"]["description"] == "Book a meeting room."
    assert schema["properties"]["booking"]["description"] == "the room, the time and who comes."
    assert schema["$defs"]["Booking"]["properties"]["room"] == {"$ref": "#/$defs/Room"}


async def test_openai_round_trip_with_a_nested_model_in_strict_mode(
    fake_oa: fo.FakeOpenAI, oa_provider: OpenAIProvider, log_dir: Path, api: Api
) -> None:
    fake_oa.script(
        fo.Reply(
            content=[
                fo.ToolCall("c1", "book", GOOD),
                fo.ToolCall("c2", "book", BAD),
                fo.ToolCall("c3", "rooms", {"floor": 3}),
            ]
        ),
        fo.Reply(content=[fo.Text("Booked.")]),
    )
    async with runtime(log_dir, oa_provider, tools=[book, rooms]) as rt:
        sid, outcome = await ask(rt, "Book Blue.")
        committed = await records(rt, sid)
    assert outcome.status == "completed"
    _check_outputs(committed)
    tools = fake_oa.requests[0].body["tools"]
    sent = (
        {t["name"]: t for t in tools}
        if api == "responses"
        else {t["function"]["name"]: t["function"] for t in tools}
    )
    # Closed models with every field required: strict. A parameter with a default: not.
    assert sent["book"]["strict"] is True
    assert sent["rooms"]["strict"] is False
    assert sent["book"]["parameters"]["$defs"]["Room"]["required"] == ["name", "floor"]


def test_the_fakes_refuse_what_the_vendors_refuse() -> None:
    from tests.support.vendor_schemas import schema_problem

    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert schema_problem("ok", closed) is None
    assert "additionalProperties" in str(schema_problem("ok", closed, strict=True))
    opened = {**closed, "additionalProperties": False, "required": []}
    assert "Missing 'a'" in str(schema_problem("ok", opened, strict=True))
    assert "Invalid tool name" in str(schema_problem("my tool!", closed))
    assert "type object" in str(schema_problem("ok", {"type": "string"}))
    assert "Invalid schema" in str(schema_problem("ok", {"type": "object", "required": 3}))
