"""The migration path of the record format: an older shape decodes by an explicit step only.

No record type has a second version yet, so these tests give ``decode`` a
synthetic present: ``ToolHeartbeat`` at version 2, whose version 1 (the shape
tested here) stored a text ``progress`` where today's class has ``details``.

* a stored version-1 heartbeat decodes into today's class through its registered
  step, and a chain of steps runs in order;
* without a step, or with a version newer than the build, or with a step that
  cannot read the payload, decoding raises ``CorruptRecord`` saying which;
* the same old shape under today's real registry is refused, never read as if it
  were today's (the old field is not silently dropped);
* a registry with a step for an unknown type or a version that does not lead to
  the present is refused, and so is ``@migration`` for a version in force.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from perdure.storage import codec
from perdure.storage.codec import CorruptRecord, check_migrations, decode, migration
from perdure.storage.records import RECORD_VERSIONS, ToolHeartbeat

SEQ = 41
PRESENT = {**RECORD_VERSIONS, "ToolHeartbeat": 2}
OLD = {"session_id": "s", "call_id": "c1", "attempt": 2, "progress": "page 7", "at": 5.0}


def frame(payload: dict[str, Any], seq: int = SEQ) -> bytes:
    """A well-formed frame (header, checksum) around ``payload``, as an old build wrote it."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    crc = zlib.crc32(body, zlib.crc32(seq.to_bytes(8, "big")))
    return bytes((codec.FRAME_FORMAT,)) + crc.to_bytes(4, "big") + body


def progress_to_details(fields: dict[str, Any]) -> dict[str, Any]:
    """ToolHeartbeat 1 -> 2: the text ``progress`` became the JSON value ``details``."""
    fields = dict(fields)
    fields["details"] = {"progress": fields.pop("progress")}
    return fields


STEPS = {("ToolHeartbeat", 1): progress_to_details}


def test_an_older_shape_decodes_into_todays_class_by_its_step() -> None:
    record = decode(
        SEQ, frame({"t": "ToolHeartbeat", "v": 1, **OLD}), versions=PRESENT, migrations=STEPS
    )
    assert record == ToolHeartbeat(
        session_id="s", call_id="c1", attempt=2, details={"progress": "page 7"}, at=5.0
    )
    # Today's shape under the same registry needs no step.
    now = {"t": "ToolHeartbeat", "v": 2, **progress_to_details(OLD)}
    assert decode(SEQ, frame(now), versions=PRESENT, migrations=STEPS) == record


def test_steps_run_in_order_from_the_stored_version() -> None:
    def rename_call(fields: dict[str, Any]) -> dict[str, Any]:  # 1 -> 2: "call" was "call_id"
        fields = dict(fields)
        fields["call_id"] = fields.pop("call")
        return fields

    present = {**RECORD_VERSIONS, "ToolHeartbeat": 3}
    steps = {("ToolHeartbeat", 1): rename_call, ("ToolHeartbeat", 2): progress_to_details}
    check_migrations(steps, present)
    oldest = {**OLD, "call": OLD["call_id"]}
    del oldest["call_id"]
    record = decode(
        SEQ, frame({"t": "ToolHeartbeat", "v": 1, **oldest}), versions=present, migrations=steps
    )
    middle = decode(
        SEQ, frame({"t": "ToolHeartbeat", "v": 2, **OLD}), versions=present, migrations=steps
    )
    assert record == middle
    assert isinstance(record, ToolHeartbeat) and record.details == {"progress": "page 7"}


@pytest.mark.parametrize(
    ("version", "steps", "reason"),
    [
        (1, {}, "unsupported version 1 of ToolHeartbeat: no migration from it"),
        (3, STEPS, "unsupported version 3 of ToolHeartbeat: written by a newer build"),
        (0, STEPS, "unsupported version 0 of ToolHeartbeat"),
        (True, STEPS, "unsupported version True of ToolHeartbeat"),
    ],
)
def test_an_older_shape_without_a_step_is_a_clear_error(
    version: Any, steps: dict[tuple[str, int], Any], reason: str
) -> None:
    with pytest.raises(CorruptRecord, match=f"record {SEQ} .*{reason}"):
        decode(
            SEQ,
            frame({"t": "ToolHeartbeat", "v": version, **OLD}),
            versions=PRESENT,
            migrations=steps,
        )


def test_a_step_that_cannot_read_the_payload_is_named() -> None:
    broken = {k: v for k, v in OLD.items() if k != "progress"}
    with pytest.raises(CorruptRecord, match="migration of ToolHeartbeat from version 1 failed"):
        decode(
            SEQ, frame({"t": "ToolHeartbeat", "v": 1, **broken}), versions=PRESENT, migrations=STEPS
        )
    # A step whose output is not today's shape is caught by today's strict structuring.
    wrong = {("ToolHeartbeat", 1): lambda fields: fields}
    with pytest.raises(CorruptRecord, match="fields do not match ToolHeartbeat"):
        decode(
            SEQ, frame({"t": "ToolHeartbeat", "v": 1, **OLD}), versions=PRESENT, migrations=wrong
        )


def test_todays_registry_never_reads_the_old_shape_by_accident() -> None:
    assert RECORD_VERSIONS["ToolHeartbeat"] == 1
    with pytest.raises(CorruptRecord, match="fields do not match ToolHeartbeat"):
        decode(SEQ, frame({"t": "ToolHeartbeat", "v": 1, **OLD}))  # "progress" is unknown


def test_a_registry_that_does_not_lead_to_the_present_is_refused() -> None:
    with pytest.raises(ValueError, match="no record type of that name"):
        check_migrations({("Heartbeat", 1): progress_to_details}, PRESENT)
    with pytest.raises(ValueError, match="a step must start at 1 to 1"):
        check_migrations({("ToolHeartbeat", 2): progress_to_details}, PRESENT)
    with pytest.raises(ValueError, match="a step must start at 1 to 1"):
        check_migrations({("ToolHeartbeat", 0): progress_to_details}, PRESENT)
    with pytest.raises(ValueError, match="the current version is 1"):
        migration("ToolHeartbeat", 1)(progress_to_details)  # version 1 is in force today
    assert codec.MIGRATIONS == {}


def test_a_step_reads_the_fields_alone_and_a_failing_one_names_the_seq() -> None:
    seen: list[dict[str, Any]] = []

    def watching(fields: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(fields))
        return progress_to_details(fields)

    steps = {("ToolHeartbeat", 1): watching}
    decode(SEQ, frame({"t": "ToolHeartbeat", "v": 1, **OLD}), versions=PRESENT, migrations=steps)
    assert seen == [OLD], "a step never sees the tag nor the version"
    broken = {k: v for k, v in OLD.items() if k != "progress"}
    with pytest.raises(CorruptRecord) as info:
        decode(
            SEQ, frame({"t": "ToolHeartbeat", "v": 1, **broken}), versions=PRESENT, migrations=STEPS
        )
    assert info.value.seq == SEQ
