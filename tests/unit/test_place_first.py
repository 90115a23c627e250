"""``place_first``: the one placement ``plan_admissions(limit=1)`` makes in fair order,
found without building the plan (the steady SQLite admission,
docs/decisions/061-steady-sqlite-admission.md). Checked against the planner itself on
random queues, usages, weights and past shares."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quotagate.domain.placement import Candidate, place_first, plan_admissions

TENANTS = ("a", "b", "c", "d")
POOLS = ("pool-1", "pool-2", "pool-3")
RESOURCES = ("gpu", "cpu")

costs = st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 4), min_size=1)
usages = st.dictionaries(st.sampled_from(RESOURCES),
                         st.tuples(st.integers(0, 6), st.integers(0, 8)).map(sorted).map(tuple))


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    queued: list[tuple[Any, ...]] = []
    for index in range(draw(st.integers(0, 14))):
        tenant = draw(st.sampled_from(TENANTS))
        # (queue key, created, id, candidate): ties on the key are broken by created, then id.
        queued.append((draw(st.integers(0, 3)), draw(st.integers(0, 2)), f"r{index:02d}",
                       Candidate(f"r{index:02d}", tenant, draw(costs))))
    queued.sort()
    return {
        "queued": queued,
        "tenants": draw(st.dictionaries(st.sampled_from(TENANTS), usages)),
        "pools": draw(st.dictionaries(st.sampled_from(POOLS), usages)),
        "weights": draw(st.dictionaries(st.sampled_from(TENANTS), st.integers(1, 3))),
        "history": draw(st.none() | st.dictionaries(st.sampled_from(TENANTS),
                                                    st.floats(0, 2, allow_nan=False))),
        "window": draw(st.integers(1, 5)),
    }


@settings(max_examples=600, deadline=None)
@given(scenarios())
def test_place_first_places_what_the_planner_places_first(scenario: dict[str, Any]) -> None:
    queued, window = scenario["queued"], scenario["window"]
    queues: dict[str, list[tuple[Any, ...]]] = {}
    for entry in queued:
        queues.setdefault(entry[3].tenant, []).append(entry)
    # The planner is handed each tenant's first `window` candidates, in queue order.
    handed = sorted(entry for entry_list in queues.values() for entry in entry_list[:window])
    planned = plan_admissions([entry[3] for entry in handed], scenario["tenants"],
                              scenario["pools"], 1, weights=scenario["weights"],
                              history=scenario["history"])
    chosen = place_first(queues.items(), scenario["tenants"], scenario["pools"],
                         scenario["weights"], scenario["history"], window)
    if not planned:
        assert chosen is None
        return
    assert chosen is not None
    entry, pool = chosen
    assert (entry[3].id, pool) == (planned[0].id, planned[0].pool)


def test_the_lowest_share_goes_first_and_a_tenant_whose_head_fits_nowhere_is_passed() -> None:
    queues = {
        "a": [(0, 0, "a0", Candidate("a0", "a", {"gpu": 1}))],
        "b": [(1, 0, "b0", Candidate("b0", "b", {"gpu": 9})),  # fits no pool: passed over
              (2, 0, "b1", Candidate("b1", "b", {"gpu": 1}))],
    }
    tenants = {"a": {"gpu": (3, 4)}, "b": {"gpu": (0, 4)}}
    pools = {"pool-1": {"gpu": (0, 4)}, "pool-2": {"gpu": (2, 4)}}
    chosen = place_first(queues.items(), tenants, pools, {}, None, 4)
    # b's share (0) is below a's (3/4) although a's head is first in queue order;
    # best fit puts b1 where the least room is left over.
    assert chosen is not None and (chosen[0][2], chosen[1]) == ("b1", "pool-2")
    assert place_first(queues.items(), tenants, pools, {}, None, 1) is not None
    only_big = {"b": queues["b"][:1]}
    assert place_first(only_big.items(), tenants, pools, {}, None, 4) is None


def test_past_use_and_weights_move_a_tenant_back() -> None:
    queues = {
        "a": [(0, 0, "a0", Candidate("a0", "a", {"gpu": 1}))],
        "b": [(1, 0, "b0", Candidate("b0", "b", {"gpu": 1}))],
    }
    tenants = {"a": {"gpu": (1, 4)}, "b": {"gpu": (2, 4)}}
    pools = {"pool-1": {"gpu": (0, 8)}}

    def first(weights: dict[str, int], history: dict[str, float] | None) -> str:
        chosen = place_first(queues.items(), tenants, pools, weights, history, 4)
        assert chosen is not None
        return str(chosen[0][2])

    assert first({}, None) == "a0"  # a uses 1/4, b 2/4
    assert first({}, {"a": 0.5}) == "b0"  # a's past use puts it at 3/4
    assert first({"b": 4}, None) == "b0"  # b's weight divides its 2/4
