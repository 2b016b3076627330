"""perdure: a durable runtime for LLM agents.

Execution state (runs, model turns, tool tasks and their phases, replay policies,
idempotency keys) goes to an append-only log (LMDB, or PostgreSQL shared by several
nodes) before anything depends on it, so a restarted process continues exactly the
work that was pending.
"""

from perdure._runtime import Runtime, StreamStats, open_runtime
from perdure.actors.protocol import Accepted, Done, Forked
from perdure.agents import agent_tool
from perdure.budget import Budget, CompactionPolicy, Price
from perdure.collector import tune_gc
from perdure.errors import (
    NotOwnerRefused,
    PerdureError,
    Refused,
    SessionParkedError,
    SessionRestarting,
    UnknownSession,
)
from perdure.providers.base import Message, ModelReply, ModelRequest, ProviderError
from perdure.storage import (
    CommitUnknown,
    LogBusy,
    LogError,
    LogFenced,
    LogUnavailable,
    SessionFenced,
    StorageFull,
)
from perdure.storage.bus import Event, EventStreamLagged
from perdure.storage.codec import CorruptRecord
from perdure.storage.records import RunFinished
from perdure.stuck import StuckRun, Waiting
from perdure.tools.contract import (
    NeedsAsyncio,
    NeedsHuman,
    OutcomeUnknown,
    Reconciled,
    ReplayPolicy,
    RetryableError,
    RetryPolicy,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolResult,
    tool,
)
from perdure.tools.params import Secret
from perdure.view import (
    GenerationView,
    RunView,
    SessionLookup,
    SessionView,
    SubmissionView,
    TaskView,
)

__version__ = "0.1.0"

__all__ = [
    "Accepted",
    "Budget",
    "CommitUnknown",
    "CompactionPolicy",
    "CorruptRecord",
    "Done",
    "Event",
    "EventStreamLagged",
    "Forked",
    "GenerationView",
    "LogBusy",
    "LogError",
    "LogFenced",
    "LogUnavailable",
    "Message",
    "ModelReply",
    "ModelRequest",
    "NeedsAsyncio",
    "NeedsHuman",
    "NotOwnerRefused",
    "OutcomeUnknown",
    "PerdureError",
    "Price",
    "ProviderError",
    "Reconciled",
    "Refused",
    "ReplayPolicy",
    "RetryPolicy",
    "RetryableError",
    "RunFinished",
    "RunView",
    "Runtime",
    "Secret",
    "SessionFenced",
    "SessionLookup",
    "SessionParkedError",
    "SessionRestarting",
    "SessionView",
    "StorageFull",
    "StreamStats",
    "StuckRun",
    "SubmissionView",
    "TaskView",
    "Tool",
    "ToolContext",
    "ToolDefinitionError",
    "ToolResult",
    "UnknownSession",
    "Waiting",
    "agent_tool",
    "open_runtime",
    "tool",
    "tune_gc",
]
