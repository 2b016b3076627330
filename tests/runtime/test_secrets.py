"""A tool parameter declared secret: the tool gets the value and the log keeps it, but
no view that leaves the log shows it (export, trace file, event stream, the page's
summary, ``perdure show``, JSON logs)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Annotated

import trio
from click.testing import CliRunner
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import perdure
from perdure.cli import main
from perdure.observability.logs import JsonFormatter
from perdure.observability.tracing import Tracing
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.retention import export_lines
from perdure.server.streams import sse_frame
from perdure.storage.bus import Event
from perdure.storage.records import GenerationCompleted, ToolExecuting, ToolTaskCreated
from perdure.storage.redact import MASK

TOKEN = "tok-8f3a-DO-NOT-SHOW"
received: list[str] = []


@perdure.tool(replay=perdure.ReplayPolicy.KEYED)
async def login(ctx: perdure.ToolContext, user: str, token: Annotated[str, perdure.Secret]) -> str:
    """Log in to the ticket system."""
    received.append(token)
    return f"logged in as {user}"


def test_a_tool_knows_which_of_its_parameters_are_secret() -> None:
    assert login.secret_params == {"token"}
    assert login.input_schema["properties"]["token"]["type"] == "string"
    assert not login.validate({"user": "ann", "token": "x"})


async def test_a_secret_argument_appears_in_no_view_that_leaves_the_log(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    trace_file = tmp_path / "spans.jsonl"
    spans = open(trace_file, "a", buffering=1)  # noqa: SIM115, ASYNC230 - closed below; test setup
    provider = TracerProvider()
    exporter = ConsoleSpanExporter(out=spans, formatter=lambda s: s.to_json(indent=None) + "\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider, batch_delay=0, capture_content=True)
    json_logs = io.StringIO()
    handler = logging.StreamHandler(json_logs)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("perdure")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    script = ScriptedProvider(
        [
            Reply(
                text="logging in",
                tool_uses=[ToolUse("login", {"user": "ann", "token": TOKEN})],
            ),
            Reply(text="done"),
        ]
    )
    try:
        async with perdure.open_runtime(
            log_dir, provider=script, tools=[login], telemetry=tracing
        ) as rt:
            await rt.create_session("s")
            await rt.submit("s", "log in", request_id="r1")
            with trio.fail_after(20):
                await rt.wait_idle("s")
            committed = await rt._journal.read_session("s")
            page = json.dumps(await rt.summary("s"))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        provider.shutdown()
        spans.close()

    # The tool got the value, and the log holds it (a recovery runs the call with it).
    assert received == [TOKEN]
    records = [c.record for c in committed]
    (executing,) = [r for r in records if isinstance(r, ToolExecuting)]
    assert executing.args["token"] == TOKEN and executing.secret == ["token"]
    (created,) = [r for r in records if isinstance(r, ToolTaskCreated)]
    assert created.secret == ["token"]
    reply = next(r for r in records if isinstance(r, GenerationCompleted) and r.tool_calls)
    assert reply.tool_calls[0].secret == ["token"]

    export = "\n".join(export_lines("s", committed))
    stream = b"".join(
        sse_frame(Event("s", type(c.record).__name__, seq=c.seq, record=c.record))
        for c in committed
    ).decode()
    trace = trace_file.read_text()
    runner = CliRunner()
    shown = runner.invoke(main, ["show", "s", "--log", str(log_dir)])
    shown_json = runner.invoke(main, ["show", "s", "--json", "--log", str(log_dir)])
    exported = runner.invoke(main, ["export", "s", "--log", str(log_dir)])
    assert shown.exit_code == shown_json.exit_code == exported.exit_code == 0
    views = {
        "export": export,
        "perdure export": exported.output,
        "event stream": stream,
        "trace file": trace,
        "page": page,
        "perdure show": shown.output,
        "perdure show --json": shown_json.output,
        "JSON logs": json_logs.getvalue(),
    }
    for name, text in views.items():
        assert TOKEN not in text, f"the secret leaks into the {name}"
    # Each view did carry the call (so the check above looked at something).
    for name in ("export", "perdure export", "event stream", "trace file", "page"):
        assert MASK in views[name] and "ann" in views[name], name
    assert "login(" in shown.output and MASK in shown.output
    # (perdure's log lines carry ids, never a call's arguments: the JSON logs check above
    # guards that it stays so.)
