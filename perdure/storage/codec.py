"""Records to bytes and back: the one cattrs converter, the frame, the checksum.

A stored record is a frame::

    byte 0      frame format (currently 1)
    bytes 1..4  CRC-32 (big-endian) of the sequence number (8 bytes, big-endian) + payload
    bytes 5..   payload: compact JSON {"t": type name, "v": record version, ...fields}

The checksum covers the sequence number, so a record copied under the wrong key is
caught as surely as a flipped bit. Decoding never guesses: anything that is not a
well-formed record of a known type and version raises ``CorruptRecord`` naming
the sequence number.

Migrations: a record stored under an older version of its type is brought to the
current one by explicit steps, never by accident. ``MIGRATIONS`` maps (record type
name, stored version) to a function that turns that version's payload (a dict,
without ``t`` and ``v``) into the next version's; decoding applies the steps in
order, then structures the result strictly as today's class. A version with no
step (or newer than this build's) is a ``CorruptRecord`` that says so, so an old
shape is never read as if it were today's. Register a step with ``@migration``,
bump the type's entry in ``records.RECORD_VERSIONS``, and add a golden log of the
release that wrote the old shape (``tests/golden``). Adding a field with a default
needs neither: old payloads structure with the default.
"""

from __future__ import annotations

import json
import typing
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Final

import cattrs
import jiter
from cattrs.strategies import configure_tagged_union

from perdure.storage.errors import CorruptRecord as CorruptRecord  # defined with the log's errors
from perdure.storage.records import (
    RECORD_TYPES,
    RECORD_VERSIONS,
    Record,
    RedactedThinkingBlock,
    Thinking,
    ThinkingBlock,
)

FRAME_FORMAT: Final = 1
_HEADER: Final = 5


_EXACT_FLOAT_INT: Final = 2**53  # every int up to this is exactly a float


# Built once at import, before a mutation test can switch a change of it on; its rules
# are proven by tests/storage/test_codec.py, not counted by the campaign (RELIABILITY.md).
def _strict(kind: type) -> Any:  # pragma: no mutate block
    # cattrs' default hooks coerce (str(5) == "5"); a log must not be read loosely.
    # One hook per kind, doing only its own check: they run for every field of every
    # record read, so recovery's start-up pays for each instruction here. A float field
    # may hold a JSON integer (2 for 2.0), but only one a float holds exactly: a larger
    # one would be read as another number.
    def wrong(value: Any) -> TypeError:
        return TypeError(f"expected {kind.__name__}, found {type(value).__name__}")

    if kind is float:

        def as_float(value: Any, _: type) -> Any:
            found = type(value)
            if found is float:
                return value
            if found is int and -_EXACT_FLOAT_INT <= value <= _EXACT_FLOAT_INT:
                return float(value)
            raise wrong(value)

        return as_float

    def exactly(value: Any, _: type) -> Any:
        if type(value) is not kind:
            raise wrong(value)
        return value

    return exactly


# Built once at import, before a mutation test can switch a change of it on; its rules
# are proven by tests/storage/test_codec.py, not counted by the campaign (RELIABILITY.md).
def _strict_containers(conv: cattrs.Converter) -> None:  # pragma: no mutate block
    # cattrs builds a list from any iterable ({} becomes [], {"a": 1} becomes ["a"])
    # and a dict from pairs; a stored list must be a list and a dict a dict. The hooks
    # of the items are looked up once, on first use (not at every item: a dispatch
    # per item cost more than the item).
    def hook_of(kind: Any) -> Callable[[], Any]:
        found: list[Any] = []

        def get() -> Any:
            if not found:
                found.append(conv.get_structure_hook(kind))
            return found[0]

        return get

    def list_hook(kind: Any) -> Any:
        (inner,) = typing.get_args(kind) or (Any,)
        item_hook = hook_of(inner)

        def hook(value: Any, _: type) -> Any:
            if type(value) is not list:
                raise TypeError(f"expected a list, found {type(value).__name__}")
            structure = item_hook()
            return [structure(v, inner) for v in value]

        return hook

    def dict_hook(kind: Any) -> Any:
        key, item = typing.get_args(kind) or (Any, Any)
        key_hook, item_hook = hook_of(key), hook_of(item)

        def hook(value: Any, _: type) -> Any:
            if type(value) is not dict:
                raise TypeError(f"expected an object, found {type(value).__name__}")
            k_of, v_of = key_hook(), item_hook()
            return {k_of(k, key): v_of(v, item) for k, v in value.items()}

        return hook

    def origin_is(kind: type) -> Any:
        def test(t: Any) -> bool:
            origin: Any = typing.get_origin(t)
            return origin is kind

        return test

    conv.register_structure_hook_factory(origin_is(list), list_hook)
    conv.register_structure_hook_factory(origin_is(dict), dict_hook)


