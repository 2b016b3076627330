"""The codec: every record type survives encode/decode, and nothing damaged gets through.

* Round trip: for EVERY type in ``RECORD_TYPES`` (and the test checks that this is
  every member of the ``Record`` union), hypothesis builds instances from the attrs
  fields and type hints and ``decode(seq, encode(r, seq)) == r``, byte-stably.
* Garbage in, ``CorruptRecord`` out: arbitrary bytes, arbitrary payloads behind a
  valid checksum, and mutated real records raise only ``CorruptRecord`` naming
  the seq; a mutated record that does decode was not coerced ("never guesses").
* Known hostile payloads (deep nesting, giant integers, NaN, wrong types, ...) each
  fail with ``CorruptRecord`` and a reason that says what is wrong.
* Every single-bit flip of real stored frames is detected, in memory and through
  the log's read paths, and so is a frame read under the wrong sequence number.
"""

from __future__ import annotations

import json
import typing
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure.storage import codec
from perdure.storage.codec import CorruptRecord, decode, encode
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import (
    RECORD_TYPES,
    RECORD_VERSIONS,
    CancelRequested,
    GenerationCompleted,
    Record,
    RedactedThinkingBlock,
    RunFinished,
    SessionCreated,
    ThinkingBlock,
    ToolCall,
    ToolCompleted,
    ToolHeartbeat,
    ToolTaskCreated,
    Usage,
)
from tests.storage._strategies import JSON_VALUES, TEXT, records_of
from tests.support.stats import record_stat

SEQS = st.integers(min_value=0, max_value=2**64 - 1)
ANY_RECORD = st.sampled_from(RECORD_TYPES).flatmap(records_of)


def frame_of(payload: bytes, seq: int) -> bytes:
    """A frame with a VALID header and checksum around an arbitrary payload."""
    crc = zlib.crc32(payload, zlib.crc32(seq.to_bytes(8, "big")))
    return bytes((codec.FRAME_FORMAT,)) + crc.to_bytes(4, "big") + payload


def payload_of(record: Record) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(encode(record, 0)[5:])
    return data


def decode_or_error(seq: int, frame: bytes) -> Record | CorruptRecord:
    try:
        return decode(seq, frame)
    except CorruptRecord as exc:
        return exc


def assert_corrupt(seq: int, frame: bytes) -> CorruptRecord:
    with pytest.raises(CorruptRecord) as info:
        decode(seq, frame)
    assert info.value.seq == seq
    assert f"record {seq} " in str(info.value)
    return info.value


# -- round trip --------------------------------------------------------------------------


def test_record_types_is_the_record_union() -> None:
    """A type added to the union but not to RECORD_TYPES would escape every test here."""
    assert set(RECORD_TYPES) == set(typing.get_args(Record))
    assert len(set(RECORD_TYPES)) == len(RECORD_TYPES)
    assert set(RECORD_VERSIONS) == {cls.__name__ for cls in RECORD_TYPES}


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda cls: cls.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seq=SEQS)
def test_round_trip(cls: type[Record], data: st.DataObject, seq: int) -> None:
    record = data.draw(records_of(cls))
    frame = encode(record, seq)
    back = decode(seq, frame)
    assert type(back) is cls
    assert back == record
    assert encode(back, seq) == frame


def test_round_trip_keeps_nested_values_exact() -> None:
    """Nested attrs values and free-form JSON come back with their exact types."""
    record = GenerationCompleted(
        session_id="s",
        run_id="r",
        generation_id="g",
        text="héllo \u2603 \x00",
        tool_calls=[ToolCall(call_id="c1", name="t", input={"a": [1, 1.0, None, {"b": True}]})],
        usage=Usage(input_tokens=3, output_tokens=4),
        at=1700000000.25,
    )
    back = decode(9, encode(record, 9))
    assert back == record
    assert isinstance(back, GenerationCompleted)
    value = back.tool_calls[0].input["a"]
    assert [type(v) for v in value] == [int, float, type(None), dict]


