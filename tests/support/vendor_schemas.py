"""What the real vendor APIs refuse in tool definitions, for the fake servers.

Both vendors take a tool's parameters as a JSON Schema object and its name only if
it matches ``^[a-zA-Z0-9_-]{1,64}$``. OpenAI's strict mode adds its own rules: every
object closed (``additionalProperties: false``) and every property listed in
``required``. Written from the vendors' documentation, independently of perdure's
own code, so that a schema perdure sends and a vendor would refuse fails a test.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def schema_problem(name: Any, schema: Any, *, strict: bool = False) -> str | None:
    """The vendor's 400 message for a tool ``name`` with parameters ``schema``, if any."""
    if not isinstance(name, str) or not _NAME.match(name):
        return f"Invalid tool name {name!r}: must match ^[a-zA-Z0-9_-]{{1,64}}$"
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return f"Invalid schema for function '{name}': the parameters must be of type object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"Invalid schema for function '{name}': {exc.message}"
    if strict:
        problem = _strict_problem(schema, ())
        if problem is not None:
            return f"Invalid schema for function '{name}': {problem}"
    return None


def _strict_problem(schema: Any, where: tuple[str, ...]) -> str | None:
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            return (
                f"In context={where}, 'additionalProperties' is required to be supplied "
                "and to be false."
            )
        missing = sorted(set(schema.get("properties", {})) - set(schema.get("required", [])))
        if missing:
            return (
                f"In context={where}, 'required' is required to be supplied and to be an "
                f"array including every key in properties. Missing '{missing[0]}'."
            )
    for key, value in schema.items():
        if key in ("properties", "$defs") and isinstance(value, dict):
            for sub, inner in value.items():
                found = _strict_problem(inner, (*where, key, sub))
                if found:
                    return found
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            found = _strict_problem(value, (*where, key))
            if found:
                return found
        elif key in ("anyOf", "allOf", "oneOf") and isinstance(value, list):
            for i, inner in enumerate(value):
                found = _strict_problem(inner, (*where, key, str(i)))
                if found:
                    return found
    return None
