"""What a session's actor has in flight on this node: its calls, their cancels, its timers.

Every model call, tool attempt, reconcile and workspace restore a session starts runs
under a cancel scope the session owns, and so does every back-off timer. This registry
keeps those scopes by the id the core knows each by, so that a ``CancelTool``,
``CancelModel`` or ``StopBackOff`` finds what to stop, and a late report of something
already stopped is recognised and dropped. Its picture for the core is a
``protocol.View`` (``view``): what runs here, so that ``advance`` neither starts a
call twice nor waits for one that no longer runs. None of it is durable: after a
restart the registry is empty and recovery decides from the log alone.

* ``models``: a generation's (or a compaction's summary's) id → its call's scope. While
  the call still waits out its back-off, its entry is the timer's scope instead
  (``waiting_models`` names those): the core sees the call in flight either way, and a
  cancel stops whichever it is, so a call that was waiting never starts.
* ``tools``: a call's id (or a restore's key) → its attempt's, reconcile's or restore's scope.
* ``waits``: a call's id → the timer of its retry's back-off.
* ``cancelling``: the calls told to stop whose attempt has not reported yet.
* ``held_back``: results the log could not take yet (an outage): a placeholder keeps
  their place among the calls in flight until their commit lands, so nothing is
  issued twice meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from perdure.actors import protocol


def model_key(effect: protocol.CallModel | protocol.Summarize) -> str:
    """The id a model call is known by among the calls in flight."""
    return effect.generation_id if isinstance(effect, protocol.CallModel) else effect.compaction_id


class InFlight:
    """The cancel scopes of one session's calls and timers (see the module's docstring)."""

    def __init__(self) -> None:
        self.models: dict[str, trio.CancelScope] = {}
        self.tools: dict[str, trio.CancelScope] = {}
        self.waits: dict[str, trio.CancelScope] = {}
        self.waiting_models: set[str] = set()
        self.cancelling: set[str] = set()
        self.held_back: set[str] = set()

    def __bool__(self) -> bool:
        """Something runs or waits: a call, a cancel, a timer or a result held back."""
        return bool(self.models or self.tools or self.cancelling or self.waits)

    def view(self, *, draining: bool, handing_over: bool) -> protocol.View:
        return protocol.View(
            models=frozenset(self.models),
            tools=frozenset(self.tools),
            cancelling=frozenset(self.cancelling),
            waiting=frozenset(self.waits),
            draining=draining,
            handing_over=handing_over,
        )

    # -- starting ------------------------------------------------------------------------

    def model_call(self, key: str) -> trio.CancelScope:
        """The scope of a model call that starts now (replacing its timer, if it waited)."""
        self.waiting_models.discard(key)
        scope = self.models[key] = trio.CancelScope()
        return scope

    def model_timer(self, key: str) -> trio.CancelScope:
        """The scope of the timer a model call waits on before it starts."""
        timer = self.models[key] = trio.CancelScope()
        self.waiting_models.add(key)
        return timer

    def model_due(self, key: str, timer: trio.CancelScope) -> bool:
        """A model call's timer went off: whether the call is still to be made (it was
        neither cancelled nor called off while it waited)."""
        return self.models.get(key) is timer

    def tool_call(self, call_id: str) -> trio.CancelScope:
        """The scope of a tool attempt, reconcile or restore that starts now."""
        scope = self.tools[call_id] = trio.CancelScope()
        return scope

    def tool_timer(self, call_id: str) -> trio.CancelScope:
        """The scope of the timer a tool call's retry waits on."""
        timer = self.waits[call_id] = trio.CancelScope()
        return timer

    # -- reports -------------------------------------------------------------------------

    def model_reported(self, key: str) -> bool:
        """A model call reported: whether it was still in flight (not cancelled)."""
        return self.models.pop(key, None) is not None

    def tool_reported(self, call_id: str) -> None:
        """A tool attempt, reconcile or restore reported its end."""
        self.tools.pop(call_id, None)
        self.cancelling.discard(call_id)

    def back_off_over(self, call_id: str) -> bool:
        """A tool call's timer went off: whether its wait was still on (not stopped)."""
        return self.waits.pop(call_id, None) is not None

    # -- stopping ------------------------------------------------------------------------

    def cancel_tool(self, call_id: str) -> None:
        scope = self.tools.get(call_id)
        if scope is not None:
            self.cancelling.add(call_id)  # until its attempt reports
            scope.cancel()

    def cancel_model(self, key: str) -> None:
        self.waiting_models.discard(key)
        scope = self.models.pop(key, None)
        if scope is not None:
            scope.cancel()

    def stop_back_off(self, call_id: str) -> None:
        timer = self.waits.pop(call_id, None)
        if timer is not None:
            timer.cancel()

    def stop_timers(self) -> None:
        """Stop every back-off being waited out (not a result held back: it must land)."""
        for call_id in list(self.waits):
            if call_id not in self.held_back:
                self.stop_back_off(call_id)
        for key in list(self.waiting_models):
            self.cancel_model(key)

    def call_off(self, started: Iterable[protocol.Effect]) -> None:
        """The commit these effects overlapped failed: stop them, and forget them, so that
        whatever they report later is dropped (their step is not in the log)."""
        for effect in started:
            if isinstance(effect, protocol.CallModel):
                self.cancel_model(effect.generation_id)
            elif isinstance(effect, protocol.RunTool):
                scope = self.tools.pop(effect.call_id, None)
                if scope is not None:
                    scope.cancel()

    # -- results the log could not take yet ----------------------------------------------

    def hold(self, result: protocol.Result) -> None:
        """Keep ``result``'s place until it is committed: its call stays in flight."""
        placeholder = trio.CancelScope()
        if isinstance(result, protocol.ModelReplied | protocol.ModelFailed):
            self.models[result.generation_id] = placeholder
        elif isinstance(result, protocol.BackOffOver):
            self.waits[result.call_id] = placeholder
            self.held_back.add(result.call_id)
        else:
            self.tools[result.call_id] = placeholder

    def release(self, result: protocol.Result) -> None:
        """A held result is about to be committed again: give its place back."""
        if isinstance(result, protocol.ModelReplied | protocol.ModelFailed):
            self.models.pop(result.generation_id, None)
        elif isinstance(result, protocol.BackOffOver):
            self.waits.pop(result.call_id, None)
            self.held_back.discard(result.call_id)
        else:
            self.tools.pop(result.call_id, None)
