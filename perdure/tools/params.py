"""A tool's parameters, by pydantic: their JSON schema, the check of a model's
arguments, and the values the function receives.

``describe(tool_name, fn)`` reads a function's signature once, at definition: every
parameter becomes a field of a pydantic model (any type pydantic handles: models,
dataclasses, TypedDicts, Enums, Literals, datetimes, UUIDs, paths, unions,
``Annotated[..., Field(...)]`` with its description and constraints), and its
docstring (Google, NumPy or Sphinx style, read by griffe) gives the tool's
description and each parameter's. The result, ``Parameters``, gives the schema
sent to the vendors, the problems with a model's arguments in words the model can
act on (field path and message), and the converted values for the call.

``render(tool_name, value)`` is the one rule for what the model reads of a result:
a ``str`` as it is, anything else as JSON through pydantic's serializer; a value it
cannot serialize raises ``ResultNotSerializable`` naming the tool and the type.

Definition errors name the tool and the parameter (``ToolDefinitionError``).
"""

from __future__ import annotations

import inspect
import json
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from attrs import frozen

if TYPE_CHECKING:
    import pydantic

# pydantic is imported when a tool is defined or its result rendered, not by
# ``import perdure`` (which stays light for the command line and the daemon's clients).

JsonSchema = dict[str, Any]

# The rule both vendors apply to a tool's name (Anthropic and OpenAI).
NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolDefinitionError(TypeError):
    """A tool that cannot be described to a model as it is written."""


class ResultNotSerializable(TypeError):
    """A tool returned a value pydantic cannot turn into JSON for the model."""


def check_name(name: str) -> None:
    """Refuse a name the model vendors would reject (at definition, not at the first call)."""
    if not isinstance(name, str) or not NAME_RULE.match(name):
        raise ToolDefinitionError(
            f"tool name {name!r} is not accepted by the model vendors: use 1 to 64 "
            "letters, digits, '_' or '-'"
        )


class Secret:
    """Marks a tool parameter as secret: ``token: Annotated[str, Secret]``.

    The tool gets the value as usual, and the log keeps it (the model wrote it); the
    records name the parameter as secret, so every view that leaves the log (exports,
    traces, event streams, the page, ``perdure show``) shows ``[secret]`` instead.
    """


def _is_secret(hint: Any) -> bool:
    if typing.get_origin(hint) is not typing.Annotated:
        return False
    return any(m is Secret or isinstance(m, Secret) for m in typing.get_args(hint)[1:])


