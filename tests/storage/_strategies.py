"""Hypothesis strategies for every record type, built from the attrs fields and type hints.

Nothing here is written per record type: ``records_of(cls)`` reads the class's
fields and resolved annotations, so a new record type or field is covered as soon
as it exists, and a field of a type this module does not know fails loudly
instead of being skipped. Values are JSON-safe: finite floats, text without lone
surrogates, ``Any`` as nested JSON values.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import attrs
from hypothesis import strategies as st

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
INTS = st.integers()

JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | INTS | FLOATS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy of JSON-safe values of the annotated type ``tp``."""
    if tp is Any:
        return JSON_VALUES
    if tp is str:
        return TEXT
    if tp is bool:
        return st.booleans()
    if tp is int:
        return INTS
    if tp is float:
        return FLOATS
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of([st.none() if a is type(None) else for_type(a) for a in args])
    if origin is list:
        return st.lists(for_type(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(for_type(args[0]), for_type(args[1]), max_size=4)
    if attrs.has(tp):
        return records_of(tp)
    raise TypeError(f"no strategy for field type {tp!r}: teach tests/storage/_strategies.py")


_BUILT: dict[type, st.SearchStrategy[Any]] = {}

# Value types whose constructor validates their fields: the draws it would refuse are
# never a record the runtime could write, so they are not drawn.
NON_NEGATIVE: frozenset[str] = frozenset({"Budget"})


def records_of(cls: type) -> st.SearchStrategy[Any]:
    """Instances of the attrs class ``cls`` with every field drawn (defaults included)."""
    if cls not in _BUILT:
        hints = typing.get_type_hints(cls)
        fields = {f.name: for_type(hints[f.name]) for f in attrs.fields(cls)}
        if cls.__name__ in NON_NEGATIVE:
            non_negative = {
                int | None: st.none() | st.integers(min_value=0),
                float | None: st.none() | FLOATS.map(abs),
            }
            fields = {name: non_negative.get(hints[name], fields[name]) for name in fields}
        _BUILT[cls] = st.builds(cls, **fields)
    return _BUILT[cls]
