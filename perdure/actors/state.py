"""A session's state: a pure fold over its records (``state = reduce(apply, records)``).

Nothing here performs I/O, reads a clock or knows about trio or LMDB. The same
fold runs when a session actor starts after a crash and after every commit while
it runs, so the state a restarted process rebuilds is exactly the state the dead
one had when its last record became durable.

The state is the core's own, shaped for its decisions; nothing outside the runtime is
handed it. What the edges read is built from it by ``perdure.actors.readmodel``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attrs import define, field

from perdure.actors.entities import (
    NO_USAGE,
    AssistantTurn,
    Compacting,
    Compensation,
    ConversationItem,
    Generation,
    Note,
    RequestSeen,
    Revision,
    Run,
    Submission,
    Task,
    ToolResultRecord,
    UserTurn,
)
from perdure.actors.lifecycle import (
    ImpossibleTransition,
    generation_moves,
    task_moves,
)
from perdure.actors.requests import answered
from perdure.storage.records import (
    AgentStarted,
    ApprovalDecided,
    Budget,
    CancelRequested,
    Committed,
    CompactionAbandoned,
    CompactionPolicy,
    CompactionRetryPending,
    CompactionStarted,
    CompensationFinished,
    CompensationRequested,
    ContextCompacted,
    GenerationCompleted,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    LogOpened,
    Record,
    RecoveryDecision,
    ResolutionDecided,
    RetryPending,
    RunFinished,
    RunStarted,
    SessionCreated,
    SessionDeleted,
    SessionForked,
    SessionParked,
    SessionPaused,
    SessionResumed,
    ToolAwaitingApproval,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolRetryPending,
    ToolTaskCreated,
    Usage,
    WorkspaceCheckpointed,
    WorkspaceRestored,
    WorkspaceRestoreStarted,
)


@define
class SessionState:
    """One session as its records left it: what the decisions read (the edges read
    ``perdure.actors.readmodel``'s answers instead)."""

    session_id: str
    created: bool = False
    system: str | None = None
    if_busy: str | None = None  # the session's default for input while a run is busy
    forked: SessionForked | None = None  # this session's own lineage (the first fork record)
    parent: str | None = None  # a sub-agent's parent call ("session/call_id")
    allowed_tools: frozenset[str] | None = None  # None: every tool of the runtime
    goal_rev: int = 0
    revisions: list[GoalRevised] = field(factory=list)
    submissions: dict[str, Submission] = field(factory=dict)
    queue: list[str] = field(factory=list)
    run: Run | None = None
    runs: dict[str, Run] = field(factory=dict)
    generations: dict[str, Generation] = field(factory=dict)
    tasks: dict[str, Task] = field(factory=dict)
    conversation: list[ConversationItem] = field(factory=list)
    requests: dict[str, RequestSeen] = field(factory=dict)
    decisions: list[RecoveryDecision] = field(factory=list)
    # The unfinished compensations, by compensation id, in request order. A finished one
    # leaves (its call's ``compensated_by`` and the conversation's note keep its trace):
    # every advance and idle check asks for these, and must not walk the history.
    compensations: dict[str, Compensation] = field(factory=dict)
    usage: Usage = NO_USAGE  # frozen: one shared zero
    spend: dict[str, Usage] = field(factory=dict)  # usage by model, for budgets
    budget: Budget | None = None  # the last budget given to this session (None: the default)
    paused: bool = False
    parked: str | None = None
    last_outcome: RunFinished | None = None
    last_seq: int = 0
    # Context compaction. The model sees ``summary`` in place of the conversation items
    # it covers (``[0, summary.end)``); the log and ``conversation`` keep them all.
    compaction: CompactionPolicy | None = None  # the session's own policy (None: runtime's)
    summary: ContextCompacted | None = None
    compactions: list[ContextCompacted] = field(factory=list)  # every one, in order
    compacting: Compacting | None = None
    compactions_started: int = 0  # numbers the next compaction's id
    abandoned: CompactionAbandoned | None = None  # the last compaction that made nothing
    abandoned_at: int = 0  # the conversation's length when it was abandoned
    # Calls inside the summary whose outcome is unknown: stated to the model after the
    # summary, whatever their age (found when the summary is folded; terminal, so fixed).
    summary_unknown: tuple[str, ...] = ()
    # The input tokens the latest reply reported (input + cache reads and writes), and
    # the model that answered; 0 once a compaction changed what the model is sent.
    last_input_tokens: int = 0
    last_model: str = ""
    # Workspace history: each workspace call's checkpoints, in order, and a rewind of
    # the files under way (its restore is performed again after a crash).
    checkpoints: list[WorkspaceCheckpointed] = field(factory=list)
    restoring: WorkspaceRestoreStarted | None = None
    restores: dict[str, WorkspaceRestored] = field(factory=dict)  # by request id

    # -- queries ----------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No run in progress, no input waiting, no compensation, rewind or compaction
        unfinished."""
        return (
            self.run is None
            and not self.queue
            and not self.compensations
            and self.restoring is None
            and self.compacting is None
        )

    @property
    def compacted_end(self) -> int:
        """The conversation items the current summary stands for: ``[0, compacted_end)``."""
        return self.summary.end if self.summary is not None else 0

    def open_compensations(self) -> list[Task]:
        return [self.tasks[c.compensation_id] for c in self.compensations.values()]

    def current_generation(self) -> Generation | None:
        if self.run is None:
            return None
        gens = self.submissions[self.run.submission_id].generations
        return self.generations[gens[-1]] if gens else None

    def tasks_of(self, generation: Generation) -> list[Task]:
        return [self.tasks[c] for c in generation.call_ids]

    def pinned_calls(self) -> list[Task]:
        """Calls not finished that are pinned to a tool version: each will finish (a
        re-run, a reconcile, a retry, a compensation) on its ``pinned_version`` while
        that version is registered. ``perdure tools --log`` lists them, so that an
        operator knows when an older version may be removed."""
        return [t for t in self.tasks.values() if not t.terminal and t.pinned_version is not None]

    def open_tasks(self) -> list[Task]:
        """Tasks of the current run that are not terminal yet."""
        gen = self.current_generation()
        return [] if gen is None else [t for t in self.tasks_of(gen) if not t.terminal]

    # -- the fold ---------------------------------------------------------------------

    @classmethod
    def fold(cls, session_id: str, committed: Iterable[Committed]) -> SessionState:
        state = cls(session_id)
        for c in committed:
            state.apply(c.record)
            state.note_committed(c)
        return state

    def apply_all(self, records: Iterable[Record]) -> None:
        for record in records:
            self.apply(record)

    def apply(self, record: Record) -> None:
        """Advance the state by one record. Deterministic; every record type has a handler.

        A record type without one is a bug (a new record the fold was not taught), not
        something to skip: skipping would rebuild a state the dead process never had.
        """
        handler = _HANDLERS.get(type(record))
        if handler is None:
            raise TypeError(f"session {self.session_id}: no fold for {type(record).__name__}")
        handler(self, record)

    def note_committed(self, c: Committed) -> None:
        """Bookkeeping that needs the sequence number (known only after the commit)."""
        self.last_seq = c.seq
        record = c.record
        if isinstance(record, InputAccepted):
            self.submissions[record.submission_id].seq = c.seq
        elif isinstance(record, RunStarted) and record.traceparent:
            # An observer stamps the run's trace context on the record after the fold
            # took the unstamped one: the live state must read as the log does.
            self.runs[record.run_id].traceparent = record.traceparent
        request_id = getattr(record, "request_id", None)
        if request_id and request_id in self.requests and not self.requests[request_id].seq:
            self.requests[request_id].seq = c.seq

    def _answer(self, r: Any) -> None:
        """Keep what the caller's command behind ``r`` did, under its request id, to answer
        a retry of it (``perdure.actors.requests`` reads the record as its command)."""
        seen = answered(r, self.run)
        if seen is not None:
            self.requests[r.request_id] = seen

    # -- transitions: every phase change is a row of perdure.actors.lifecycle ----------

    def _move_task(self, call_id: str, event: str) -> Task:
        task = self.tasks[call_id]
        task.phase = task_moves(self.session_id, call_id, task.phase, event)
        return task

    def _move_generation(self, generation_id: str, event: str) -> Generation:
        gen = self.generations[generation_id]
        gen.phase = generation_moves(self.session_id, generation_id, gen.phase, event)
        return gen

    # -- handlers (one per record type) ------------------------------------------------

    def _session_created(self, r: SessionCreated) -> None:
        self.created = True
        self.system = r.system
        self.budget = r.budget
        self.if_busy = r.if_busy
        self.parent = r.parent
        self.allowed_tools = None if r.tools is None else frozenset(r.tools)
        self.compaction = r.compaction

    def _session_forked(self, r: SessionForked) -> None:
        if self.forked is None:  # copies of the source's own lineage come later
            self.forked = r

    def _input_accepted(self, r: InputAccepted) -> None:
        self.submissions[r.submission_id] = Submission(
            r.submission_id, r.request_id, r.text, r.body_hash, r.at, traceparent=r.traceparent
        )
        if r.interrupts is None:
            self.queue.append(r.submission_id)
        else:  # it interrupted the run: it runs next, ahead of the inputs waiting
            self.queue.insert(0, r.submission_id)
        if r.budget is not None:
            self.budget = r.budget
        self._answer(r)

    def _run_started(self, r: RunStarted) -> None:
        run = Run(r.run_id, r.submission_id, r.goal_rev, r.resume_attempt, r.resumed_from, r.at)
        run.traceparent = r.traceparent
        self.run = self.runs[r.run_id] = run
        sub = self.submissions[r.submission_id]
        sub.runs.append(r.run_id)
        if r.submission_id in self.queue:
            self.queue.remove(r.submission_id)
        if r.resumed_from is None:
            self.conversation.append(UserTurn(r.submission_id))

    def _run_finished(self, r: RunFinished) -> None:
        run = self.runs.get(r.run_id)
        if run is not None:
            run.finished = r
            gen = self.current_generation() if self.run is run else None
            self._spend(run, gen.model if gen is not None else "", r.usage)
        else:
            self.usage = self.usage + r.usage
        if self.run is not None and self.run.run_id == r.run_id:
            self.run = None
        if r.status == "interrupted":
            return
        self.submissions[r.submission_id].outcome = r
        self.last_outcome = r
        if r.status == "cancelled":
            self.conversation.append(Note("[The user cancelled the request above.]"))
        elif r.status == "failed":
            self.conversation.append(Note(f"[The request above failed: {r.reason}]"))
        elif r.status == "stopped":
            self.conversation.append(Note(f"[The request above was stopped: {r.reason}]"))

    def _generation_started(self, r: GenerationStarted) -> None:
        run = self.runs[r.run_id]
        before = self.generations.get(r.generation_id)
        generation_moves(
            self.session_id,
            r.generation_id,
            None if before is None else before.phase,
            "GenerationStarted",
        )
        gen = Generation(r.generation_id, r.run_id, run.submission_id, r.goal_rev)
        self.generations[r.generation_id] = gen
        self.submissions[run.submission_id].generations.append(r.generation_id)

    def _retry_pending(self, r: RetryPending) -> None:
        gen = self._move_generation(r.generation_id, "RetryPending")
        gen.attempt = r.attempt + 1
        gen.not_before = r.not_before
        gen.last_error = r.error
        gen.model = r.model or gen.model
        gen.failures = (*gen.failures, r)
        self._add_usage(gen, r.usage)

    def _generation_completed(self, r: GenerationCompleted) -> None:
        gen = self._move_generation(r.generation_id, "GenerationCompleted")
        gen.attempt = r.attempt
        gen.reply = r
        gen.call_ids = tuple(c.call_id for c in r.tool_calls)
        gen.model = r.model or gen.model
        self._add_usage(gen, r.usage)
        self.conversation.append(AssistantTurn(r.generation_id))
        u = r.usage
        self.last_input_tokens = (
            u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        )
        self.last_model = gen.model
        if self.run is not None:
            self.run.progressed = True

    def _add_usage(self, gen: Generation, usage: Usage) -> None:
        # A generation's first usage is the reply's own object (frozen): not a copy.
        gen.usage = usage if gen.usage == NO_USAGE else gen.usage + usage
        run = self.runs.get(gen.run_id)
        if run is not None:
            self._spend(run, gen.model, usage)
        else:
            self.usage = self.usage + usage

    def _spend(self, run: Run, model: str, usage: Usage) -> None:
        """Count ``usage`` for the run and the session, in total and by model."""
        run.usage = run.usage + usage
        self.usage = self.usage + usage
        run.spend[model] = run.spend.get(model, NO_USAGE) + usage
        self.spend[model] = self.spend.get(model, NO_USAGE) + usage

    def _tool_task_created(self, r: ToolTaskCreated) -> None:
        before = self.tasks.get(r.call_id)
        task_moves(
            self.session_id, r.call_id, None if before is None else before.phase, "ToolTaskCreated"
        )
        gen = self.generations.get(r.generation_id)
        self.tasks[r.call_id] = Task(
            r.call_id,
            r.generation_id,
            r.tool_name,
            r.input,
            r.goal_rev,
            lineage=gen.submission_id if gen is not None else "compensation",
            compensates=r.compensates,
            secret=r.secret,
            rerun_of=r.rerun_of,
        )
        original = self.tasks.get(r.rerun_of) if r.rerun_of is not None else None
        if original is not None:
            # Run again beside the calls of its turn, so that the turn (and the
            # revision) waits for it and recovery finds it among the open calls.
            original.reruns[r.goal_rev] = r.call_id
            if gen is not None:
                gen.call_ids = (*gen.call_ids, r.call_id)
        if r.compensates is not None and r.compensates in self.tasks:
            self.tasks[r.call_id].pinned_version = self.tasks[r.compensates].pinned_version

    def _tool_awaiting_approval(self, r: ToolAwaitingApproval) -> None:
        self._move_task(r.call_id, "ToolAwaitingApproval")

    def _approval_decided(self, r: ApprovalDecided) -> None:
        choice = "approved" if r.approved else "denied"
        self._move_task(r.call_id, f"ApprovalDecided({choice})")
        self._answer(r)

    def _tool_executing(self, r: ToolExecuting) -> None:
        task = self._move_task(r.call_id, "ToolExecuting")
        task.executing = r
        task.pinned_version = r.tool_version
        task.not_before = None
        task.retry_by_human = False

    def _tool_heartbeat(self, r: ToolHeartbeat) -> None:
        task = self._move_task(r.call_id, "ToolHeartbeat")
        task.last_heartbeat = r
        # Before AgentStarted, a call named its sub-agents in a heartbeat: old logs do.
        named = r.details.get("agents") if isinstance(r.details, dict) else None
        if isinstance(named, list):
            for child in named:
                if isinstance(child, str) and child not in task.children:
                    task.children = (*task.children, child)

    def _agent_started(self, r: AgentStarted) -> None:
        task = self._move_task(r.call_id, "AgentStarted")
        if r.child not in task.children:
            task.children = (*task.children, r.child)

    def _tool_retry_pending(self, r: ToolRetryPending) -> None:
        task = self._move_task(r.call_id, "ToolRetryPending")
        task.last_error = r.error
        task.not_before = r.not_before

    def _tool_awaiting_human(self, r: ToolAwaitingHuman) -> None:
        task = self._move_task(r.call_id, "ToolAwaitingHuman")
        task.last_error = r.reason
        task.unknown_outcome = r.unknown_outcome

    def _resolution_decided(self, r: ResolutionDecided) -> None:
        task = self._move_task(r.call_id, f"ResolutionDecided({r.action})")
        if r.action == "retry":  # skip and fail: the result record follows in the same commit
            task.not_before = r.at
            task.retry_by_human = True
        self._answer(r)

    def _tool_result(self, r: ToolResultRecord) -> None:
        task = self._move_task(r.call_id, type(r).__name__)
        task.result = r
        task.stale = task.goal_rev < self.goal_rev
        if isinstance(r, ToolCompleted) and self.run is not None:
            self.run.progressed = True

    def _cancel_requested(self, r: CancelRequested) -> None:
        run = self.runs.get(r.run_id)
        if run is not None:
            run.cancel_requested = True
        self._answer(r)

    def _goal_revised(self, r: GoalRevised) -> None:
        open_calls = [t.call_id for t in self.open_tasks()]
        earlier = self._results_of_the_request()
        self.goal_rev = r.goal_rev
        self.revisions.append(r)
        self.conversation.append(Revision(r.goal_rev, r.text, open_calls, earlier))
        if r.budget is not None:
            self.budget = r.budget
        self._answer(r)  # a submit steered into the running request, or a revision

    def _results_of_the_request(self) -> list[str]:
        """The calls of the running request that have their result, in call order."""
        if self.run is None:
            return []
        sub = self.submissions[self.run.submission_id]
        return [
            c
            for g in sub.generations
            for c in self.generations[g].call_ids
            if self.tasks[c].result is not None
        ]

    def _paused(self, r: SessionPaused) -> None:
        self.paused = True
        self._answer(r)

    def _resumed(self, r: SessionResumed) -> None:
        self.paused = False
        self._answer(r)

    def _compensation_requested(self, r: CompensationRequested) -> None:
        self.compensations[r.compensation_id] = Compensation(
            r.call_id, r.compensation_id, r.automatic
        )
        self.tasks[r.call_id].compensated_by = r.compensation_id
        self._answer(r)

    def _compensation_finished(self, r: CompensationFinished) -> None:
        comp = self.compensations.pop(r.compensation_id)
        task = self.tasks[r.compensation_id]
        original = self.tasks[comp.call_id]
        output = task.result.output if task.result is not None else ""
        self.conversation.append(
            Note(
                f"[perdure ran the compensation of {original.tool_name} ({comp.call_id})"
                f"{' automatically' if comp.automatic else ' at the user request'}; "
                f"{task.phase}: {output}]"
            )
        )

    # -- context compaction: CompactionStarted -> (CompactionRetryPending ...) ->
    #    ContextCompacted | CompactionAbandoned; one at a time, each range starting where
    #    the last summary ended, so no range is ever summarised twice.

    def _compaction_started(self, r: CompactionStarted) -> None:
        if self.compacting is not None:
            raise ImpossibleTransition(
                self.session_id, r.compaction_id, "compacting", "CompactionStarted"
            )
        if not self.compacted_end <= r.start < r.end <= len(self.conversation) or (
            r.start != self.compacted_end
        ):
            raise ValueError(
                f"session {self.session_id}: compaction {r.compaction_id} covers items "
                f"[{r.start}, {r.end}), but the summary ends at {self.compacted_end} and the "
                f"conversation has {len(self.conversation)} items"
            )
        self.compacting = Compacting(r)
        self.compactions_started += 1
        self._answer(r)  # an on-demand compaction's (one the core started answers none)

    def _pending_compaction(self, compaction_id: str, event: str) -> Compacting:
        pending = self.compacting
        if pending is None or pending.started.compaction_id != compaction_id:
            phase = None if pending is None else "compacting " + pending.started.compaction_id
            raise ImpossibleTransition(self.session_id, compaction_id, phase, event)
        return pending

    def _compaction_usage(self, pending: Compacting, model: str, usage: Usage) -> None:
        run = self.runs.get(pending.started.run_id)
        if run is not None:
            self._spend(run, model, usage)
        else:
            self.usage = self.usage + usage
            self.spend[model] = self.spend.get(model, NO_USAGE) + usage

    def _compaction_retry_pending(self, r: CompactionRetryPending) -> None:
        pending = self._pending_compaction(r.compaction_id, "CompactionRetryPending")
        pending.attempt = r.attempt + 1
        pending.not_before = r.not_before
        pending.last_error = r.error
        pending.failures = (*pending.failures, r)
        self._compaction_usage(pending, r.model, r.usage)

    def _context_compacted(self, r: ContextCompacted) -> None:
        pending = self._pending_compaction(r.compaction_id, "ContextCompacted")
        started = pending.started
        if (r.start, r.end) != (started.start, started.end):
            raise ValueError(
                f"session {self.session_id}: compaction {r.compaction_id} was started for "
                f"items [{started.start}, {started.end}), not [{r.start}, {r.end})"
            )
        self._compaction_usage(pending, r.model, r.usage)
        unknown = [
            call_id
            for item in self.conversation[started.start : started.end]
            if isinstance(item, AssistantTurn)
            for call_id in self.generations[item.generation_id].call_ids
            if self.tasks[call_id].phase == "outcome_unknown"
        ]
        self.summary_unknown = (*self.summary_unknown, *unknown)
        self.summary = r
        self.compactions.append(r)
        self.compacting = None
        self.last_input_tokens = 0  # what the model is sent changed: the next reply tells

    def _compaction_abandoned(self, r: CompactionAbandoned) -> None:
        pending = self._pending_compaction(r.compaction_id, "CompactionAbandoned")
        self._compaction_usage(pending, r.model, r.usage)
        self.abandoned = r
        self.abandoned_at = len(self.conversation)
        self.compacting = None

    def _checkpointed(self, r: WorkspaceCheckpointed) -> None:
        self.checkpoints.append(r)

    def _restore_started(self, r: WorkspaceRestoreStarted) -> None:
        self.restoring = r
        self._answer(r)

    def _restored(self, r: WorkspaceRestored) -> None:
        if self.restoring is not None and self.restoring.request_id == r.request_id:
            self.restoring = None
        self.restores[r.request_id] = r

    def _recovery_decision(self, r: RecoveryDecision) -> None:
        self.decisions.append(r)

    def _parked(self, r: SessionParked) -> None:
        self.parked = r.reason

    def _ignore(self, r: Record) -> None:
        pass


_HANDLERS: dict[type, Any] = {
    SessionCreated: SessionState._session_created,
    SessionForked: SessionState._session_forked,
    InputAccepted: SessionState._input_accepted,
    RunStarted: SessionState._run_started,
    RunFinished: SessionState._run_finished,
    GenerationStarted: SessionState._generation_started,
    RetryPending: SessionState._retry_pending,
    GenerationCompleted: SessionState._generation_completed,
    ToolTaskCreated: SessionState._tool_task_created,
    ToolAwaitingApproval: SessionState._tool_awaiting_approval,
    ApprovalDecided: SessionState._approval_decided,
    ToolExecuting: SessionState._tool_executing,
    ToolHeartbeat: SessionState._tool_heartbeat,
    AgentStarted: SessionState._agent_started,
    ToolRetryPending: SessionState._tool_retry_pending,
    ToolAwaitingHuman: SessionState._tool_awaiting_human,
    ResolutionDecided: SessionState._resolution_decided,
    ToolCompleted: SessionState._tool_result,
    ToolOutcomeUnknown: SessionState._tool_result,
    ToolCancelled: SessionState._tool_result,
    CancelRequested: SessionState._cancel_requested,
    GoalRevised: SessionState._goal_revised,
    SessionPaused: SessionState._paused,
    SessionResumed: SessionState._resumed,
    CompactionStarted: SessionState._compaction_started,
    CompactionRetryPending: SessionState._compaction_retry_pending,
    ContextCompacted: SessionState._context_compacted,
    CompactionAbandoned: SessionState._compaction_abandoned,
    RecoveryDecision: SessionState._recovery_decision,
    SessionParked: SessionState._parked,
    CompensationRequested: SessionState._compensation_requested,
    CompensationFinished: SessionState._compensation_finished,
    WorkspaceCheckpointed: SessionState._checkpointed,
    WorkspaceRestoreStarted: SessionState._restore_started,
    WorkspaceRestored: SessionState._restored,
    LogOpened: SessionState._ignore,
    SessionDeleted: SessionState._ignore,
}