@frozen(eq=False)
class Parameters:
    """What a tool's signature says to the model, and how its arguments are checked."""

    model: type[pydantic.BaseModel]
    schema: JsonSchema
    # {alias in the schema: field name in the model}: the model's fields are named
    # p0, p1, ... so that a parameter named e.g. ``json`` or ``model_config`` cannot
    # clash with pydantic's own attributes.
    names: Mapping[str, str]
    secret: frozenset[str] = frozenset()  # the parameters declared ``Secret``

    def problems(self, args: dict[str, Any]) -> list[str]:
        """Every way ``args`` fails the parameters, as ``path: message`` (empty: valid)."""
        import pydantic

        try:
            self.model.model_validate(args)
        except pydantic.ValidationError as exc:
            allowed = ", ".join(sorted(self.names)) or "none"
            return [_problem(error, allowed) for error in exc.errors(include_url=False)]
        return []

    def convert(self, args: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the call: each value as the function's type hint says
        (a model instance for a model parameter, a datetime for a datetime...).

        Raises ``pydantic.ValidationError`` for arguments that ``problems`` refuses.
        """
        validated = self.model.model_validate(args)
        given = validated.model_fields_set
        # A parameter the model left out keeps the function's own default object.
        return {
            alias: getattr(validated, field)
            for alias, field in self.names.items()
            if field in given
        }


def _problem(error: Mapping[str, Any], allowed: str) -> str:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = str(error["msg"])
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        message = f"unexpected field (the tool's parameters: {allowed})"
    elif error["type"] == "extra_forbidden":
        message = "unexpected field"
    elif error["type"] != "missing":  # the value the model sent, so it sees its mistake
        message += f", got {_shortened(error.get('input'))}"
    return f"{path or 'the arguments'}: {message}"


def _shortened(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(tool_name: str, fn: Callable[..., Any], *, skip_first: bool) -> tuple[str, Parameters]:
    """The docstring's description, and the parameters of ``fn`` (without the first if
    ``skip_first``: the ``ToolContext``)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a hint naming something the module cannot resolve
        # Under ``from __future__ import annotations`` typing refuses a ClassVar or Final
        # in a function's hints: say which parameter, as without that import.
        qualified = _qualified_parameter(fn)
        if qualified is not None:
            where = f"tool {tool_name!r}, parameter {qualified[0]!r}"
            raise _qualifier_error(where, qualified[1]) from None
        raise ToolDefinitionError(
            f"tool {tool_name!r}: cannot resolve the type hints of {fn.__qualname__}: {exc}"
        ) from None
    import pydantic

    params = list(inspect.signature(fn).parameters.values())
    if skip_first:
        params = params[1:]
    summary, documented = _docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    secret: set[str] = set()
    for index, p in enumerate(params):
        where = f"tool {tool_name!r}, parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolDefinitionError(f"{where}: *args/**kwargs cannot be described to a model")
        if p.kind is p.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"{where}: a positional-only parameter cannot be named")
        if p.name not in hints:
            raise ToolDefinitionError(f"{where}: needs a type hint")
        hint = hints[p.name]
        if _is_context(hint):
            raise ToolDefinitionError(
                f"{where}: a ToolContext must be the first parameter of the tool"
            )
        qualifier = _class_qualifier(hint)
        if qualifier is not None:
            # pydantic reads a ClassVar (and a Final with a default) as an attribute of
            # the arguments' class, not a field: the parameter would leave the schema
            # without a word, and the model could never send it.
            raise _qualifier_error(where, qualifier)
        if p.default is not inspect.Parameter.empty and _has_default_factory(hint):
            raise ToolDefinitionError(
                f"{where}: has both a default in the signature and a default_factory "
                "in its Field(): keep one of them"
            )
        field_name = f"p{index}"
        names[p.name] = field_name
        if _is_secret(hint):
            secret.add(p.name)
        described = _description(hint, documented, p.name)
        # A description given as None would override one in the hint's own Field().
        info = (
            pydantic.Field(alias=p.name)
            if described is None
            else pydantic.Field(alias=p.name, description=described)
        )
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[field_name] = (typing.Annotated[hint, info], default)
    model = _model(tool_name, fields, hints, names)
    schema = _schema(tool_name, model, hints, names)
    return summary, Parameters(model=model, schema=schema, names=names, secret=frozenset(secret))


def _is_context(hint: Any) -> bool:
    from perdure.tools.contract import ToolContext  # the contract imports this module

    return _strip_annotated(hint) is ToolContext


def _class_qualifier(hint: Any) -> str | None:
    """``"ClassVar"`` or ``"Final"`` if the hint (or the type inside its ``Annotated``)
    is one of those qualifiers, bare or subscripted; else None."""
    base = _strip_annotated(hint)
    for qualifier, name in ((typing.ClassVar, "ClassVar"), (typing.Final, "Final")):
        if base is qualifier or typing.get_origin(base) is qualifier:
            return name
    return None


def _qualifier_error(where: str, qualifier: str) -> ToolDefinitionError:
    return ToolDefinitionError(
        f"{where}: {qualifier}[...] qualifies a class attribute or a variable, not a "
        "parameter the model sends: annotate it with its type alone"
    )


def _qualified_parameter(fn: Callable[..., Any]) -> tuple[str, str] | None:
    """The first parameter of ``fn`` annotated ``ClassVar`` or ``Final`` and that
    qualifier, from its annotations evaluated as plain expressions (which, unlike
    ``typing.get_type_hints``, accept them); None if there is none or they cannot be."""
    try:
        annotations = inspect.get_annotations(fn, eval_str=True)
    except Exception:
        return None
    for name, hint in annotations.items():
        qualifier = _class_qualifier(hint) if name != "return" else None
        if qualifier is not None:
            return name, qualifier
    return None


def _has_default_factory(hint: Any) -> bool:
    """Whether a ``Field(default_factory=...)`` is in the hint's ``Annotated`` metadata."""
    from pydantic.fields import FieldInfo

    if typing.get_origin(hint) is not typing.Annotated:
        return False
    return any(
        isinstance(a, FieldInfo) and a.default_factory is not None
        for a in typing.get_args(hint)[1:]
    )


def _strip_annotated(hint: Any) -> Any:
    if typing.get_origin(hint) is typing.Annotated:
        return typing.get_args(hint)[0]
    return hint


def _description(hint: Any, documented: Mapping[str, str], name: str) -> str | None:
    """The parameter's description: a plain string in its ``Annotated`` hint, else the
    docstring's (a ``Field(description=...)`` in the hint wins over both)."""
    from pydantic.fields import FieldInfo

    if typing.get_origin(hint) is typing.Annotated:
        metadata = typing.get_args(hint)[1:]
        if any(isinstance(a, FieldInfo) and a.description is not None for a in metadata):
            return None
        notes = [a for a in metadata if isinstance(a, str)]
        if notes:
            return " ".join(notes)
    return documented.get(name)


def _model(
    tool_name: str, fields: dict[str, Any], hints: Mapping[str, Any], names: Mapping[str, str]
) -> type[pydantic.BaseModel]:
    import pydantic

    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False)
    try:
        return pydantic.create_model(f"{tool_name}_arguments", __config__=config, **fields)
    except Exception as exc:
        culprit = _first_undescribable(tool_name, hints, names)
        if culprit is not None:
            raise culprit from None
        raise ToolDefinitionError(f"tool {tool_name!r}: {exc}") from None


def _first_undescribable(
    tool_name: str, hints: Mapping[str, Any], names: Mapping[str, str]
) -> ToolDefinitionError | None:
    """The first parameter pydantic cannot handle, as an error that names it."""
    import pydantic

    for name in names:
        try:
            pydantic.TypeAdapter(hints[name]).json_schema()
        except Exception as exc:
            return ToolDefinitionError(
                f"tool {tool_name!r}, parameter {name!r}: pydantic cannot describe "
                f"{_type_name(hints[name])} ({_first_line(exc)}); use a type pydantic "
                "handles (a pydantic model, a dataclass, a TypedDict, an Enum...)"
            )
    return None


def _type_name(hint: Any) -> str:
    base = _strip_annotated(hint)
    return base.__qualname__ if isinstance(base, type) else repr(base)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _schema(
    tool_name: str,
    model: type[pydantic.BaseModel],
    hints: Mapping[str, Any],
    names: Mapping[str, str],
) -> JsonSchema:
    from pydantic.json_schema import PydanticJsonSchemaWarning

    try:
        with warnings.catch_warnings():
            # A default pydantic cannot put in JSON is left out of the schema; that
            # is fine (the function keeps it), so no warning at every definition.
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            # No ``by_alias``: pydantic then names each field as its own model validates
            # it (a parameter by its name, the alias we gave it; a field of a model that
            # validates by name only, by that name), so the schema asks for what passes.
            schema = model.model_json_schema()
    except Exception as exc:
        # Name the parameter whose type has no schema (a Callable, say); failing that
        # (each type has one, the whole has not: a default pydantic trips over), the tool.
        culprit = _first_undescribable(tool_name, hints, names)
        raise culprit or ToolDefinitionError(
            f"tool {tool_name!r}: no JSON schema for its parameters: {_first_line(exc)}"
        ) from None
    cleaned: JsonSchema = _without_titles(schema)
    cleaned.setdefault("properties", {})
    return cleaned


# Keywords whose value is one schema, a list of schemas, or a map of name -> schema.
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "$defs", "patternProperties", "dependentSchemas")


def _without_titles(schema: Any) -> Any:
    """The schema without pydantic's generated ``title`` keywords (noise for a model:
    the property names say the same), keeping a property that is named ``title``."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "title"}
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _without_titles(out[key])
    for key in _MANY:
        if isinstance(out.get(key), list):
            out[key] = [_without_titles(s) for s in out[key]]
    for key in _NAMED:
        if isinstance(out.get(key), dict):
            out[key] = {name: _without_titles(s) for name, s in out[key].items()}
    return out


def _docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description and the documented parameters of a docstring, read by griffe.

    The description is the text before the first section (``Args:``, ``Parameters``,
    ``:param x:``...); without sections, the whole docstring.
    """
    text = inspect.cleandoc(doc or "").strip()
    if not text:
        return "", {}
    import griffe  # only when a tool is defined: keeps ``import perdure`` light

    sections: list[Any] = []
    docstring = griffe.Docstring(text, lineno=1)
    for style in ("google", "numpy", "sphinx"):
        # griffe reports what it could not parse through its logger: a docstring in
        # another style than the one tried is expected here, not a problem to show.
        with griffe.logger.disable():
            parsed = docstring.parse(style)
        if any(s.kind is not griffe.DocstringSectionKind.text for s in parsed):
            sections = parsed
            break
    if not sections:
        return text, {}
    summary = ""
    params: dict[str, str] = {}
    for section in sections:
        if section.kind is griffe.DocstringSectionKind.text and not summary:
            summary = str(section.value).strip()
        elif section.kind is griffe.DocstringSectionKind.parameters:
            for param in section.value:
                if param.description:
                    params[param.name] = " ".join(str(param.description).split())
    return summary, params


def render(tool_name: str, value: Any) -> str:
    """The text the model reads for a tool's return value.

    ``str`` as it is; ``None`` as nothing; anything else (a pydantic model, a dataclass,
    a dict, a list, a number, a datetime...) as JSON through pydantic's serializer.
    attrs classes, perdure's own style, are turned into dicts first.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if attrs.has(type(value)):
        value = attrs.asdict(value)
    import pydantic_core

    try:
        # pydantic says what the JSON is; json.dumps only lays it out (with spaces
        # after separators, and non-ASCII kept, as the model has always read it).
        plain = pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise ResultNotSerializable(
            f"tool {tool_name!r} returned a {type(value).__qualname__}, which pydantic "
            f"cannot serialize to JSON for the model ({_first_line(exc)}); return a str, "
            "a pydantic model, a dataclass, or dicts and lists of JSON values"
        ) from None
    return json.dumps(plain, ensure_ascii=False)


# Keywords OpenAI's strict mode accepts (its documented subset of JSON Schema).
_STRICT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "description",
        "title",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)


# The string formats strict mode knows (pydantic's "path", say, is not one of them).
_STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)


def strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode accepts ``schema`` as it is: every object closed
    (``additionalProperties: false``) with all its properties required, and only the
    keywords of strict mode's subset (no ``default``, ``oneOf``, ``minLength``...)."""
    if not isinstance(schema, dict):
        return False
    if not set(schema) <= _STRICT_KEYWORDS:
        return False
    if "format" in schema and schema["format"] not in _STRICT_FORMATS:
        return False
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required", [])) != set(props):
            return False
        if not all(strict_compatible(s) for s in props.values()):
            return False
    elif "additionalProperties" in schema:
        return False
    if "items" in schema and not strict_compatible(schema["items"]):
        return False
    if "anyOf" in schema and not all(strict_compatible(s) for s in schema["anyOf"]):
        return False
    defs = schema.get("$defs", {})
    return all(strict_compatible(s) for s in defs.values())