_THOUGHTFUL = GenerationCompleted(
    session_id="s",
    run_id="r",
    generation_id="g",
    text="Adding them.",
    thinking=[
        ThinkingBlock("Two plus three \u2014 call add.", "EqQBsig+/=="),
        RedactedThinkingBlock("EmwKAhgBEgy3va3pzix/LafPsn4a"),
        ThinkingBlock("", "EqQBempty"),
    ],
    tool_calls=[ToolCall(call_id="c1", name="add", input={"a": 2, "b": 3})],
    stop_reason="tool_use",
    at=2.5,
)


def test_round_trip_keeps_thinking_blocks_in_order_and_tagged() -> None:
    """Reasoning blocks come back exact, in order, each tagged with its kind."""
    frame = encode(_THOUGHTFUL, 5)
    back = decode(5, frame)
    assert back == _THOUGHTFUL
    assert isinstance(back, GenerationCompleted)
    assert [type(b) for b in back.thinking] == [
        ThinkingBlock,
        RedactedThinkingBlock,
        ThinkingBlock,
    ]
    assert encode(back, 5) == frame
    assert [b["type"] for b in payload_of(_THOUGHTFUL)["thinking"]] == [
        "thinking",
        "redacted_thinking",
        "thinking",
    ]


def test_generation_completed_without_thinking_decodes_as_before() -> None:
    """A reply written before the field existed (no ``thinking`` key) has no reasoning."""
    payload = payload_of(_THOUGHTFUL)
    del payload["thinking"]
    back = decode(6, frame_of(json.dumps(payload).encode(), 6))
    assert isinstance(back, GenerationCompleted)
    assert back.thinking == []
    assert back == attrs.evolve(_THOUGHTFUL, thinking=[])


# -- garbage in, CorruptRecord out -------------------------------------------------------

_fed = {"inputs": 0, "bit_flips": 0}


def teardown_module() -> None:
    record_stat("decoder_fuzz", **_fed)


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=300), seq=SEQS)
def test_arbitrary_bytes_raise_only_corrupt_record(frame: bytes, seq: int) -> None:
    _fed["inputs"] += 1
    assert_corrupt(seq, frame)


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=300), seq=SEQS)
def test_arbitrary_payload_with_valid_checksum(payload: bytes, seq: int) -> None:
    _fed["inputs"] += 1
    outcome = decode_or_error(seq, frame_of(payload, seq))
    if isinstance(outcome, CorruptRecord):
        assert outcome.seq == seq
        assert f"record {seq} " in str(outcome)
    else:
        assert isinstance(outcome, RECORD_TYPES)