# Built once at import, before a mutation test can switch a change of it on (the
# ``Record`` union's hooks on first use, by cattrs); its rules are proven by
# tests/storage/test_codec.py, not counted by the campaign (RELIABILITY.md).
def _make_converter() -> cattrs.Converter:  # pragma: no mutate block
    conv = cattrs.Converter(forbid_extra_keys=True)
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _strict(kind))
    _strict_containers(conv)
    # Explicit tags, not cattrs' guess by field names: a damaged block must not decode
    # as the other kind. Configured before ``Record``, whose member hooks are built at
    # once and would otherwise unstructure the blocks untagged.
    thinking_tags = {ThinkingBlock: "thinking", RedactedThinkingBlock: "redacted_thinking"}
    configure_tagged_union(Thinking, conv, tag_name="type", tag_generator=thinking_tags.__getitem__)

    # The ``Record`` union (the event stream's and retention's way in) is configured on
    # its first use: cattrs builds every member's hooks when it is configured, a fifth
    # of ``import perdure``'s CPU, while ``decode`` and ``encode`` take each record
    # type's own hooks, built the first time that type is read or written.
    configured: list[bool] = []

    def configure_records() -> None:
        if not configured:
            configured.append(True)  # its hooks now replace these two
            configure_tagged_union(Record, conv, tag_name="t")

    def structure_record(value: Any, kind: Any) -> Any:
        configure_records()
        return conv.get_structure_hook(Record)(value, kind)

    def unstructure_record(value: Any) -> Any:
        configure_records()
        return conv.get_unstructure_hook(Record)(value)

    conv.register_structure_hook(Record, structure_record)
    conv.register_unstructure_hook(Record, unstructure_record)
    return conv


converter: Final = _make_converter()
_BY_NAME: Final = {cls.__name__: cls for cls in RECORD_TYPES}
# Each record type's structure hook, by tag, filled on first use: ``decode`` calls it
# directly, sparing every record a dispatch on the union and a copy of its payload.
_STRUCTURE: Final[dict[str, Callable[[Any, type], Any]]] = {}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a record")


# One decoder for every frame: ``json.loads`` with an option builds a new decoder (and
# its scanner) on every call, which costs as much as parsing a small record.
_JSON_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)


def _parse(body: bytes) -> Any:
    """The payload's JSON value; ``ValueError`` (or ``RecursionError``) if it is not one.

    jiter (a dependency of the anthropic SDK) parses a record two to three times as fast
    as the standard library, and reads every payload ``encode`` writes as it does. The
    standard library stays the rule: a payload jiter refuses is parsed again by it,
    which either names the defect as it always did or reads the few things jiter is
    stricter about (a lone surrogate escape, deeper nesting); jiter is given only a body
    that starts and ends as a compact object does, since it would skip whitespace
    around the value, which the rule calls damage.
    """
    if body[:1] == b"{" and body[-1:] == b"}":
        try:
            return jiter.from_json(body, allow_inf_nan=False)
        except ValueError:
            pass  # the standard library's verdict below
    # ``encode`` writes compact UTF-8 JSON and nothing else: no encoding to detect, no
    # whitespace to skip; anything after the value is damage.
    text = body.decode()
    data, end = _JSON_DECODER.raw_decode(text)
    if end != len(text):
        raise ValueError(f"extra data after the object (at character {end})")
    return data


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


# One encoder, built once (json.dumps with options builds one per call).
_JSON_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# Per record class, filled the first time one is written: its own unstructure hook, its
# tag and its version. The same dict the tagged union's hook makes ({fields..., "t":
# tag}), without its dispatch per call.
_ENCODERS: Final[dict[type, tuple[Callable[[Any], dict[str, Any]], str, int]]] = {}


def encode(record: Record, seq: int) -> bytes:
    """Frame ``record`` for storage under sequence number ``seq``."""
    cls = type(record)
    found = _ENCODERS.get(cls)
    if found is None:
        hook = converter.get_unstructure_hook(cls)
        found = _ENCODERS[cls] = (hook, cls.__name__, RECORD_VERSIONS[cls.__name__])
    unstructure, tag, version = found
    data = unstructure(record)
    data["t"] = tag
    data["v"] = version
    body = _JSON_ENCODER.encode(data).encode()
    crc = zlib.crc32(body, zlib.crc32(_seq_bytes(seq)))
    return bytes((FRAME_FORMAT,)) + crc.to_bytes(4, "big") + body


