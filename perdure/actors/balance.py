"""Rebalancing across nodes: which of this node's sessions go to which peer. Pure.

With a multi-node log every node runs ``plan`` at each lease heartbeat, on its own
survey of the log (``ClusterView``: the live nodes, how many active sessions each
holds, how many sessions are active), and sheds its own part of the moves. The
supervisor performs them: it asks each chosen session's actor to hand over at its
next safe point, then gives the lease to the target (``LogBackend.hand_over``).

The rule:

* A node's *load* is the number of active sessions (unfinished work) it holds a
  lease on. Idle sessions are not load: nobody needs to run them, their lease goes
  when their actor is evicted, and their next command starts them wherever it lands.
* The fair share is ceil(active / live nodes), the same ceiling ``claim`` fills.
* A node sheds only when it holds more than its share plus a slack (hysteresis:
  a node a few sessions over its share stays as it is, so sessions do not bounce
  between nodes whose surveys differ by a moment), and then down to the share.
* Sessions go to the live nodes below their share that have been members for at
  least ``grace`` (a node that just joined, or rejoined after it was cut off, first
  runs what it starts or claims). Their room is their total deficit minus the
  orphans (sessions nobody holds), which they claim anyway.
* The surpluses (largest first) are paired with the deficits (largest first) in one
  fixed order, so every node that computes it from the same survey assigns the same
  targets, and each node keeps its own slice. Hand-overs this node already asked
  for (still under way: the lease is still its own, so still in its load) take the
  first places of its slice and count against ``max_moves``, the bound per heartbeat.
* A session that arrived on this node (or whose hand-over gave up) less than
  ``cooldown`` ago stays, as does a pinned one (a sub-agent whose parent's tool waits
  for it on this node). Sessions at rest (nothing in flight) go first, since they
  move at once; then busy ones, which move at their next safe point: first those
  whose step is ending (only tool calls running), then those waiting for the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attrs import frozen

from perdure.storage.backend import ClusterView


@frozen
class Candidate:
    """One of this node's running sessions with unfinished work, as the supervisor sees it."""

    session_id: str
    at_rest: bool  # nothing in flight on this node right now: it can go at once
    settled_for: float  # seconds since it arrived here, or a hand-over of it gave up
    pinned: bool = False  # it must stay here (a sub-agent its parent waits for)
    # A model call is in flight: its safe point is a whole step away (the reply, then
    # its tool calls), not just the end of the tool calls running now.
    calling_model: bool = False


@frozen(kw_only=True)
class Policy:
    slack: float = 0.05  # the share of the fair share a node may hold above it
    max_moves: int = 32  # hand-overs under way per node, at most
    grace: float = 10 / 3  # seconds a node is a member before it is handed sessions
    cooldown: float = 30.0  # seconds a session stays after it arrived

    @classmethod
    def for_lease_ttl(cls, lease_ttl: float) -> Policy:
        """The timing follows the lease TTL: a node is handed sessions once it has been
        up for one heartbeat (a third of the TTL: by then it has booted what it claimed
        at start and renewed once), and a session that moved stays for three TTLs."""
        return cls(grace=lease_ttl / 3, cooldown=3 * lease_ttl)


@frozen
class Move:
    session_id: str
    target: str


def fair_share(view: ClusterView) -> int:
    return math.ceil(view.active / len(view.nodes)) if view.nodes else 0


def tolerance(share: int, policy: Policy) -> int:
    """How many sessions above its share a node may hold before it sheds (at least one)."""
    return max(1, math.floor(share * policy.slack))


def allocation(view: ClusterView, policy: Policy) -> dict[str, list[tuple[str, int]]]:
    """For each node that should shed: the (target, how many) it hands over now."""
    if len(view.nodes) < 2 or view.active == 0:
        return {}
    share = fair_share(view)
    over = share + tolerance(share, policy)
    sources = sorted(
        (n for n in view.nodes if n.sessions > over), key=lambda n: (-n.sessions, n.node_id)
    )
    targets = sorted(
        (n for n in view.nodes if n.sessions < share and n.up_for >= policy.grace),
        key=lambda n: (n.sessions, n.node_id),
    )
    orphans = max(0, view.active - sum(n.sessions for n in view.nodes))
    room = sum(share - n.sessions for n in targets) - orphans
    gaps = [share - n.sessions for n in targets]
    moves: dict[str, list[tuple[str, int]]] = {}
    index = 0
    for source in sources:
        surplus = source.sessions - share
        while surplus > 0 and room > 0 and index < len(targets):
            count = min(surplus, gaps[index], room)
            moves.setdefault(source.node_id, []).append((targets[index].node_id, count))
            surplus -= count
            room -= count
            gaps[index] -= count
            if gaps[index] == 0:
                index += 1
    return moves


def plan(
    view: ClusterView,
    me: str,
    candidates: Sequence[Candidate],
    *,
    handing: int,
    policy: Policy,
) -> list[Move]:
    """The hand-overs this node asks for now (``handing``: those still under way)."""
    mine = allocation(view, policy).get(me, [])
    targets = [target for target, count in mine for _ in range(count)][handing:]
    budget = max(0, policy.max_moves - handing)
    movable = sorted(
        (c for c in candidates if not c.pinned and c.settled_for >= policy.cooldown),
        key=lambda c: (not c.at_rest, c.calling_model, c.session_id),
    )
    return [Move(c.session_id, t) for c, t in zip(movable, targets[:budget], strict=False)]