MUTATIONS = st.sampled_from(["drop", "add", "replace", "retag", "version"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=ANY_RECORD, how=MUTATIONS, data=st.data(), seq=SEQS)
def test_mutated_records_fail_cleanly_or_decode_exactly(
    record: Record, how: str, data: st.DataObject, seq: int
) -> None:
    """A mutated record either raises CorruptRecord, or decodes without coercing anything."""
    payload = payload_of(record)
    keys = sorted(payload)
    if how == "drop":
        del payload[data.draw(st.sampled_from(keys))]
    elif how == "add":
        payload[data.draw(TEXT)] = data.draw(JSON_VALUES)
    elif how == "replace":
        payload[data.draw(st.sampled_from(keys))] = data.draw(JSON_VALUES)
    elif how == "retag":
        payload["t"] = data.draw(st.sampled_from([c.__name__ for c in RECORD_TYPES]) | TEXT)
    else:
        payload["v"] = data.draw(JSON_VALUES)
    body = json.dumps(payload, ensure_ascii=False).encode()
    back = decode_or_error(seq, frame_of(body, seq))
    if isinstance(back, CorruptRecord):
        assert back.seq == seq
        return
    # It decoded: every value that was in the payload must be there, uncoerced. A field
    # that is absent takes its default (compatible schema evolution), also inside a
    # nested object such as ``usage``: that is the only thing decoding may add.
    again = payload_of(back)
    for key, value in payload.items():
        if key == "v":
            continue
        assert key in again
        _assert_agrees(again[key], value)


def _assert_agrees(decoded: Any, given: Any) -> None:
    if isinstance(given, dict) and given != decoded:
        assert isinstance(decoded, dict)
        # Only an attrs object has defaults to fill in; its nested given values must agree.
        for key, value in given.items():
            assert key in decoded
            _assert_agrees(decoded[key], value)
        return
    assert decoded == given
    assert type(decoded) is type(given) or {type(given), type(decoded)} == {int, float}


_TASK = ToolTaskCreated(
    session_id="s1",
    generation_id="g1",
    call_id="c1",
    tool_name="append_note",
    input={"line": "hello"},
    goal_rev=1,
    at=1.5,
)
_FINISHED = RunFinished(session_id="s", run_id="r", submission_id="u", status="completed", at=1.0)
_DONE = ToolCompleted(session_id="s", call_id="c", output="o", at=1.0)
_CANCEL = CancelRequested(session_id="s", run_id="r", request_id="q", compensable=["c"], at=1.0)
_RAW = "\x00raw\x00"
_SIGNED = {"type": "thinking", "thinking": "t", "signature": "s"}


def _payload(record: Record = _TASK, raw: bytes = b"", drop: str = "", **changes: Any) -> bytes:
    """The JSON payload of ``record`` with fields changed, dropped, or one set to ``raw`` JSON."""
    data = payload_of(record)
    data.update(changes)
    data.pop(drop, None)
    text = json.dumps(data, allow_nan=True).encode()
    return text.replace(json.dumps(_RAW).encode(), raw) if raw else text


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "not JSON", id="deeply-nested-list"),
        pytest.param(
            _payload(input=_RAW, raw=b"[" * 50_000 + b"]" * 50_000),
            "not JSON",
            id="deeply-nested-field",
        ),
        pytest.param(_payload(goal_rev=_RAW, raw=b"9" * 5000), "not JSON", id="giant-integer"),
        pytest.param(_payload(at=float("nan")), "not JSON", id="nan"),
        pytest.param(_payload(at=float("-inf")), "not JSON", id="infinity"),
        pytest.param(b"\xff\xfe\x00", "not JSON", id="not-utf8"),
        pytest.param(b"[1,2]", "not an object", id="array"),
        pytest.param(b'"text"', "not an object", id="string"),
        pytest.param(_payload(t="Nope"), "unknown record type", id="unknown-type"),
        pytest.param(_payload(t=None), "unknown record type", id="null-type"),
        pytest.param(_payload(v=2), "unsupported version", id="future-version"),
        pytest.param(_payload(v="1"), "unsupported version", id="version-as-text"),
        pytest.param(_payload(drop="v"), "unsupported version", id="no-version"),
        pytest.param(_payload(goal_rev="1"), "fields do not match", id="int-as-text"),
        pytest.param(_payload(goal_rev=True), "fields do not match", id="int-as-bool"),
        pytest.param(_payload(goal_rev=1.0), "fields do not match", id="int-as-float"),
        pytest.param(_payload(at="1.5"), "fields do not match", id="float-as-text"),
        pytest.param(_payload(at=False), "fields do not match", id="float-as-bool"),
        pytest.param(_payload(session_id=7), "fields do not match", id="str-as-int"),
        pytest.param(_payload(input=[1]), "fields do not match", id="dict-as-list"),
        pytest.param(_payload(input=[["k", 1]]), "fields do not match", id="dict-as-pairs"),
        pytest.param(_payload(_CANCEL, compensable={}), "fields do not match", id="list-as-dict"),
        pytest.param(
            _payload(_CANCEL, compensable={"c": 1}), "fields do not match", id="list-as-keys"
        ),
        pytest.param(_payload(_CANCEL, compensable="c"), "fields do not match", id="list-as-str"),
        pytest.param(_payload(input={"k": {1: 2}}), "", id="nested-any-is-free-form"),
        pytest.param(_payload(surplus=1), "fields do not match", id="extra-key"),
        pytest.param(_payload(drop="call_id"), "fields do not match", id="missing-field"),
        pytest.param(_payload(_FINISHED, status="done"), "fields do not match", id="bad-literal"),
        pytest.param(_payload(_DONE, is_error=1), "fields do not match", id="bool-as-int"),
        pytest.param(
            _payload(_DONE, t="RunFinished"), "fields do not match", id="fields-of-another-type"
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=[{"thinking": "t", "signature": "s"}]),
            "fields do not match",
            id="thinking-untagged",
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=[{**_SIGNED, "type": "reasoning"}]),
            "fields do not match",
            id="thinking-unknown-tag",
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=[{**_SIGNED, "type": "redacted_thinking"}]),
            "fields do not match",
            id="thinking-fields-of-the-other-kind",
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=[{"type": "thinking", "thinking": "t"}]),
            "fields do not match",
            id="thinking-without-signature",
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=[{**_SIGNED, "signature": 5}]),
            "fields do not match",
            id="thinking-signature-as-int",
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=["t"]), "fields do not match", id="thinking-as-text"
        ),
        pytest.param(
            _payload(_THOUGHTFUL, thinking=_SIGNED), "fields do not match", id="thinking-not-a-list"
        ),
    ],
)
def test_hostile_payloads_are_named_corrupt(payload: bytes, reason: str) -> None:
    if not reason:  # a control: free-form JSON under dict[str, Any] is legitimate
        assert isinstance(decode(41, frame_of(payload, 41)), ToolTaskCreated)
        return
    error = assert_corrupt(41, frame_of(payload, 41))
    assert reason in error.reason


