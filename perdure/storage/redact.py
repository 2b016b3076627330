"""Records as they may leave the log: the values of secret tool parameters masked.

A tool declares a parameter secret (``Annotated[str, perdure.Secret]``); the core
records the names of such parameters beside each call's arguments (``ToolCall``,
``ToolTaskCreated``, ``ToolExecuting``). The log keeps the values (a recovery must run
the call with them); every view built for someone else (exports, traces, event
streams, the page, ``perdure show``) passes each record through ``redacted`` first.
"""

from __future__ import annotations

from typing import Any

from attrs import evolve

from perdure.storage.records import (
    GenerationCompleted,
    Record,
    ToolCall,
    ToolExecuting,
    ToolTaskCreated,
)

MASK = "[secret]"


def masked(values: dict[str, Any], secret: list[str]) -> dict[str, Any]:
    """``values`` with each secret parameter's value replaced by ``MASK``."""
    if not secret:
        return values
    return {k: MASK if k in secret else v for k, v in values.items()}


def _call(call: ToolCall) -> ToolCall:
    return evolve(call, input=masked(call.input, call.secret)) if call.secret else call


def redacted(record: Record) -> Record:
    """The record with the values of its secret tool parameters masked (the record
    itself if it holds none)."""
    if isinstance(record, GenerationCompleted) and any(c.secret for c in record.tool_calls):
        return evolve(record, tool_calls=[_call(c) for c in record.tool_calls])
    if isinstance(record, ToolTaskCreated) and record.secret:
        return evolve(record, input=masked(record.input, record.secret))
    if isinstance(record, ToolExecuting) and record.secret:
        return evolve(record, args=masked(record.args, record.secret))
    return record
