"""The pure shedding decision (``perdure.actors.balance``): surveys in, moves out."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from perdure.actors.balance import Candidate, Move, Policy, allocation, fair_share, plan
from perdure.storage.backend import ClusterView, NodeLoad

POLICY = Policy(slack=0.05, max_moves=32, grace=1.0, cooldown=6.0)


def view(active: int | None = None, **loads: int | tuple[int, float]) -> ClusterView:
    """``n1=40`` a node holding 40 that joined long ago; ``n4=(0, 0.2)`` one up for 0.2 s."""
    nodes = []
    for name, load in loads.items():
        held, up = load if isinstance(load, tuple) else (load, 100.0)
        nodes.append(NodeLoad(name, held, up))
    total = sum(n.sessions for n in nodes) if active is None else active
    return ClusterView(tuple(nodes), total)


def busy(*ids: str, settled_for: float = 100.0) -> list[Candidate]:
    return [Candidate(i, at_rest=False, settled_for=settled_for) for i in ids]


def mine(count: int, prefix: str = "s") -> list[Candidate]:
    return busy(*(f"{prefix}{i:03d}" for i in range(count)))


def test_a_joining_node_gets_a_quarter_from_three_full_ones() -> None:
    survey = view(n1=100, n2=100, n3=100, n4=0)
    assert fair_share(survey) == 75
    quarter = [("n4", 25)]
    assert allocation(survey, POLICY) == {"n1": quarter, "n2": quarter, "n3": quarter}
    moves = plan(survey, "n2", mine(100), handing=0, policy=POLICY)
    assert len(moves) == 25
    assert {m.target for m in moves} == {"n4"}
    assert plan(survey, "n4", [], handing=0, policy=POLICY) == []


def test_a_node_within_the_slack_of_its_share_stays_as_it_is() -> None:
    # share 75, slack 3: 78 stays, 79 sheds down to 75.
    assert plan(view(n1=78, n2=72, n3=75, n4=75), "n1", mine(78), handing=0, policy=POLICY) == []
    moves = plan(view(n1=79, n2=71, n3=75, n4=75), "n1", mine(79), handing=0, policy=POLICY)
    assert [m.target for m in moves] == ["n2"] * 4


def test_small_clusters_tolerate_one_session_over_the_share() -> None:
    assert plan(view(a=3, b=1), "a", mine(3), handing=0, policy=POLICY) == []
    assert len(plan(view(a=4, b=0), "a", mine(4), handing=0, policy=POLICY)) == 2


def test_one_node_or_no_work_moves_nothing() -> None:
    assert plan(view(a=50), "a", mine(50), handing=0, policy=POLICY) == []
    assert plan(view(a=0, b=0), "a", [], handing=0, policy=POLICY) == []


def test_a_node_that_just_joined_is_handed_nothing_yet() -> None:
    young = view(n1=100, n2=(0, 0.5))
    assert plan(young, "n1", mine(100), handing=0, policy=POLICY) == []
    grown = view(n1=100, n2=(0, 1.0))
    assert len(plan(grown, "n1", mine(100), handing=0, policy=POLICY)) == 32  # the bound


def test_the_moves_per_heartbeat_are_bounded_and_count_those_under_way() -> None:
    survey = view(n1=100, n2=0)
    assert len(plan(survey, "n1", mine(100), handing=0, policy=POLICY)) == 32
    assert len(plan(survey, "n1", mine(100), handing=20, policy=POLICY)) == 12
    assert plan(survey, "n1", mine(100), handing=32, policy=POLICY) == []
    # Nearly done: 50 to shed, 45 under way, 5 more.
    assert len(plan(survey, "n1", mine(100), handing=45, policy=Policy(max_moves=64))) == 5


def test_orphans_leave_room_for_their_claims() -> None:
    # n2 just joined; n3 is the only target. 120 active, 100 held: n3 claims the 20
    # orphans itself, so of its deficit of 40 only 20 come by hand-over.
    survey = view(active=120, n1=100, n2=(0, 0.1), n3=0)
    assert fair_share(survey) == 40
    assert allocation(survey, POLICY) == {"n1": [("n3", 20)]}
    # As many orphans as the deficit: no hand-over at all.
    assert allocation(view(active=150, n1=100, n2=(0, 0.1), n3=0), POLICY) == {}


def test_the_emptiest_node_is_filled_first_and_the_fullest_sheds_first() -> None:
    survey = view(a=60, b=50, c=10, d=0)  # share 30
    assert allocation(survey, Policy(grace=0, max_moves=100)) == {
        "a": [("d", 30)],
        "b": [("c", 20)],
    }


def test_every_node_computes_the_same_allocation_from_the_same_survey() -> None:
    survey = view(n1=90, n2=100, n3=80, n4=0, n5=(3, 30.0))  # 273 active: share 55
    wide = Policy(grace=1.0, max_moves=100)
    alloc = allocation(survey, wide)
    assert alloc == {"n2": [("n4", 45)], "n1": [("n4", 10), ("n5", 25)], "n3": [("n5", 25)]}
    targets: list[str] = []
    for source in ("n1", "n2", "n3"):
        moves = plan(survey, source, mine(100, prefix=source), handing=0, policy=wide)
        assert len(moves) == sum(n for _, n in alloc[source])
        targets += [m.target for m in moves]
    assert (targets.count("n4"), targets.count("n5")) == (55, 50)  # both up to their share


def test_sessions_at_rest_go_first_then_those_whose_step_ends_soonest() -> None:
    held = [
        Candidate("b-busy", at_rest=False, settled_for=100),
        Candidate("a-busy", at_rest=False, settled_for=100),
        Candidate("a-model", at_rest=False, settled_for=100, calling_model=True),
        Candidate("z-rest", at_rest=True, settled_for=100),
    ]
    moves = plan(view(a=4, b=0, c=0, d=0), "a", held, handing=0, policy=POLICY)  # shed 3
    assert moves == [Move("z-rest", "b"), Move("a-busy", "c"), Move("b-busy", "d")]
    moves = plan(view(a=8, b=0, c=0, d=0), "a", held, handing=0, policy=POLICY)  # shed 6
    assert [m.session_id for m in moves] == ["z-rest", "a-busy", "b-busy", "a-model"]


def test_sessions_that_just_arrived_or_are_pinned_stay() -> None:
    held = [
        Candidate("arrived", at_rest=True, settled_for=5.9),
        Candidate("sub-agent", at_rest=True, settled_for=100, pinned=True),
        Candidate("old", at_rest=False, settled_for=6.0),
    ]
    assert plan(view(a=3, b=0, c=0), "a", held, handing=0, policy=POLICY) == [Move("old", "b")]


def test_a_survey_without_this_node_moves_nothing() -> None:
    # Its membership lapsed (the others count it gone): it first rejoins.
    assert plan(view(b=100, c=0), "a", mine(100), handing=0, policy=POLICY) == []


loads = st.lists(
    st.tuples(st.integers(0, 400), st.sampled_from([0.0, 0.5, 100.0])), min_size=1, max_size=8
)


@given(loads, st.integers(0, 50), st.integers(0, 40))
def test_no_move_overfills_a_target_or_empties_a_source_below_its_share(
    nodes: list[tuple[int, float]], orphans: int, handing: int
) -> None:
    survey = ClusterView(
        tuple(NodeLoad(f"n{i}", held, up) for i, (held, up) in enumerate(nodes)),
        sum(held for held, _ in nodes) + orphans,
    )
    share = fair_share(survey)
    alloc = allocation(survey, POLICY)
    received: dict[str, int] = {}
    by_name = {n.node_id: n for n in survey.nodes}
    for source, moves in alloc.items():
        given_away = sum(n for _, n in moves)
        assert by_name[source].sessions - given_away >= share, "no source sheds below its share"
        assert by_name[source].sessions > share + max(1, math.floor(share * POLICY.slack))
        for target, count in moves:
            assert count > 0 and target != source
            assert by_name[target].up_for >= POLICY.grace
            received[target] = received.get(target, 0) + count
    for target, count in received.items():
        assert by_name[target].sessions + count <= share, "no target is filled past its share"
    deficits = sum(max(0, share - n.sessions) for n in survey.nodes if n.up_for >= POLICY.grace)
    assert sum(received.values()) <= max(0, deficits - orphans)
    # A node's own plan is its slice, less what is under way, within the bound.
    for node in survey.nodes:
        moves = plan(survey, node.node_id, mine(node.sessions), handing=handing, policy=POLICY)
        planned = sum(n for _, n in alloc.get(node.node_id, []))
        assert len(moves) == min(max(0, planned - handing), max(0, POLICY.max_moves - handing))
        assert len({m.session_id for m in moves}) == len(moves)
