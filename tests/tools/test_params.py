"""Tools' parameters by pydantic: schema, the errors the model reads, converted values.

For each kind of parameter a tool may declare: the JSON schema the model is shown,
the problems it reads for wrong arguments (field path and message), and the value
the function receives. Then docstring descriptions (Google, NumPy, Sphinx), the one
rule for results, OpenAI's strict mode, and definition errors that name the tool and
the parameter.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import attrs
import pydantic
import pytest
from typing_extensions import TypedDict

from perdure import ReplayPolicy, ToolContext, tool
from perdure.tools.contract import Tool, ToolDefinitionError, registry, render_result
from perdure.tools.params import ResultNotSerializable, render, strict_compatible


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Room(pydantic.BaseModel):
    name: str
    floor: Annotated[int, pydantic.Field(ge=0, description="0 is the ground floor")] = 0


class Booking(pydantic.BaseModel):
    room: Room
    guests: list[str]


@dataclasses.dataclass
class Slot:
    start: datetime.datetime
    minutes: int = 30


class Guest(TypedDict):
    name: str
    email: str


class Loose(pydantic.BaseModel):  # extra fields allowed: not a closed object
    name: str


class Handle:
    """Something pydantic knows nothing of."""


@attrs.frozen
class Point:  # attrs classes are not among the types pydantic handles
    x: int


def _ctx() -> ToolContext:
    return ToolContext(idempotency_key="k", call_id="c", session_id="s", attempt=1, workspace=None)


# Each case: the parameter's hint, its schema (under "properties", with "$defs" where
# pydantic puts one), valid JSON from the model with the value the function receives,
# and invalid JSON with the problem the model reads.
CASES: list[tuple[str, Any, dict[str, Any], Any, Any, Any, str]] = [
    ("str", str, {"type": "string"}, "a", "a", 3, "x: Input should be a valid string, got 3"),
    (
        "int",
        int,
        {"type": "integer"},
        4,
        4,
        "four",
        "x: Input should be a valid integer, unable to parse string as an integer, got 'four'",
    ),
    ("float", float, {"type": "number"}, 2, 2.0, [], "x: Input should be a valid number, got []"),
    (
        "bool",
        bool,
        {"type": "boolean"},
        True,
        True,
        "maybe",
        "x: Input should be a valid boolean, unable to interpret input, got 'maybe'",
    ),
    (
        "datetime",
        datetime.datetime,
        {"type": "string", "format": "date-time"},
        "2026-03-01T09:30:00",
        datetime.datetime(2026, 3, 1, 9, 30),
        "tomorrow",
        "x: Input should be a valid datetime or date, input is too short, got 'tomorrow'",
    ),
    (
        "uuid",
        uuid.UUID,
        {"type": "string", "format": "uuid"},
        "12345678-1234-5678-1234-567812345678",
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "x-y",
        "x: Input should be a valid UUID, invalid character: found `x` at 0, got 'x-y'",
    ),
    (
        "path",
        Path,
        {"type": "string", "format": "path"},
        "a/b.txt",
        Path("a/b.txt"),
        5,
        "x: Input is not a valid path for <class 'pathlib.Path'>, got 5",
    ),
    (
        "enum",
        Color,
        {"$ref": "#/$defs/Color"},
        "green",
        Color.GREEN,
        "blue",
        "x: Input should be 'red' or 'green', got 'blue'",
    ),
    (
        "literal",
        Literal["a", "b"],
        {"enum": ["a", "b"], "type": "string"},
        "b",
        "b",
        "c",
        "x: Input should be 'a' or 'b', got 'c'",
    ),
    (
        "optional",
        int | None,
        {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        None,
        None,
        "z",
        "x: Input should be a valid integer, unable to parse string as an integer, got 'z'",
    ),
    (
        "union",
        int | list[str],
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
        ["p", "q"],
        ["p", "q"],
        [1],
        "x.list[str][0]: Input should be a valid string, got 1",
    ),
    (
        "dict",
        dict[str, int],
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"a": 1},
        {"a": 1},
        {"a": "one"},
        "x.a: Input should be a valid integer, unable to parse string as an integer, got 'one'",
    ),
    (
        "field",
        Annotated[int, pydantic.Field(ge=1, le=5, description="stars")],
        {"type": "integer", "minimum": 1, "maximum": 5, "description": "stars"},
        3,
        3,
        9,
        "x: Input should be less than or equal to 5, got 9",
    ),
    (
        "annotated-text",
        Annotated[str, "a note for the model"],
        {"type": "string", "description": "a note for the model"},
        "n",
        "n",
        None,
        "x: Input should be a valid string, got None",
    ),
    (
        "model",
        Booking,
        {"$ref": "#/$defs/Booking"},
        {"room": {"name": "Blue", "floor": 2}, "guests": ["ann"]},
        Booking(room=Room(name="Blue", floor=2), guests=["ann"]),
        {"room": {"name": "Blue", "floor": -1}, "guests": "ann"},
        "x.room.floor: Input should be greater than or equal to 0, got -1",
    ),
    (
        "dataclass",
        Slot,
        {"$ref": "#/$defs/Slot"},
        {"start": "2026-03-01T09:30:00"},
        Slot(datetime.datetime(2026, 3, 1, 9, 30)),
        {"minutes": 5},
        "x.start: Field required",
    ),
    (
        "typeddict",
        list[Guest],
        {"type": "array", "items": {"$ref": "#/$defs/Guest"}},
        [{"name": "ann", "email": "a@x"}],
        [{"name": "ann", "email": "a@x"}],
        [{"name": "ann", "email": "a@x", "age": 3}],
        "x[0].age: unexpected field",
    ),
]


def _tool_of(hint: Any) -> Tool:
    async def f(x: Any) -> str:
        return repr(x)

    f.__annotations__ = {"x": hint, "return": str}
    return tool(name="f")(f)


@pytest.mark.parametrize(
    ("hint", "schema", "good", "received", "bad", "problem"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
async def test_each_kind_of_parameter(
    hint: Any, schema: dict[str, Any], good: Any, received: Any, bad: Any, problem: str
) -> None:
    t = _tool_of(hint)
    assert t.input_schema["properties"]["x"] == schema
    assert t.input_schema["required"] == ["x"]
    assert t.input_schema["additionalProperties"] is False
    assert t.validate({"x": good}) == []
    assert t.structure_args({"x": good}) == {"x": received}
    assert type(t.structure_args({"x": good})["x"]) is type(received)
    assert await t.invoke(_ctx(), {"x": good}) == repr(received)
    assert problem in t.validate({"x": bad})


def test_a_nested_model_is_described_once_under_defs() -> None:
    t = _tool_of(Booking)
    defs = t.input_schema["$defs"]
    assert defs["Booking"]["properties"]["room"] == {"$ref": "#/$defs/Room"}
    assert defs["Room"]["properties"]["floor"] == {
        "type": "integer",
        "minimum": 0,
        "default": 0,
        "description": "0 is the ground floor",
    }
    assert "title" not in str(t.input_schema)  # pydantic's generated titles are dropped


def test_a_property_named_title_is_kept() -> None:
    class Note(pydantic.BaseModel):
        title: str

    t = _tool_of(Note)
    assert t.input_schema["$defs"]["Note"]["properties"] == {"title": {"type": "string"}}


# -- the whole signature --------------------------------------------------------------------


@tool(replay=ReplayPolicy.SAFE)
async def book(
    ctx: ToolContext,
    room: Room,
    when: datetime.datetime,
    color: Color = Color.RED,
    tags: list[str] | None = None,
    json: bool = False,  # a name pydantic's BaseModel uses for itself
) -> str:
    """Book a room.

    The booking is held for ten minutes.

    Args:
        room: the room, by name and floor.
        when: when the meeting
            starts (local time).
    """
    return f"{room.name} {when:%H:%M} {color.value} {tags} {json} {ctx.attempt}"


def test_a_signature_gives_the_schema_the_description_and_the_conversion() -> None:
    assert book.takes_context and "ctx" not in book.input_schema["properties"]
    assert book.description == "Book a room.\n\nThe booking is held for ten minutes."
    props = book.input_schema["properties"]
    assert props["room"]["description"] == "the room, by name and floor."
    assert props["when"]["description"] == "when the meeting starts (local time)."
    assert props["color"] == {"$ref": "#/$defs/Color", "default": "red"}
    assert book.input_schema["required"] == ["room", "when"]
    args = {"room": {"name": "Blue"}, "when": "2026-03-01T09:30:00", "json": True}
    assert book.validate(args) == []
    kwargs = book.structure_args(args)
    assert kwargs == {
        "room": Room(name="Blue"),
        "when": datetime.datetime(2026, 3, 1, 9, 30),
        "json": True,
    }  # a parameter left out keeps the function's own default


async def test_the_tool_receives_converted_values() -> None:
    args = book.effective_args({"room": {"name": "Blue"}, "when": "2026-03-01T09:30:00"})
    assert await book.invoke(_ctx(), args) == "Blue 09:30 red None False 1"


def test_problems_are_listed_with_their_path() -> None:
    assert book.validate({}) == ["room: Field required", "when: Field required"]
    assert book.validate({"room": {"name": "B"}, "when": "2026-03-01T09:30:00", "colour": 1}) == [
        "colour: unexpected field (the tool's parameters: color, json, room, tags, when)"
    ]
    assert book.validate(["room"]) == ["the arguments must be a JSON object, got list"]
    long = book.validate({"room": {"name": "x" * 100, "floor": "y" * 100}, "when": 1})
    assert long[0] == (
        "room.floor: Input should be a valid integer, unable to parse string as an integer, "
        f"got '{'y' * 56}..."
    )


@pytest.mark.parametrize(
    "doc",
    [
        """Send a message.

        Args:
            to: who receives it.
            body: what it says.
        """,
        """Send a message.

        Parameters
        ----------
        to : str
            who receives it.
        body : str
            what it says.
        """,
        """Send a message.

        :param to: who receives it.
        :param body: what it says.
        """,
    ],
    ids=["google", "numpy", "sphinx"],
)
def test_docstring_styles_describe_the_parameters(doc: str) -> None:
    async def send(to: str, body: str) -> None: ...

    send.__doc__ = doc
    t = tool(send)
    assert t.description == "Send a message."
    assert t.input_schema["properties"]["to"]["description"] == "who receives it."
    assert t.input_schema["properties"]["body"]["description"] == "what it says."


def test_a_field_description_wins_over_the_docstring() -> None:
    async def rate(stars: Annotated[int, pydantic.Field(description="1 to 5")]) -> None:
        """Rate it.

        Args:
            stars: how many.
        """

    assert tool(rate).input_schema["properties"]["stars"]["description"] == "1 to 5"


def test_definition_hash_changes_with_what_the_model_is_told() -> None:
    async def f(x: int) -> None:
        """One."""

    async def g(x: int) -> None:
        """Two."""

    async def h(x: str) -> None:
        """One."""

    assert tool(name="f")(f).definition_hash == tool(name="f")(f).definition_hash
    assert tool(name="f")(f).definition_hash != tool(name="f")(g).definition_hash
    assert tool(name="f")(f).definition_hash != tool(name="f")(h).definition_hash
    safe = tool(name="f", replay=ReplayPolicy.SAFE)(f)
    assert safe.definition_hash != tool(name="f")(f).definition_hash


# -- definition errors name the tool and the parameter ---------------------------------------


def test_definition_errors_name_the_tool_and_the_parameter() -> None:
    async def star(*args: int) -> None: ...

    async def untyped(x) -> None: ...  # type: ignore[no-untyped-def]

    async def odd(when: datetime.datetime, how: Handle) -> None: ...

    async def late(x: int, ctx: ToolContext) -> None: ...

    async def attrs_param(p: Point) -> None: ...

    with pytest.raises(ToolDefinitionError, match=r"tool 'star', parameter 'args': \*args"):
        tool(star)
    with pytest.raises(ToolDefinitionError, match="tool 'untyped', parameter 'x': needs a type"):
        tool(untyped)
    with pytest.raises(
        ToolDefinitionError, match="tool 'book_room', parameter 'how': pydantic cannot describe"
    ):
        tool(name="book_room")(odd)
    with pytest.raises(
        ToolDefinitionError, match="tool 'late', parameter 'ctx': a ToolContext must be the first"
    ):
        tool(late)
    with pytest.raises(ToolDefinitionError, match="parameter 'p': pydantic cannot describe Point"):
        tool(attrs_param)
    with pytest.raises(TypeError, match="tool 'star': replay must be a ReplayPolicy"):
        tool(replay="safe")(star)  # type: ignore[call-overload]


@pytest.mark.parametrize("name", ["my tool!", "", "x" * 65, "naïve", "a.b"])
def test_names_the_vendors_refuse_are_refused_at_definition(name: str) -> None:
    async def f() -> None: ...

    with pytest.raises(ToolDefinitionError, match="not accepted by the model vendors"):
        tool(name=name)(f)


def test_names_the_vendors_accept() -> None:
    async def f() -> None: ...

    for name in ("get_weather", "a-b", "X" * 64, "v2"):
        assert tool(name=name)(f).name == name


def test_registry_refuses_duplicates_and_non_tools() -> None:
    with pytest.raises(ValueError, match="two tools are named 'book'"):
        registry([book, book])
    with pytest.raises(TypeError, match="not a tool"):
        registry([print])  # type: ignore[list-item]


# -- results: one rule --------------------------------------------------------------------------


def test_results_are_text_or_json_through_pydantic() -> None:
    assert render("t", "as is") == "as is"
    assert render("t", None) == ""
    assert render("t", 3) == "3"
    assert render("t", Room(name="Blue", floor=2)) == '{"name": "Blue", "floor": 2}'
    slot = Slot(datetime.datetime(2026, 3, 1, 9, 30))
    assert render("t", slot) == '{"start": "2026-03-01T09:30:00", "minutes": 30}'
    assert render("t", {"at": datetime.date(2026, 3, 1), "ü": [Color.RED]}) == (
        '{"at": "2026-03-01", "ü": ["red"]}'
    )
    assert render("t", b"raw") == '"raw"'  # bytes as text, never a quoted repr
    assert render("t", uuid.UUID(int=1)) == '"00000000-0000-0000-0000-000000000001"'


def test_a_result_pydantic_cannot_serialize_names_the_tool_and_the_type() -> None:
    with pytest.raises(ResultNotSerializable, match=r"tool 'open_file' returned a .*Handle"):
        render("open_file", {"h": Handle()})
    with pytest.raises(ResultNotSerializable, match="tool 'book' returned a module"):
        book.render(math)
    # A person's answer is shown whatever it is (it must reach the model).
    assert render_result({"m": math}).startswith('{"m": "<module')


# -- OpenAI's strict mode: only where the schema allows it ------------------------------------


def test_strict_mode_where_the_schema_allows_it() -> None:
    async def closed(room: Booking, when: datetime.datetime, tag: str | None) -> None: ...

    async def with_default(room: str, floor: int = 0) -> None: ...

    async def open_dict(counts: dict[str, int]) -> None: ...

    async def loose(x: Loose) -> None: ...

    assert strict_compatible(tool(closed).input_schema) is False  # Room.floor has a default
    assert strict_compatible(_tool_of(Slot).input_schema) is False  # minutes has a default
    assert strict_compatible(_tool_of(list[Guest]).input_schema) is True
    assert strict_compatible(tool(with_default).input_schema) is False
    assert strict_compatible(tool(open_dict).input_schema) is False
    assert strict_compatible(tool(loose).input_schema) is False
    assert strict_compatible(_tool_of(Literal["a", "b"]).input_schema) is True
    assert strict_compatible(_tool_of(int | None).input_schema) is True
    assert strict_compatible(_tool_of(uuid.UUID).input_schema) is True
    assert strict_compatible(_tool_of(Path).input_schema) is False  # format "path": unknown


def test_import_perdure_loads_neither_pydantic_nor_griffe() -> None:
    import subprocess
    import sys

    probe = "import sys, perdure; print(sorted({'pydantic', 'griffe'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"  # both come with the first tool defined


def test_a_type_pydantic_cannot_describe_is_named_with_pydantic_s_reason() -> None:
    """The error names the parameter, its type (a class by its name, anything else as
    written) and pydantic's own first line, then says which types work."""

    async def attrs_param(p: Point) -> None: ...

    async def not_a_class(p: Point | None) -> None: ...

    with pytest.raises(ToolDefinitionError) as point:
        tool(attrs_param)
    said = str(point.value)
    reason = said.split("cannot describe Point (", 1)[1].split("); use a type", 1)[0]
    assert reason and reason != "None" and "\n" not in reason  # pydantic's first line
    assert said.endswith(
        "; use a type pydantic handles (a pydantic model, a dataclass, a TypedDict, an Enum...)"
    )
    with pytest.raises(ToolDefinitionError, match=r"cannot describe .*Point \| None \("):
        tool(not_a_class)
