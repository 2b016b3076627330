"""A session's decisions: pure functions from (state, input) to records and effects.

This is the whole protocol of perdure, written without I/O (in the spirit of
h11): the trio shell in ``session.py`` feeds it commands from callers and results
from its generation and tool actors, commits the records it returns, and only then
performs the effects. Recovery is the same code: ``recover`` on the folded state of
a restarted process, followed by the usual ``advance``. The inputs and outputs are
named in ``protocol``; the phases a call and a model turn go through, and which
record moves which phase, in ``lifecycle``.

This module is the face; each door is a module of its own, and each is a table:

* ``advancing`` — ``advance``, what happens next when nothing new has arrived
  (start a run, call the model, dispatch tool tasks, start the next turn, finish the
  run); a tool call's next step is a row of ``ADVANCE``, keyed by its phase;
* ``recovery`` — ``recover``, the recovery table (docs/DESIGN.md §4), for a process
  that finds work a dead process left in flight; a call's row of ``RECOVER``;
* ``results`` — ``on_result``, what a model reply, a model error, a tool result, a
  heartbeat, the end of a back-off or a reconciliation changes (``RESULTS``);
* ``commands`` — ``command``, what a caller's submit, cancel, approve, revise,
  pause, resume, compensate or resolve changes (``COMMANDS``); what a submit does
  while a run is busy is a row of ``IF_BUSY`` (queue, interrupt, reject, steer);
* ``forks`` — ``fork_points`` / ``fork_position`` / ``fork_records`` /
  ``workspace_at`` (the tree a rewind restores): where a
  session's history may be forked (the end of a run or of a turn) and the records of
  the fork;
* ``settling`` — ``settle``, the driver: fold a step, advance, until nothing changes;
* ``verbs`` — what the doors share: the words the model reads, a call's identity
  (idempotency key, fingerprint), the model's back-off, starting a turn, finishing a
  run, committing an ``executing`` record, calling off what a cancel or a revision
  leaves; and which effects may start while their step's commit is in flight
  (``overlapping``, ``overlaps_commit``).

When a tool call fails (``results._tool_finished``), its tool's policy decides: a
transient failure of a SAFE or KEYED tool with a ``RetryPolicy`` becomes
``ToolRetryPending`` (committed before the back-off; ``advance`` dispatches attempt + 1
once it is over, ``advancing._retry``), ``NeedsHuman`` becomes ``ToolAwaitingHuman``
(``commands._resolve`` answers it), anything else a result for the model. A NEVER call
is never retried by these rows: only a reconcile answering ``not_applied`` or a
person's ``retry`` runs it again. An outcome nobody can know (a NEVER call interrupted
or timed out, a reconcile answering ``unknown``) is told to the model as UNKNOWN, or,
when its tool declares ``unknown_outcome="ask_person"``, becomes a ``ToolAwaitingHuman``
for a person to say what happened (``verbs._unknown_or_ask``).

When a revision lands, ``advancing._apply_revision`` calls off what the old request
left, runs the request's goal-dependent results again under the new revision
(``_rerun_for_revision``), and only then starts the next turn.
"""

from __future__ import annotations

from perdure.actors.decide.advancing import ADVANCE, advance
from perdure.actors.decide.commands import COMMANDS, IF_BUSY, command, compensation_id
from perdure.actors.decide.forks import fork_points, fork_position, fork_records, workspace_at
from perdure.actors.decide.recovery import RECOVER, recover
from perdure.actors.decide.results import RESULTS, on_result
from perdure.actors.decide.settling import settle
from perdure.actors.decide.verbs import (
    fingerprint,
    idempotency_key,
    interrupted_text,
    overlapping,
    overlaps_commit,
    registered_for,
    retry_delay,
    tool_for,
    unknown_outcome_text,
)

__all__ = [
    "ADVANCE",
    "COMMANDS",
    "IF_BUSY",
    "RECOVER",
    "RESULTS",
    "advance",
    "command",
    "compensation_id",
    "fingerprint",
    "fork_points",
    "fork_position",
    "fork_records",
    "idempotency_key",
    "interrupted_text",
    "on_result",
    "overlapping",
    "overlaps_commit",
    "recover",
    "registered_for",
    "retry_delay",
    "settle",
    "tool_for",
    "unknown_outcome_text",
    "workspace_at",
]