def test_short_frame_and_unknown_format() -> None:
    frame = encode(SessionCreated(session_id="s", at=1.0), 3)
    assert "too short" in assert_corrupt(3, frame[:6]).reason
    assert "unknown frame format" in assert_corrupt(3, b"\x02" + frame[1:]).reason


# -- bit flips and misplaced frames ------------------------------------------------------


def _sample_records() -> list[Record]:
    return [
        SessionCreated(session_id="s1", system="be brief", request_id="r0", at=1.0),
        _TASK,
        GenerationCompleted(
            session_id="s1",
            run_id="r1",
            generation_id="g1",
            text="I will append the note.",
            tool_calls=[ToolCall(call_id="c1", name="append_note", input={"line": "hello"})],
            usage=Usage(input_tokens=120, output_tokens=30),
            at=2.0,
        ),
        ToolCompleted(session_id="s1", call_id="c1", output="appended", at=3.0),
    ]


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[LmdbLog]:
    """A real log holding the sample records (seq 1 is its LogOpened record)."""
    log = LmdbLog(tmp_path / "log")
    log.commit([(_sample_records(), None)])
    yield log
    log.close()


def test_every_single_bit_flip_of_stored_frames_is_detected(stored: LmdbLog) -> None:
    frames = list(stored.scan_frames())
    assert len(frames) == 5
    flips = 0
    for seq, frame in frames:
        decode(seq, frame)  # the untouched frame is fine
        for bit in range(len(frame) * 8):
            damaged = bytearray(frame)
            damaged[bit // 8] ^= 1 << (bit % 8)
            assert_corrupt(seq, bytes(damaged))
            flips += 1
    assert flips == sum(len(f) for _, f in frames) * 8
    _fed["bit_flips"] += flips


def test_frame_under_the_wrong_seq_is_detected(stored: LmdbLog) -> None:
    for seq, frame in stored.scan_frames():
        wrong = {seq ^ (1 << k) for k in range(64)} | {seq + 1, seq - 1, 0, 2**64 - 1}
        for other in sorted(wrong - {seq}):
            assert "checksum" in assert_corrupt(other, frame).reason


def _overwrite(log: LmdbLog, seq: int, frame: bytes) -> None:
    records = log.env.open_db(b"records")
    with log.env.begin(write=True) as txn:
        txn.put(seq.to_bytes(8, "big"), frame, db=records)


def test_flipped_bit_in_the_store_is_reported_by_every_read_path(stored: LmdbLog) -> None:
    seq, frame = list(stored.scan_frames())[3]
    damaged = bytearray(frame)
    damaged[len(frame) // 2] ^= 0x10
    _overwrite(stored, seq, bytes(damaged))
    with pytest.raises(CorruptRecord) as info:
        stored.read_global()
    assert info.value.seq == seq
    with pytest.raises(CorruptRecord) as info:
        stored.read_session("s1")
    assert info.value.seq == seq
    # Records before the damaged one still read (a reader can stop at the damage).
    assert [c.seq for c in stored.read_global(limit=seq - 1)] == list(range(1, seq))


def test_frame_copied_under_another_key_is_detected(stored: LmdbLog) -> None:
    frames = dict(stored.scan_frames())
    _overwrite(stored, 4, frames[3])  # a valid frame, but of record 3
    with pytest.raises(CorruptRecord) as info:
        stored.read_session("s1", after=3)
    assert info.value.seq == 4
    assert "checksum" in info.value.reason


def test_a_float_field_takes_an_integer_only_where_a_float_holds_it_exactly() -> None:
    good = {**payload_of(ToolCompleted(session_id="s", call_id="c", output="o", at=1.0))}
    good["at"] = 2**53
    back = decode(3, frame_of(json.dumps(good).encode(), 3))
    assert isinstance(back, ToolCompleted) and back.at == 2.0**53
    good["at"] = 2**53 + 1  # would be read as 2**53: another number
    with pytest.raises(CorruptRecord, match=r"expected float @ \$\.at"):
        decode(3, frame_of(json.dumps(good).encode(), 3))


# -- the reason of each defect, in words (found unguarded by mutation testing) --------------


def reason_of(frame: bytes, seq: int = 7) -> str:
    with pytest.raises(CorruptRecord) as info:
        decode(seq, frame)
    assert info.value.seq == seq
    return info.value.reason


def test_each_defect_of_a_frame_is_named() -> None:
    header = codec._HEADER
    assert reason_of(b"\x01" * (header + 1)) == f"frame too short ({header + 1} bytes)"
    # The shortest frame that is not too short is an empty object: its defect is its type.
    assert reason_of(frame_of(b"{}", 7)) == "unknown record type None"
    assert reason_of(bytes((9, 1)) + frame_of(b"{}", 7)[2:]) == "unknown frame format 9"
    good = encode(ToolHeartbeat(session_id="s", call_id="c", attempt=1, at=1.0), 7)
    assert reason_of(good, seq=8) == "checksum mismatch", "a frame read under another seq"
    assert reason_of(frame_of(b'{"t":1} x', 7)) == (
        "payload is not JSON: extra data after the object (at character 7)"
    )
    assert reason_of(frame_of(b"[]", 7)) == "payload is not an object"
    assert reason_of(frame_of(b'{"t":"ToolHeartbeat","at":NaN}', 7)) == (
        "payload is not JSON: NaN is not allowed in a record"
    )


# -- the fast parser reads exactly what the standard library reads ----------------------


_STDLIB_JSON = json.JSONDecoder(parse_constant=codec._reject_constant)


def _stdlib_verdict(body: bytes) -> Any:
    """What the standard library alone makes of ``body`` (the rule ``_parse`` keeps)."""
    try:
        text = body.decode()
        data, end = _STDLIB_JSON.raw_decode(text)
    except (ValueError, RecursionError) as exc:
        return type(exc)
    return data if end == len(text) else ValueError


def _parse_verdict(body: bytes) -> Any:
    try:
        return codec._parse(body)
    except (ValueError, RecursionError) as exc:
        return type(exc)


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 and 1.0 are not the same)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(TEXT, JSON_VALUES, max_size=6))
def test_the_fast_parser_reads_every_object_as_the_standard_library_does(
    value: dict[str, Any],
) -> None:
    body = codec._JSON_ENCODER.encode(value).encode()
    assert _same(_parse_verdict(body), _stdlib_verdict(body))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b' {"a":1}', id="space-before"),
        pytest.param(b'{"a":1} ', id="space-after"),
        pytest.param(b'{"a":1}\n', id="newline-after"),
        pytest.param(b'{"a":"\\ud800"}', id="lone-surrogate-escape"),
        pytest.param(b'{"a":' + b"[" * 300 + b"]" * 300 + b"}", id="nested-300"),
        pytest.param(b'{"a":1e400,"b":-1e400}', id="overflowing-floats"),
        pytest.param(b'{"a":1,"a":2.5}', id="duplicate-key"),
        pytest.param(b'{"a":-0,"b":-0.0,"c":1E2}', id="zeros-and-exponents"),
        pytest.param(b'{"a":' + b"7" * 4000 + b"}", id="large-integer"),
        pytest.param(b'{"a":' + b"7" * 5000 + b"}", id="giant-integer"),
        pytest.param(b'{"a":NaN}', id="nan"),
        pytest.param(b'{"a":"\xff"}', id="not-utf8"),
        pytest.param(b'{"a":"\x01"}', id="control-character"),
        pytest.param(b'{"a":1}}', id="extra-brace"),
        pytest.param(b"{}", id="empty"),
    ],
)
def test_the_fast_parser_agrees_where_the_parsers_differ(body: bytes) -> None:
    """jiter skips whitespace around a value, refuses lone surrogate escapes and deep
    nesting the standard library reads: ``_parse`` still reads as the latter."""
    assert _same(_parse_verdict(body), _stdlib_verdict(body))


