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
import inspect
import logging
import math
import uuid
import warnings
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

import attrs
import pydantic
import pytest
from typing_extensions import TypedDict

from perdure import ReplayPolicy, Secret, ToolContext, tool
from perdure.tools.contract import Tool, ToolDefinitionError, registry, render_result
from perdure.tools.params import ResultNotSerializable, describe, render, strict_compatible


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


# -- promises the mutation campaign found unguarded (docs/RELIABILITY.md) ----------------------
# Every tool is declared inside its test, so that a mutant switched on by the campaign
# is in force while the tool is described.


def test_secret_parameters_are_the_ones_marked_secret_and_only_those() -> None:
    """``Annotated[..., Secret]`` (the class or an instance) marks a parameter secret; a
    plain parameter, or one annotated with anything else, is not."""

    async def login(
        user: str,
        token: Annotated[str, Secret],
        pin: Annotated[int, "four digits", Secret()],
        note: Annotated[str, "shown as it is"],
    ) -> None: ...

    assert tool(login).secret_params == frozenset({"token", "pin"})


def test_several_annotated_notes_are_one_description_in_order() -> None:
    async def f(x: Annotated[str, "the city,", "as the post writes it"]) -> None: ...

    assert tool(f).input_schema["properties"]["x"]["description"] == (
        "the city, as the post writes it"
    )


def test_the_description_is_only_the_text_before_the_first_section() -> None:
    """A docstring that is only a section describes the parameters and gives no description
    (not the section's text); text after a section is not the description either."""

    async def only_params(to: str) -> None: ...

    async def text_after(to: str) -> None: ...

    only_params.__doc__ = """Parameters
        ----------
        to : str
            who receives it.
        """
    text_after.__doc__ = """Send a message.

        Args:
            to: who receives it.

        Sent at once.
        """
    summary, parameters = describe("only_params", only_params, skip_first=False)
    assert summary == ""
    assert parameters.schema["properties"]["to"]["description"] == "who receives it."
    assert tool(only_params).description == "only_params"  # no description: the name
    assert tool(text_after).description == "Send a message."


