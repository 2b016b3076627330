"""Schema derivation from tool signatures, and the validator's messages to the model."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import attrs
import pytest

from perdure import ReplayPolicy, ToolContext, tool
from perdure.tools.contract import Tool, registry
from perdure.tools.schema import UnsupportedType, schema_for, validate


@attrs.frozen
class Point:
    x: int
    y: int = 0
    label: Annotated[str | None, "shown next to the point"] = None


@attrs.frozen
class Shape:
    name: str
    points: list[Point]


@pytest.mark.parametrize(
    ("hint", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (Any, {}),
        (list[str], {"type": "array", "items": {"type": "string"}}),
        (list, {"type": "array", "items": {}}),
        (set[int], {"type": "array", "items": {"type": "integer"}}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict[str, Any], {"type": "object"}),
        (dict, {"type": "object"}),
        (Literal["a", "b"], {"enum": ["a", "b"], "type": "string"}),
        (Literal[1, 2], {"enum": [1, 2], "type": "integer"}),
        (Literal["a", 1], {"enum": ["a", 1]}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (
            int | str | None,
            {"anyOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"type": "null"}]},
        ),
        (Annotated[str, "a name"], {"type": "string", "description": "a name"}),
        (Annotated[int, "one", "two"], {"type": "integer", "description": "one two"}),
        (Annotated[int, 42], {"type": "integer"}),  # non-string metadata is not a description
        (
            list[Annotated[str, "a tag"]],
            {"type": "array", "items": {"type": "string", "description": "a tag"}},
        ),
    ],
)
def test_schema_of_each_supported_type(hint: Any, schema: dict[str, Any]) -> None:
    assert schema_for(hint) == schema


def test_schema_of_attrs_classes_nests_and_marks_required_fields() -> None:
    point = {
        "type": "object",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "integer"},
            "label": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "shown next to the point",
            },
        },
        "additionalProperties": False,
        "required": ["x"],
    }
    assert schema_for(Point) == point
    assert schema_for(Shape) == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "points": {"type": "array", "items": point}},
        "additionalProperties": False,
        "required": ["name", "points"],
    }


@pytest.mark.parametrize("hint", [dict[int, str], bytes, complex, object])
def test_unsupported_types_are_refused_by_name(hint: Any) -> None:
    with pytest.raises(UnsupportedType, match=r"cannot derive|dict keys must be str"):
        schema_for(hint)


# -- @tool: the schema of a signature --------------------------------------------------------


@tool(replay=ReplayPolicy.SAFE)
async def draw(
    ctx: ToolContext,
    shape: Shape,
    color: Literal["red", "green"] = "red",
    scale: Annotated[float, "1.0 is natural size"] = 1.0,
    tags: list[str] | None = None,
    dry_run: bool = False,
) -> str:
    """Draw a shape.

    More words for the model.
    """
    return f"{shape.name} {color} {scale} {tags} {dry_run} {ctx.attempt}"


def test_tool_schema_from_signature() -> None:
    assert isinstance(draw, Tool)
    assert draw.name == "draw"
    assert draw.description == "Draw a shape.\n\nMore words for the model."
    assert draw.takes_context
    schema = draw.input_schema
    assert schema["required"] == ["shape"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["color"] == {"enum": ["red", "green"], "type": "string"}
    assert schema["properties"]["scale"] == {"type": "number", "description": "1.0 is natural size"}
    assert schema["properties"]["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    }
    assert schema["properties"]["shape"] == schema_for(Shape)
    assert "ctx" not in schema["properties"]


def test_effective_args_fill_json_defaults_and_structure_builds_attrs_values() -> None:
    args = {"shape": {"name": "tri", "points": [{"x": 1}, {"x": 2, "y": 3, "label": "b"}]}}
    assert draw.validate(args) == []
    effective = draw.effective_args(args)
    assert effective == {**args, "color": "red", "scale": 1.0, "tags": None, "dry_run": False}
    structured = draw.structure_args(effective)
    assert structured["shape"] == Shape("tri", [Point(1), Point(2, 3, "b")])


async def test_a_tool_without_context_is_called_with_its_arguments_only() -> None:
    @tool
    async def add(a: int, b: int = 2) -> int:
        return a + b

    assert not add.takes_context
    assert add.replay is ReplayPolicy.NEVER  # a tool must opt in to being replayed
    assert add.description == "add"
    ctx = ToolContext(idempotency_key="k", call_id="c", session_id="s", attempt=1, workspace=None)
    assert await add.invoke(ctx, add.effective_args({"a": 1})) == 3


def test_definition_hash_changes_with_what_the_model_is_told() -> None:
    async def f(x: int) -> None:
        """One."""

    async def g(x: int) -> None:
        """Two."""

    assert tool(name="f")(f).definition_hash == tool(name="f")(f).definition_hash
    assert tool(name="f")(f).definition_hash != tool(name="f")(g).definition_hash
    safe = tool(name="f", replay=ReplayPolicy.SAFE)(f)
    assert safe.definition_hash != tool(name="f")(f).definition_hash


def test_declaration_errors_are_clear() -> None:
    def sync(x: int) -> int:
        return x

    async def star(*args: int) -> None: ...

    async def untyped(x) -> None: ...  # type: ignore[no-untyped-def]

    async def odd(x: bytes) -> None: ...

    with pytest.raises(TypeError, match="needs an async function"):
        tool(sync)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs cannot be described"):
        tool(star)
    with pytest.raises(TypeError, match="parameter 'x' needs a type hint"):
        tool(untyped)
    with pytest.raises(UnsupportedType):
        tool(odd)
    with pytest.raises(TypeError, match="must be a ReplayPolicy"):
        tool(replay="safe")(star)  # type: ignore[call-overload]


def test_registry_refuses_duplicates_and_non_tools() -> None:
    with pytest.raises(ValueError, match="two tools are named 'draw'"):
        registry([draw, draw])
    with pytest.raises(TypeError, match="not a tool"):
        registry([print])  # type: ignore[list-item]


# -- the validator's words ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "problems"),
    [
        ({}, ["the arguments: missing required field 'shape'"]),
        (
            {"shape": {"name": "t", "points": []}, "colour": "red"},
            [
                "the arguments: unexpected field 'colour' "
                "(allowed: color, dry_run, scale, shape, tags)"
            ],
        ),
        (
            {"shape": {"name": "t", "points": []}, "color": "blue"},
            ["color: must be one of ['red', 'green'], got 'blue'"],
        ),
        (
            {"shape": {"name": "t", "points": []}, "scale": "big"},
            ["scale: expected number, got 'big'"],
        ),
        (
            {"shape": {"name": "t", "points": []}, "dry_run": 1},
            ["dry_run: expected boolean, got 1"],
        ),
        (
            {"shape": {"name": "t", "points": [{"x": True}, {"y": 1}]}},
            [
                "shape.points[0].x: expected integer, got True",
                "shape.points[1]: missing required field 'x'",
            ],
        ),
        (
            {"shape": {"name": "t", "points": []}, "tags": ["a", 3]},
            ["tags: ['a', 3] matches none of the allowed forms"],
        ),
        ({"shape": "square"}, ["shape: expected object, got 'square'"]),
    ],
)
def test_validator_messages_name_the_path_and_the_problem(
    args: dict[str, Any], problems: list[str]
) -> None:
    assert draw.validate(args) == problems


def test_validator_accepts_ints_as_numbers_but_not_bools_as_ints() -> None:
    assert validate({"type": "number"}, 3) == []
    assert validate({"type": "integer"}, 3.0) == ["the arguments: expected integer, got 3.0"]
    assert validate({"type": "integer"}, False) == ["the arguments: expected integer, got False"]


def test_validator_reports_every_problem_and_shortens_long_values() -> None:
    schema = schema_for(Shape)
    problems = validate(schema, {"name": "x" * 100, "points": "none", "extra": 1})
    assert problems == [
        "points: expected array, got 'none'",
        "the arguments: unexpected field 'extra' (allowed: name, points)",
    ]
    long = validate({"type": "integer"}, "y" * 100)
    assert long == [f"the arguments: expected integer, got '{'y' * 56}..."]


def test_non_object_arguments_are_refused() -> None:
    assert draw.validate(["shape"]) == ["the arguments must be a JSON object, got list"]