def test_fields_that_do_not_match_are_each_named() -> None:
    payload = {"t": "ToolHeartbeat", "v": 1, "session_id": 5, "call_id": "c", "attempt": "two"}
    reason = reason_of(frame_of(json.dumps(payload).encode(), 7))
    assert reason == (
        "fields do not match ToolHeartbeat: invalid value for type, expected str @ "
        "$.session_id; invalid value for type, expected int @ $.attempt; required field "
        "missing @ $.at"
    )


def test_a_record_type_decoded_for_the_first_time_gets_its_own_structure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "_STRUCTURE", {})
    beat = ToolHeartbeat(session_id="s", call_id="c", attempt=1, at=1.0)
    assert decode(3, encode(beat, 3)) == beat
    assert decode(4, encode(beat, 4)) == beat, "and the cached one the second time"


def test_the_record_union_is_configured_on_first_use_and_tags_every_record() -> None:
    """``converter`` configures the ``Record`` union when it is first asked for (not at
    import); a hook taken before that keeps working after it, and both tag the record."""
    fresh = codec._make_converter()
    early_out = fresh.get_unstructure_hook(Record)
    early_in = fresh.get_structure_hook(Record)
    finished = RunFinished(
        session_id="s", run_id="r", submission_id="u", status="completed", at=1.0
    )
    data = early_out(finished)
    assert data["t"] == "RunFinished"
    assert early_in(dict(data), Record) == finished
    beat = ToolHeartbeat(session_id="s", call_id="c", attempt=1, at=2.0)
    assert fresh.unstructure(beat, unstructure_as=Record)["t"] == "ToolHeartbeat"
    assert fresh.structure(fresh.unstructure(beat, unstructure_as=Record), Record) == beat
    assert early_out(beat)["t"] == "ToolHeartbeat", "the hook taken first, after configuration"
    with pytest.raises(KeyError):  # no such tag
        fresh.structure({**data, "t": "Nope"}, Record)