def test_reading_a_docstring_logs_nothing_whatever_level_griffe_s_logger_has(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """griffe logs what it cannot read in the styles tried (a Google docstring has no types,
    say); defining a tool keeps that quiet, even where the application shows griffe's
    warnings, and leaves griffe's logger as it found it."""
    caplog.set_level(logging.DEBUG, logger="griffe")

    async def send(to: str) -> None:
        """Send a message.

        Args:
            to: who receives it.
        """

    assert tool(send).input_schema["properties"]["to"]["description"] == "who receives it."
    assert [r for r in caplog.records if r.name.startswith("griffe")] == []
    assert logging.getLogger("griffe").level == logging.DEBUG


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(validate_by_alias=False, validate_by_name=True)
    full_name: str = pydantic.Field(alias="fullName")


def test_a_nested_model_that_validates_by_name_is_described_by_name() -> None:
    """The schema names each field as validation accepts it: a model configured to
    validate by name only is shown its field names, not its aliases."""

    async def greet(person: Person) -> str:
        return person.full_name

    t = tool(greet)
    assert t.input_schema["properties"]["person"] == {"$ref": "#/$defs/Person"}
    assert t.input_schema["$defs"]["Person"]["required"] == ["full_name"]
    assert t.validate({"person": {"full_name": "Ann"}}) == []


def test_problems_show_the_value_sent_up_to_sixty_characters_and_name_the_parameters() -> None:
    """The model sees the value it sent, whole up to 60 characters of its repr, else its
    first 57 and "..."; a field a tool without parameters does not take says so."""

    async def echo(text: int) -> None: ...

    async def ping() -> None: ...

    sixty, sixty_one = "x" * 58, "x" * 59  # their reprs: 60 and 61 characters
    prefix = "text: Input should be a valid integer, unable to parse string as an integer, got "
    assert tool(echo).validate({"text": sixty}) == [prefix + repr(sixty)]
    assert tool(echo).validate({"text": sixty_one}) == [prefix + repr(sixty_one)[:57] + "..."]
    assert tool(ping).validate({"host": "a"}) == [
        "host: unexpected field (the tool's parameters: none)"
    ]


# -- definition errors, each with the words that say what to change ---------------------------


def test_each_definition_error_says_what_is_wrong_and_where() -> None:
    async def positional(x: int, /) -> None: ...

    async def unresolved(x: Nowhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    async def annotated_context(x: int, ctx: Annotated[ToolContext, "the call"]) -> None: ...

    async def annotated_point(p: Annotated[Point, "a point"]) -> None: ...

    async def both_defaults(
        tags: Annotated[list[str], pydantic.Field(default_factory=list)] = [],  # noqa: B006
    ) -> None: ...

    with pytest.raises(ToolDefinitionError) as error:
        tool(positional)
    assert str(error.value) == (
        "tool 'positional', parameter 'x': a positional-only parameter cannot be named"
    )
    with pytest.raises(ToolDefinitionError) as error:
        tool(unresolved)
    assert str(error.value).startswith(
        "tool 'unresolved': cannot resolve the type hints of "
        "test_each_definition_error_says_what_is_wrong_and_where.<locals>.unresolved: "
    )
    assert str(error.value).endswith("name 'Nowhere' is not defined")
    with pytest.raises(ToolDefinitionError) as error:
        tool(annotated_context)
    assert str(error.value) == (
        "tool 'annotated_context', parameter 'ctx': a ToolContext must be the first "
        "parameter of the tool"
    )
    with pytest.raises(
        ToolDefinitionError, match=r"parameter 'p': pydantic cannot describe Point \("
    ):
        tool(annotated_point)
    with pytest.raises(ToolDefinitionError) as error:
        tool(both_defaults)
    assert str(error.value) == (
        "tool 'both_defaults', parameter 'tags': has both a default in the signature and a "
        "default_factory in its Field(): keep one of them"
    )


def test_a_class_variable_or_final_qualifier_is_refused_not_dropped_from_the_schema() -> None:
    """pydantic reads ``ClassVar`` (and ``Final`` with a default) as an attribute of the
    arguments' class: without this check the parameter left the schema silently and the
    model could never send it. Bare or subscripted, inside ``Annotated`` or not, with a
    default or without: each is refused, naming the tool and the parameter."""

    async def class_var(a: int, b: ClassVar[int] = 3) -> None: ...

    async def final(a: int, b: Final[int] = 3) -> None: ...

    async def final_required(a: int, b: Final[int]) -> None: ...

    async def bare_final(a: int, b: Final = 3) -> None: ...  # type: ignore[misc]

    async def annotated(a: int, b: Annotated[ClassVar[int], "a count"] = 3) -> None: ...

    cases = [
        (class_var, "ClassVar"),
        (final, "Final"),
        (final_required, "Final"),
        (bare_final, "Final"),
        (annotated, "ClassVar"),
    ]
    for fn, qualifier in cases:
        # As this module writes them (``from __future__ import annotations``: strings,
        # which typing refuses to resolve), and as evaluated objects (a module without
        # that import: typing resolves them, and pydantic dropped the parameter).
        evaluated = inspect.get_annotations(fn, eval_str=True)
        for hints in (fn.__annotations__, evaluated):
            fn.__annotations__ = hints
            with pytest.raises(ToolDefinitionError) as error:
                tool(fn)
            assert str(error.value) == (
                f"tool {fn.__name__!r}, parameter 'b': {qualifier}[...] qualifies a class "
                "attribute or a variable, not a parameter the model sends: annotate it "
                "with its type alone"
            )

    async def plain(a: int, b: int = 3) -> None: ...

    assert set(tool(plain).input_schema["properties"]) == {"a", "b"}  # the control


def test_a_qualifier_on_the_return_is_not_taken_for_a_parameter() -> None:
    """Only the parameters are searched for ``ClassVar``/``Final``. A return annotated with
    one, written as a string (this module's ``from __future__ import annotations``), is
    refused as typing refuses it, never as a parameter named 'return'; a qualified
    parameter beside such a return is the one named. Evaluated, typing resolves the
    return, and the tool's parameters are its parameters alone."""

    async def returns_final(a: int) -> Final[int]: ...

    async def returns_class_var(a: int) -> ClassVar[int]: ...

    async def qualified_both(a: int, b: Final[int] = 3) -> Final[int]: ...

    for fn, written in ((returns_final, "Final[int]"), (returns_class_var, "ClassVar[int]")):
        with pytest.raises(ToolDefinitionError) as error:
            tool(fn)
        assert str(error.value) == (
            f"tool {fn.__name__!r}: cannot resolve the type hints of {fn.__qualname__}: "
            f"typing.{written} is not valid as type argument"
        )
    with pytest.raises(ToolDefinitionError) as error:
        tool(qualified_both)
    assert str(error.value).startswith(
        "tool 'qualified_both', parameter 'b': Final[...] qualifies a class attribute"
    )

    returns_final.__annotations__ = inspect.get_annotations(returns_final, eval_str=True)
    assert tool(returns_final).input_schema["properties"] == {"a": {"type": "integer"}}


def test_a_field_without_default_factory_beside_a_default_keeps_the_default() -> None:
    """Only a ``default_factory`` clashes with a default in the signature: a ``Field`` that
    constrains or describes the parameter, or a plain note, beside a default is accepted,
    and the schema shows that default with the Field's words and bounds."""

    async def page(
        size: Annotated[int, pydantic.Field(ge=1, description="rows per page")] = 20,
        sort: Annotated[str, "the column to sort by"] = "name",
    ) -> None: ...

    t = tool(page)
    assert t.input_schema["properties"] == {
        "size": {"default": 20, "description": "rows per page", "minimum": 1, "type": "integer"},
        "sort": {"default": "name", "description": "the column to sort by", "type": "string"},
    }
    assert "required" not in t.input_schema
    assert t.validate({"size": 0}) == ["size: Input should be greater than or equal to 1, got 0"]


def test_a_model_pydantic_cannot_build_names_the_tool_and_pydantic_s_reason() -> None:
    """Each parameter's type has a schema, but pydantic refuses the arguments' model as
    written (a default in the hint's ``Field`` and a ``default_factory`` in the one given as
    the signature's default): the error names the tool and says pydantic's reason."""

    async def count(
        start: Annotated[int, pydantic.Field(default=0)] = pydantic.Field(default_factory=int),
    ) -> None: ...

    with pytest.raises(ToolDefinitionError) as error:
        tool(count)
    assert str(error.value) == "tool 'count': cannot specify both default and default_factory"


def test_a_refused_name_is_told_the_rule() -> None:
    async def f() -> None: ...

    with pytest.raises(ToolDefinitionError) as error:
        tool(name="my tool")(f)
    assert str(error.value) == (
        "tool name 'my tool' is not accepted by the model vendors: use 1 to 64 letters, "
        "digits, '_' or '-'"
    )


class Opaque:
    """A type pydantic validates (by its own hook) but has no JSON schema for: the hook
    for the schema raises without a message."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(cls)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Any:
        raise NotImplementedError


def test_a_parameter_pydantic_validates_but_cannot_describe_is_named() -> None:
    """The parameter with no JSON schema is named with its type and pydantic's reason
    (the exception's class when it has no message), whichever parameter it is."""

    async def with_callback(when: datetime.datetime, then: Callable[[], int]) -> None: ...

    async def with_opaque(x: int, thing: Opaque) -> None: ...

    with pytest.raises(ToolDefinitionError) as error:
        tool(with_callback)
    assert str(error.value).startswith(
        "tool 'with_callback', parameter 'then': pydantic cannot describe "
        "collections.abc.Callable[[], int] (Cannot generate a JsonSchema for "
        "core_schema.CallableSchema)"
    )
    with pytest.raises(ToolDefinitionError) as error:
        tool(with_opaque)
    assert str(error.value).startswith(
        "tool 'with_opaque', parameter 'thing': pydantic cannot describe Opaque "
        "(NotImplementedError); use a type"
    )


def test_a_type_pydantic_cannot_build_from_json_is_refused_even_with_a_schema() -> None:
    """A schema written for a type pydantic knows nothing of does not make it a parameter:
    no JSON the model sends could become one (pydantic would only check the instance)."""

    async def hold(h: Annotated[Handle, pydantic.WithJsonSchema({"type": "string"})]) -> None: ...

    with pytest.raises(ToolDefinitionError, match="tool 'hold', parameter 'h': pydantic cannot"):
        tool(hold)


def test_a_default_pydantic_trips_over_while_describing_names_the_tool() -> None:
    """Each type has a schema but the whole has none: sorting this default for the
    schema fails (a NaN does not compare), so the error names the tool and the reason."""

    async def pick(
        x: int, among: frozenset[Decimal] = frozenset({Decimal("NaN"), Decimal(1)})
    ) -> None: ...

    with pytest.raises(ToolDefinitionError) as error:
        tool(pick)
    assert str(error.value) == (
        "tool 'pick': no JSON schema for its parameters: [<class 'decimal.InvalidOperation'>]"
    )


class Noted(pydantic.BaseModel):
    """A model whose schema hook warns (as a deprecated type of a library might)."""

    x: int

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Any:
        warnings.warn("Noted is going away", DeprecationWarning, stacklevel=2)
        return handler(schema)


def test_a_default_pydantic_cannot_write_in_json_is_left_out_quietly() -> None:
    """The schema leaves such a default out, with no warning at each definition, and
    the function keeps it; any other warning raised while describing still shows."""

    handle = Handle()

    async def use(h: object = handle) -> None: ...

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tool(use)
    assert t.input_schema["properties"] == {"h": {}}
    assert t.structure_args({}) == {}  # left out: the function's own default applies

    async def noted(n: Noted) -> None: ...

    with pytest.warns(DeprecationWarning, match="Noted is going away"):
        tool(noted)


def test_an_unserializable_result_is_told_what_to_return_instead() -> None:
    with pytest.raises(ResultNotSerializable) as error:
        render("t", Handle())
    assert str(error.value).endswith(
        "; return a str, a pydantic model, a dataclass, or dicts and lists of JSON values"
    )


# -- OpenAI's strict mode, keyword by keyword ------------------------------------------------


def test_strict_mode_judges_each_keyword_of_a_schema_it_is_given() -> None:
    """A schema from elsewhere (an MCP server's) is judged as it is: every object closed
    with all its properties required, every sub-schema (items, anyOf, $defs) too, and
    only strict mode's keywords."""
    closed = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    closed["additionalProperties"] = False
    assert strict_compatible(closed) is True
    assert strict_compatible({"type": "object", "additionalProperties": False}) is True
    assert strict_compatible({"type": "object"}) is False  # open
    assert strict_compatible({"properties": {"a": {"type": "string"}}}) is False  # open
    assert strict_compatible({"type": "string", "minLength": 1}) is False
    assert strict_compatible({"type": "string", "additionalProperties": False}) is False
    assert strict_compatible({"type": "array", "items": {"type": "string"}}) is True
    assert strict_compatible({"type": "array", "items": {"type": "string", "minLength": 1}}) is (
        False
    )
    assert strict_compatible({"type": "array", "items": True}) is False
    assert strict_compatible({"anyOf": [{"type": "string"}, {"type": "null"}]}) is True
    assert strict_compatible({"anyOf": [{"type": "string", "minLength": 1}]}) is False
    every_keyword = {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
        "items": {"type": "string"},
        "enum": [{}],
        "const": {},
        "anyOf": [{"type": "object", "additionalProperties": False}],
        "$ref": "#/$defs/Empty",
        "$defs": {"Empty": {"type": "object", "additionalProperties": False}},
        "description": "d",
        "title": "t",
        "pattern": ".",
        "format": "date",
        "minimum": 0,
        "maximum": 1,
        "exclusiveMinimum": -1,
        "exclusiveMaximum": 2,
        "multipleOf": 1,
        "minItems": 0,
        "maxItems": 1,
    }
    assert strict_compatible(every_keyword) is True  # all of the subset at once is still in it
