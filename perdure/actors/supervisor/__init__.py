"""The supervisor: owns the session actors, starts the active ones, restarts crashed ones.

One object, ``Supervisor``, made of three jobs, each a module with its theory of
operation: ``ownership`` (boot, leases, orphans, rebalancing, hand-overs), ``memory``
(hibernate, freeze, evict, heap trims) and ``lifecycle`` (start, supervise, restart
and park an actor; create, fork and delete sessions; ask, peek, wait, drain), over the
registries they share (``base``); and ``agents``, the sub-agents its actors run as
child sessions (and the orphans a crash left), which it gives them in their context.
This module is the face the runtime imports.
"""

from __future__ import annotations

from perdure.actors.supervisor.base import MAX_OUTAGE_BACKOFF, OUTAGE_BACKOFF, RESTART_BACKOFF
from perdure.actors.supervisor.lifecycle import Supervisor
from perdure.actors.supervisor.memory import FREEZE_AFTER, _Dormant, dormant_state, freeze_round
from perdure.actors.supervisor.ownership import BOOT_READ_BATCH, BOOT_READ_PARALLEL, _Cadence

__all__ = [
    "BOOT_READ_BATCH",
    "BOOT_READ_PARALLEL",
    "FREEZE_AFTER",
    "MAX_OUTAGE_BACKOFF",
    "OUTAGE_BACKOFF",
    "RESTART_BACKOFF",
    "Supervisor",
    "_Cadence",
    "_Dormant",
    "dormant_state",
    "freeze_round",
]
