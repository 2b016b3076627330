"""``settle``: the driver of the decisions. Fold a step, advance, until nothing changes.

A session actor commits what ``settle`` returns as one step: e.g. the last tool
result of a turn and the start of the next turn land in one commit. It tracks what
the step's effects will put in flight (a ``View`` grown as it goes), and adds the
``Forget`` effects of the calls the step settles.
"""

from __future__ import annotations

from perdure.actors.decide.advancing import advance
from perdure.actors.decide.verbs import (
    tool_for,
)
from perdure.actors.protocol import (
    NOTHING,
    BackOff,
    CallModel,
    CancelModel,
    CancelTool,
    Effect,
    Env,
    Forget,
    Reconcile,
    RunTool,
    Step,
    StopBackOff,
    Summarize,
    View,
)
from perdure.actors.state import SessionState
from perdure.storage.records import (
    Record,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
)


def settle(
    s: SessionState, env: Env, view: View, first: Step = NOTHING, *, recovering: bool = False
) -> Step:
    """Fold ``first`` into ``s``, then keep advancing until the session is settled.

    Returns everything to commit (``first`` included) as one step: e.g. the last tool
    result and the start of the next model turn land in the same commit. Mutates
    ``s`` by applying the returned records (the caller rolls back by re-folding the
    log if the commit fails). Calls settled by the step get their ``Forget`` effect,
    except those settled by recovery itself (``recovering``): a runner the dead
    process left behind may still be using what the tool kept.
    """
    s.apply_all(first.records)
    total = first
    current = _with_effects(view, first.effects)
    for _ in range(10_000):
        step = advance(s, env, current)
        if not step:
            settled = total.records[len(first.records) :] if recovering else total.records
            return total + _forget(s, env, settled, current.tools)
        s.apply_all(step.records)
        current = _with_effects(current, step.effects)
        total += step
    raise AssertionError(f"session {s.session_id}: advance did not settle")


def _forget(
    s: SessionState, env: Env, records: tuple[Record, ...], running: frozenset[str]
) -> Step:
    """``Forget`` for every executed call that ``records`` settle, once nothing runs it."""
    if not env.limits.forget_settled:
        return NOTHING
    effects: list[Effect] = []
    for record in records:
        if not isinstance(record, ToolCompleted | ToolOutcomeUnknown | ToolCancelled):
            continue
        task = s.tasks[record.call_id]
        tool = tool_for(env.tools, task)
        if task.executing is None or tool is None or tool.forget is None:
            continue
        if record.call_id not in running:
            effects.append(Forget(task.executing, tool))
    return Step((), tuple(effects))


def _with_effects(view: View, effects: tuple[Effect, ...]) -> View:
    """``view`` once ``effects`` are performed: what they put in flight or stop. The same
    ``View`` when there are none (a pass of ``settle`` that only records builds none)."""
    if not effects:
        return view
    models, tools, cancelling = set(view.models), set(view.tools), set(view.cancelling)
    waiting = set(view.waiting)
    for e in effects:
        if isinstance(e, CallModel):
            models.add(e.generation_id)
        elif isinstance(e, Summarize):
            models.add(e.compaction_id)
        elif isinstance(e, RunTool | Reconcile):
            tools.add(e.call_id)
        elif isinstance(e, CancelTool):
            cancelling.add(e.call_id)
        elif isinstance(e, CancelModel):
            models.discard(e.generation_id)
        elif isinstance(e, BackOff):
            waiting.add(e.call_id)
        elif isinstance(e, StopBackOff):
            waiting.discard(e.call_id)
    return View(
        models=frozenset(models),
        tools=frozenset(tools),
        cancelling=frozenset(cancelling),
        waiting=frozenset(waiting),
        draining=view.draining,
        handing_over=view.handing_over,
    )
