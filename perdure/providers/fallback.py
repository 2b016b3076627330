"""Durable fallback between providers: the next one answers when one keeps failing.

``FallbackProvider([primary, secondary, ...], after=2)`` sends a model turn to the
first provider; once that provider has failed the turn with a retryable error
``after`` times, or at once when it is *exhausted* (a quota or spend limit, which
waiting does not cure), the next attempt goes to the next provider, without a
back-off. The last provider keeps the turn until the runtime's attempts run out.

Every part of that choice is in the log. A failure is reported as a
``ProviderError`` naming the provider that failed and, when it moves the turn on,
``fallback=True``; the runtime records both on the ``RetryPending`` record before
the next attempt starts. The next attempt's request carries those records
(``ModelRequest.failed``), and ``choose`` is a pure function of them: a process
restarted after a SIGKILL right after the switch rebuilds the same request from
the log and so keeps the provider the dead one had switched to.

Within one input, a later turn starts with the provider that answered the turn
before it (``ModelRequest.answered_by``, from the recorded reply), so a run that
fell back does not knock on the failing provider at every turn; the next input
starts with the first provider again. The conversation is provider-neutral, so
whichever provider answers receives the whole history, tool calls and results
included (another vendor's reasoning blocks are left out by the providers).
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import evolve

from perdure.providers.base import (
    Emit,
    ModelReply,
    ModelRequest,
    Provider,
    ProviderError,
    classify,
)

__all__ = ["FallbackProvider"]


class FallbackProvider:
    """A ``Provider`` that moves a model turn on to the next provider when one fails.

    ``providers`` are tried in order; each is known by its ``name`` (recorded with
    every reply and failure), so the names must differ: ``OpenAIProvider(name=...)``
    tells two OpenAI-compatible servers apart. ``after`` is how many retryable
    failures of one provider a turn accepts before it moves on; ``sticky=False``
    starts every turn with the first provider.
    """

    name = "fallback"

    def __init__(
        self, providers: Sequence[Provider], *, after: int = 2, sticky: bool = True
    ) -> None:
        members = list(providers)
        if not members:
            raise ValueError("FallbackProvider needs at least one provider")
        if after < 1:
            raise ValueError(f"after must be at least 1, not {after}")
        names = [p.name for p in members]
        for name in names:
            if not name:
                raise ValueError("every provider of a FallbackProvider needs a name")
            if names.count(name) > 1:
                raise ValueError(
                    f"two providers are named {name!r}: the log could not tell them apart; "
                    "give them distinct names (e.g. OpenAIProvider(name=...))"
                )
        self.providers = members
        self.after = after
        self.sticky = sticky
        self._index = {name: i for i, name in enumerate(names)}

    def __repr__(self) -> str:
        names = ", ".join(p.name for p in self.providers)
        return f"FallbackProvider([{names}], after={self.after}, sticky={self.sticky})"

    def choose(self, request: ModelRequest) -> int:
        """The index of the provider for ``request`` (pure: a function of recorded facts)."""
        index = 0
        if self.sticky:
            index = self._index.get(request.answered_by, 0)
        for failure in request.failed:
            failed = self._index.get(failure.provider)
            if failure.fallback and failed is not None:
                index = max(index, failed + 1)
        return min(index, len(self.providers) - 1)

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        index = self.choose(request)
        provider = self.providers[index]
        try:
            reply = await provider.complete(request, emit)
        except Exception as exc:
            raise self._failure(request, index, classify(exc)) from exc
        return evolve(reply, provider=provider.name)

    def _failure(self, request: ModelRequest, index: int, err: ProviderError) -> ProviderError:
        """The error to report: who failed, and whether the next attempt moves on."""
        name = self.providers[index].name
        failures = 1 + sum(1 for f in request.failed if f.provider == name)
        has_next = index + 1 < len(self.providers)
        move_on = has_next and (err.exhausted or (err.retryable and failures >= self.after))
        if not move_on:
            return ProviderError(
                err.message,
                retryable=err.retryable,
                retry_after=err.retry_after,
                status=err.status,
                usage=err.usage,
                model=err.model,
                provider=name,
                exhausted=err.exhausted,
            )
        why = "is exhausted" if err.exhausted else f"failed {failures} time(s)"
        return ProviderError(
            f"{err.message} [{name} {why}: the next attempt goes to "
            f"{self.providers[index + 1].name}]",
            retryable=True,
            status=err.status,
            usage=err.usage,
            model=err.model,
            provider=name,
            exhausted=err.exhausted,
            fallback=True,
        )

    async def aclose(self) -> None:
        """Close every provider that can be closed."""
        for provider in self.providers:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()

    async def __aenter__(self) -> FallbackProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