def test_each_record_type_gets_its_encoder_on_first_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_ENCODERS", {})
    beat = ToolHeartbeat(session_id="s", call_id="c", attempt=1, at=1.0)
    first = encode(beat, 3)
    assert list(codec._ENCODERS) == [ToolHeartbeat]
    assert encode(beat, 3) == first, "and the cached one the second time"
    assert json.loads(first[codec._HEADER :])["t"] == "ToolHeartbeat"


def test_jiter_parses_what_encode_writes_and_nothing_padded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast parser is the one that reads a stored record (it is there for speed,
    which no other test sees); a body padded with whitespace never reaches it."""
    calls: list[bytes] = []
    real = codec.jiter.from_json

    class Spy:
        @staticmethod
        def from_json(body: bytes, **options: Any) -> Any:
            calls.append(body)
            return real(body, **options)

    monkeypatch.setattr(codec, "jiter", Spy)
    beat = ToolHeartbeat(session_id="s", call_id="c", attempt=1, at=1.0)
    frame = encode(beat, 3)
    assert decode(3, frame) == beat
    assert calls == [frame[codec._HEADER :]]
    calls.clear()
    assert reason_of(frame_of(frame[codec._HEADER :] + b" ", 7)).startswith("payload is not JSON")
    assert reason_of(frame_of(b" " + frame[codec._HEADER :], 7)).startswith("payload is not JSON")
    assert calls == []