Migration = Callable[[dict[str, Any]], dict[str, Any]]

# (record type name, stored version) -> the step to version + 1. None yet: every
# change so far added fields with defaults.
MIGRATIONS: Final[dict[tuple[str, int], Migration]] = {}


def check_migrations(
    migrations: Mapping[tuple[str, int], Migration], versions: Mapping[str, int]
) -> None:
    """Refuse a step for an unknown record type, or one that does not lead to the present."""
    for name, version in migrations:
        if name not in versions:
            raise ValueError(f"migration of {name!r}: no record type of that name")
        if not 1 <= version < versions[name]:
            raise ValueError(
                f"migration of {name} from version {version}: the current version is "
                f"{versions[name]}, so a step must start at 1 to {versions[name] - 1}"
            )


def migration(name: str, version: int) -> Callable[[Migration], Migration]:
    """Register the decorated function as the step from ``version`` of ``name`` to the next."""

    def register(step: Migration) -> Migration:
        check_migrations({(name, version): step}, RECORD_VERSIONS)
        if (name, version) in MIGRATIONS:
            raise ValueError(f"two migrations of {name} from version {version}")
        MIGRATIONS[name, version] = step
        return step

    return register


def _upgrade(
    seq: int,
    name: str,
    version: object,
    data: dict[str, Any],
    versions: Mapping[str, int],
    migrations: Mapping[tuple[str, int], Migration],
) -> dict[str, Any]:
    current = versions[name]
    if type(version) is not int or version < 1:
        raise CorruptRecord(seq, f"unsupported version {version!r} of {name}")
    if version > current:
        raise CorruptRecord(
            seq,
            f"unsupported version {version} of {name}: written by a newer build "
            f"(this one reads version {current})",
        )
    while version < current:
        step = migrations.get((name, version))
        if step is None:
            raise CorruptRecord(
                seq,
                f"unsupported version {version} of {name}: no migration from it "
                f"(this build reads version {current})",
            )
        fields = {k: v for k, v in data.items() if k != "t"}
        try:
            fields = step(fields)
        except Exception as exc:  # a step that cannot read this payload: damaged
            raise CorruptRecord(
                seq, f"migration of {name} from version {version} failed: {exc!r}"
            ) from None
        data = {"t": name, **fields}
        version += 1
    return data


def decode(
    seq: int,
    frame: bytes,
    *,
    versions: Mapping[str, int] = RECORD_VERSIONS,
    migrations: Mapping[tuple[str, int], Migration] = MIGRATIONS,
) -> Record:
    """Decode the frame stored under ``seq``; raise ``CorruptRecord`` on any defect.

    ``versions`` and ``migrations`` are the registries (module docstring); only a
    test of the migration path gives others."""
    if len(frame) < _HEADER + 2:
        raise CorruptRecord(seq, f"frame too short ({len(frame)} bytes)")
    if frame[0] != FRAME_FORMAT:
        raise CorruptRecord(seq, f"unknown frame format {frame[0]}")
    body = frame[_HEADER:]
    expected = int.from_bytes(frame[1:_HEADER], "big")
    if zlib.crc32(body, zlib.crc32(_seq_bytes(seq))) != expected:
        raise CorruptRecord(seq, "checksum mismatch")
    try:
        data = _parse(body)
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad UTF-8, bad JSON, NaN/Infinity (never written: encode
        # refuses them) and integers beyond Python's digit limit; RecursionError, deep
        # nesting. All mean "damaged", none may escape as anything but CorruptRecord.
        raise CorruptRecord(seq, f"payload is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptRecord(seq, "payload is not an object")
    name = data.get("t")
    version = data.pop("v", None)
    if not isinstance(name, str) or name not in _BY_NAME:
        raise CorruptRecord(seq, f"unknown record type {name!r}")
    if version != versions[name]:
        data = _upgrade(seq, name, version, data, versions, migrations)
    kind = _BY_NAME[name]
    hook = _STRUCTURE.get(name)
    if hook is None:
        hook = _STRUCTURE[name] = converter.get_structure_hook(kind)
    del data["t"]  # the tag chose the type (what the tagged union's hook does)
    try:
        record: Record = hook(data, kind)
    except Exception as exc:  # cattrs raises several exception types; all mean "damaged"
        detail = "; ".join(cattrs.transform_error(exc)) if isinstance(exc, Exception) else ""
        raise CorruptRecord(seq, f"fields do not match {name}: {detail or exc}") from None
    return record


check_migrations(MIGRATIONS, RECORD_VERSIONS)  # the registry is checked at import
