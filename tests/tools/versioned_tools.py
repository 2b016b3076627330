"""Two versions of one ledger tool, for the versioned-tools crash test
(``tests.tools.test_versions_crash``): each writes its version in the ledger, so a
test sees which version's body had the effect."""

from __future__ import annotations

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from tests.support.ledger_tools import _write


async def _charge_v1(ctx: ToolContext, cents: int) -> str:
    """Charge a card (the service deduplicates by the key)."""
    await trio.to_thread.run_sync(lambda: _write(ctx, "effect", "charge", version="1"))
    return f"charged {cents} (v1)"


async def _charge_v2(ctx: ToolContext, cents: int, currency: str = "EUR") -> str:
    """Charge a card in a currency (the service deduplicates by the key)."""
    await trio.to_thread.run_sync(lambda: _write(ctx, "effect", "charge", version="2"))
    return f"charged {cents} {currency} (v2)"


charge_v1 = perdure.tool(name="charge", replay=ReplayPolicy.KEYED)(_charge_v1)
charge_v2 = perdure.tool(name="charge", replay=ReplayPolicy.KEYED, version=2)(_charge_v2)

V1 = [charge_v1]
BOTH = [charge_v1, charge_v2]
V2 = [charge_v2]
