"""Hypothesis drives the pure core through random histories with crashes at any point.

Rules: submit (sometimes re-using a request id), model replies with random tool
calls (unknown tools and invalid arguments included), model errors, tool results
of every kind, reconciliations, approvals, revisions, cancellations, pause and
resume, compensations — and crashes: everything in flight is lost (a running
tool's effect may or may not have happened), the state is rebuilt from the kept
records alone, and ``recover`` runs. After every step:

* the live state equals the state folded from the records (what a restart sees);
* the invariants of docs/DESIGN.md hold over the history (the shared history checker),
  including "a NEVER call takes effect at most once" over the effects ledger.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from perdure import errors
from perdure.actors import decide, protocol
from perdure.actors.state import SessionState
from perdure.providers.base import ModelReply
from perdure.settings import Limits
from perdure.storage import codec
from perdure.storage.records import Committed, ToolCall
from tests.core.sim import COURSE_TOOLS
from tests.support.checker import check_history
from tests.support.stats import record_stat

TOOL_CHOICES = [
    ("lookup", {"query": "q"}),
    ("send", {"text": "hi"}),
    ("send_checked", {"text": "hi"}),
    ("deploy", {"target": "prod"}),
    ("create_ticket", {"title": "t"}),
    ("hold_seat", {"seat": "1A"}),
    ("nope", {}),
    ("lookup", {"query": 3}),
]


def projection(s: SessionState) -> dict[str, Any]:
    """What must be identical between the live state and a refold of its records."""
    return {
        "tasks": {c: (t.phase, t.attempt, t.goal_rev) for c, t in s.tasks.items()},
        "generations": {g: (x.phase, x.attempt, x.goal_rev) for g, x in s.generations.items()},
        "run": None if s.run is None else (s.run.run_id, s.run.resume_attempt),
        "queue": list(s.queue),
        "goal_rev": s.goal_rev,
        "paused": s.paused,
        "outcomes": {k: v.outcome.status if v.outcome else None for k, v in s.submissions.items()},
        "compensations": list(s.compensations),  # the unfinished ones, in order
        "conversation": len(s.conversation),
    }


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = SessionState("s1")
        self.log: list[Committed] = []
        self.models: dict[str, int] = {}  # generation id -> attempt in flight
        self.tools: dict[str, tuple[str, int]] = {}  # call id -> (run|reconcile, attempt)
        self.cancelling: set[str] = set()
        self.effects: Counter[str] = Counter()
        self.requests = 0
        self.steps = 0
        self.crashes = 0
        self.env = protocol.Env(tools=COURSE_TOOLS, now=1000.0, limits=Limits(resume_budget=3))
        from perdure.storage.records import SessionCreated

        self._commit(protocol.Step((SessionCreated(session_id="s1", at=0.0),)))

    # -- the shell --------------------------------------------------------------------

    def _view(self) -> protocol.View:
        return protocol.View(
            models=frozenset(self.models),
            tools=frozenset(self.tools),
            cancelling=frozenset(self.cancelling),
        )

    def _commit(self, first: protocol.Step) -> None:
        step = decide.settle(self.state, self.env, self._view(), first)
        for record in step.records:
            seq = len(self.log) + 1
            # A restart reads what the codec gives back: it must be the very record.
            assert codec.decode(seq, codec.encode(record, seq)) == record, record
            c = Committed(seq, record)
            self.log.append(c)
            self.state.note_committed(c)
        for effect in step.effects:
            if isinstance(effect, protocol.CallModel):
                self.models[effect.generation_id] = effect.attempt
            elif isinstance(effect, protocol.RunTool):
                self.tools[effect.call_id] = ("run", effect.executing.attempt)
            elif isinstance(effect, protocol.Reconcile):
                self.tools[effect.call_id] = ("reconcile", effect.executing.attempt)
            elif isinstance(effect, protocol.CancelModel):
                self.models.pop(effect.generation_id, None)
            elif isinstance(effect, protocol.CancelTool):
                self.cancelling.add(effect.call_id)

    def _command(self, cmd: protocol.Command) -> None:
        try:
            first, _ = decide.command(self.state, self.env, cmd)
        except errors.Refused:
            return
        self._commit(first)

    def _result(self, result: protocol.Result) -> None:
        self._commit(decide.on_result(self.state, self.env, result))

    # -- rules ---------------------------------------------------------------------------

    @rule(reuse=st.booleans())
    def submit(self, reuse: bool) -> None:
        if not reuse or not self.requests:
            self.requests += 1
        self._command(protocol.Submit(f"r{self.requests}", f"task {self.requests}"))

    @rule(data=st.data())
    def model_replies(self, data: st.DataObject) -> None:
        if not self.models:
            return
        gen = data.draw(st.sampled_from(sorted(self.models)))
        attempt = self.models.pop(gen)
        picks = data.draw(st.lists(st.sampled_from(TOOL_CHOICES), max_size=3))
        calls = tuple(
            ToolCall(call_id=f"{gen}-{i}", name=n, input=dict(a)) for i, (n, a) in enumerate(picks)
        )
        reply = ModelReply(text=f"reply to {gen}", tool_calls=calls)
        self._result(protocol.ModelReplied(gen, attempt, reply))

    @rule(data=st.data(), retryable=st.booleans())
    def model_fails(self, data: st.DataObject, retryable: bool) -> None:
        if not self.models:
            return
        gen = data.draw(st.sampled_from(sorted(self.models)))
        attempt = self.models.pop(gen)
        self._result(
            protocol.ModelFailed(
                generation_id=gen, attempt=attempt, error="boom", retryable=retryable
            )
        )

    @rule(
        data=st.data(),
        outcome=st.sampled_from(["ok", "error", "timeout", "cancelled"]),
        terminate=st.booleans(),
    )
    def tool_finishes(self, data: st.DataObject, outcome: str, terminate: bool) -> None:
        running = sorted(c for c, (kind, _) in self.tools.items() if kind == "run")
        if not running:
            return
        call = data.draw(st.sampled_from(running))
        _, attempt = self.tools.pop(call)
        self.cancelling.discard(call)
        if outcome != "cancelled" or data.draw(st.booleans()):
            self.effects[call] += 1  # the tool touched the world
        self._result(
            protocol.ToolFinished(
                call_id=call,
                attempt=attempt,
                outcome=outcome,  # type: ignore[arg-type]
                output="out",
                terminate=terminate and outcome == "ok",
            )
        )

    @rule(data=st.data(), status=st.sampled_from(["applied", "not_applied", "unknown"]))
    def reconcile_answers(self, data: st.DataObject, status: str) -> None:
        asking = sorted(c for c, (kind, _) in self.tools.items() if kind == "reconcile")
        if not asking:
            return
        call = data.draw(st.sampled_from(asking))
        self.tools.pop(call)
        # Truthful reconcile: "applied" only if the effect happened, "not_applied" only if not.
        happened = self.effects[call] > 0
        if status == "applied" and not happened:
            status = "not_applied"
        elif status == "not_applied" and happened:
            status = "applied"
        flags = data.draw(st.sampled_from([(False, False), (True, False), (False, True)]))
        self._result(
            protocol.ReconcileFinished(
                call_id=call,
                status=status,  # type: ignore[arg-type]
                output="reconciled",
                is_error=flags[0],
                terminate=flags[1] and status == "applied",
            )
        )

    @rule(data=st.data(), approved=st.booleans())
    def approve(self, data: st.DataObject, approved: bool) -> None:
        waiting = sorted(c for c, t in self.state.tasks.items() if t.phase == "awaiting_approval")
        if not waiting:
            return
        call = data.draw(st.sampled_from(waiting))
        self.requests += 1
        self._command(protocol.Approve(call, approved, f"a{self.requests}"))

    @rule()
    def revise(self) -> None:
        self.requests += 1
        self._command(protocol.Revise(f"v{self.requests}", "new goal"))

    @rule()
    def cancel(self) -> None:
        self.requests += 1
        self._command(protocol.Cancel(f"c{self.requests}"))

    @rule(pause=st.booleans())
    def pause_or_resume(self, pause: bool) -> None:
        self.requests += 1
        cmd = protocol.Pause(f"p{self.requests}") if pause else protocol.Resume(f"u{self.requests}")
        self._command(cmd)

    @rule(data=st.data())
    def compensate(self, data: st.DataObject) -> None:
        done = sorted(c for c, t in self.state.tasks.items() if t.phase == "completed")
        if not done:
            return
        self.requests += 1
        self._command(protocol.Compensate(data.draw(st.sampled_from(done)), f"k{self.requests}"))

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        for call, (kind, _) in sorted(self.tools.items()):
            if kind == "run" and data.draw(st.booleans()):
                self.effects[call] += 1  # died after the effect, before its result
        self.crashes += 1
        self.models.clear()
        self.tools.clear()
        self.cancelling.clear()
        self.state = SessionState.fold("s1", self.log)
        self._commit(decide.recover(self.state, self.env))

    # -- invariants ------------------------------------------------------------------------

    def teardown(self) -> None:
        record_stat("core_fuzz", histories=1, steps=self.steps, crashes=self.crashes)

    @invariant()
    def restart_sees_the_same_state(self) -> None:
        self.steps += 1
        assert projection(SessionState.fold("s1", self.log)) == projection(self.state)

    @invariant()
    def history_is_sound(self) -> None:
        ledger = [
            {"event": "effect", "call_id": c} for c, n in self.effects.items() for _ in range(n)
        ]
        report = check_history(self.log, ledger, settled=False)
        assert report.violations == [], report.violations


TestCore = CoreMachine.TestCase
TestCore.settings = settings(
    max_examples=int(os.environ.get("PERDURE_FUZZ_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
