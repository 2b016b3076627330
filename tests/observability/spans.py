"""Spans of a child process, written to a file by the OpenTelemetry SDK as each one ends.

A process killed with SIGKILL loses whatever a batch processor still holds; the
SDK's simple processor exports every span as it ends, and its console exporter
writes one JSON object per line to the file given (flushed on each export), so a
test reads back exactly what the dead process had finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from perdure.observability.tracing import Tracing


def file_tracing(path: str) -> Tracing:
    out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    )
    # Each span handed to the SDK as its record commits: a killed process has exported
    # everything it finished (with the default batching, up to ``batch_delay`` of it is lost).
    return Tracing(tracer_provider=provider, batch_delay=0)


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
