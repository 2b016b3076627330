"""JSON schemas from Python type hints, and a validator for exactly what they express.

Supported: ``str``, ``int``, ``float``, ``bool``, ``list[T]``, ``dict[str, T]``,
``Literal[...]``, ``T | None`` / ``Optional[T]``, attrs classes, and
``Annotated[T, "description"]``. The validator checks a model's arguments against
such a schema and reports every problem with its path, in words a model can act on.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import attrs

JsonSchema = dict[str, Any]

_SIMPLE: dict[Any, JsonSchema] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    Any: {},
}


class UnsupportedType(TypeError):
    pass


def schema_for(hint: Any) -> JsonSchema:
    """The JSON schema of one type hint."""
    if hint in _SIMPLE:
        return dict(_SIMPLE[hint])
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        inner = schema_for(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            inner["description"] = " ".join(notes)
        return inner
    if origin is Literal:
        values = list(args)
        kinds = {type(v) for v in values}
        out: JsonSchema = {"enum": values}
        if len(kinds) == 1:
            kind = kinds.pop()
            if kind in _SIMPLE:
                out["type"] = _SIMPLE[kind]["type"]
        return out
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        nullable = len(members) != len(args)
        if len(members) == 1:
            inner = schema_for(members[0])
        else:
            inner = {"anyOf": [schema_for(m) for m in members]}
        return {"anyOf": [inner, {"type": "null"}]} if nullable else inner
    if origin in (list, tuple, typing.Sequence, set, frozenset) or hint in (list, tuple):
        item = args[0] if args else Any
        return {"type": "array", "items": schema_for(item)}
    if origin in (dict, typing.Mapping) or hint is dict:
        if args and args[0] is not str:
            raise UnsupportedType(f"dict keys must be str in a tool signature, not {args[0]!r}")
        value = args[1] if args else Any
        out = {"type": "object"}
        if value is not Any:
            out["additionalProperties"] = schema_for(value)
        return out
    if isinstance(hint, type) and attrs.has(hint):
        return object_schema(
            {f.name: (f.type, f.default is attrs.NOTHING) for f in attrs.fields(hint)},
            resolve=typing.get_type_hints(hint, include_extras=True),
        )
    raise UnsupportedType(f"cannot derive a JSON schema for {hint!r}")


def object_schema(
    fields: dict[str, tuple[Any, bool]], resolve: dict[str, Any] | None = None
) -> JsonSchema:
    """An object schema from {name: (type, required)}; ``resolve`` maps names to real hints."""
    props: dict[str, JsonSchema] = {}
    required: list[str] = []
    for name, (hint, is_required) in fields.items():
        props[name] = schema_for(resolve[name] if resolve and name in resolve else hint)
        if is_required:
            required.append(name)
    out: JsonSchema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


_TYPE_CHECKS: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(schema: JsonSchema, value: Any, path: str = "") -> list[str]:
    """Every way ``value`` fails ``schema``, as readable sentences (empty when valid)."""
    where = path or "the arguments"
    if "anyOf" in schema:
        options = schema["anyOf"]
        if any(not validate(option, value, path) for option in options):
            return []
        return [f"{where}: {_describe(value)} matches none of the allowed forms"]
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPE_CHECKS[k](value) for k in kinds if k in _TYPE_CHECKS):
            return [f"{where}: expected {' or '.join(kinds)}, got {_describe(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: must be one of {schema['enum']}, got {_describe(value)}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(schema["items"], item, f"{path}[{i}]")
    if isinstance(value, dict) and (kind == "object" or "properties" in schema):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required field '{name}'")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            sub = f"{path}.{name}" if path else name
            if name in props:
                errors += validate(props[name], item, sub)
            elif extra is False:
                allowed = ", ".join(sorted(props)) or "none"
                errors.append(f"{where}: unexpected field '{name}' (allowed: {allowed})")
            elif isinstance(extra, dict):
                errors += validate(extra, item, sub)
    return errors
