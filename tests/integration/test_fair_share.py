"""Fair share between tenants, priority within one, and the priority cap, on every backend."""

from __future__ import annotations

from collections import Counter, deque

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.errors import InvalidInput
from quotagate.store import schema
from support.ledger_state import snapshot

JOB_SECONDS = 30.0
STEP_SECONDS = 10.0


def test_two_saturating_tenants_of_weights_1_and_2_converge_to_shares_1_to_2(
    gate: Quotagate, clock: ManualClock
) -> None:
    """A long synthetic run on the injectable clock: every job holds its gpu for 30 s.

    team-a asks with a far higher priority than team-b: by priority alone it would
    get every place. Fair share gives the pool out by weighted dominant share.
    """
    gate.set_pool("pool-1", {"gpu": 12})
    gate.set_tenant("team-a", {"gpu": 100}, weight=1)
    gate.set_tenant("team-b", {"gpu": 100}, weight=2)
    for index in range(700):
        if index < 450:
            gate.submit(f"a-{index}", "team-a", {"gpu": 1}, priority=1000)
        gate.submit(f"b-{index}", "team-b", {"gpu": 1}, priority=0)
    running: deque[tuple[float, str]] = deque()
    admitted: Counter[str] = Counter()
    for _step in range(150):
        while running and running[0][0] <= clock.now():
            gate.complete(running.popleft()[1])
        while placements := gate.ledger.admit(4):
            for placement in placements:
                admitted[placement.tenant] += 1
                running.append((clock.now() + JOB_SECONDS, placement.id))
        clock.advance(STEP_SECONDS)
    assert admitted["team-a"] > 100  # a long run, both saturating all along
    ratio = admitted["team-b"] / admitted["team-a"]
    assert abs(ratio - 2.0) <= 0.2, admitted
    assert gate.check_invariants() == []


def test_priority_still_orders_a_tenants_own_queue(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 1})
    gate.set_tenant("team-a", {"gpu": 4})
    gate.submit("low", "team-a", {"gpu": 1}, priority=0)
    gate.submit("high", "team-a", {"gpu": 1}, priority=5)
    assert [placement.id for placement in gate.admit()] == ["high"]


def test_a_new_high_priority_request_does_not_pass_another_tenants_old_one(
    gate: Quotagate, clock: ManualClock
) -> None:
    """The issue's case: priority 1000000 from one tenant against a request that waited
    (30 days there; here one minute, within the default TTL)."""
    gate.set_pool("pool-1", {"gpu": 2})
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_tenant("team-b", {"gpu": 4})
    gate.submit("a-running", "team-a", {"gpu": 1})
    gate.admit()
    gate.submit("b-old", "team-b", {"gpu": 1})
    clock.advance(60)
    gate.submit("a-urgent", "team-a", {"gpu": 1}, priority=1_000_000)
    assert [placement.id for placement in gate.admit()] == ["b-old"]


def test_a_priority_above_the_tenants_maximum_is_refused(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 2})
    gate.set_tenant("team-a", {"gpu": 2}, max_priority=10)
    assert gate.config.get_tenant("team-a")["max_priority"] == 10
    gate.submit("fine", "team-a", {"gpu": 1}, priority=10)
    before = snapshot(gate)
    with pytest.raises(InvalidInput) as refused:
        gate.submit("greedy", "team-a", {"gpu": 1}, priority=11)
    assert refused.value.code == "priority_above_max"
    assert refused.value.message == ("priority 11 is above the maximum 10 of tenant 'team-a'; "
                                     "nothing was submitted")
    assert snapshot(gate) == before
    simulated = gate.simulate("team-a", {"gpu": 1}, priority=11)
    assert simulated["admissible"] is False
    assert simulated["reasons"][0] == {"code": "priority_above_max", "resource": "priority",
                                       "needed": 11, "available": 10}
    gate.set_tenant("team-a", {}, max_priority=None)
    gate.submit("greedy", "team-a", {"gpu": 1}, priority=11)
    with pytest.raises(InvalidInput):
        gate.set_tenant("team-a", {}, max_priority=10**9)


def _recent_heavy_user_then_both_ask(gate: Quotagate, clock: ManualClock) -> tuple[bool, list[str]]:
    """team-a held the whole pool for an hour; then team-a and team-b each ask for the
    whole pool, team-a first. Would team-a's be admitted (the dry run), and which one does
    the next admission take?"""
    gate.set_pool("pool-1", {"gpu": 2})
    gate.set_tenant("team-a", {"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 2})
    gate.submit("a-heavy", "team-a", {"gpu": 2})
    gate.admit()
    clock.advance(3600)
    gate.complete("a-heavy")
    gate.submit("a-next", "team-a", {"gpu": 2})
    clock.advance(1)
    gate.submit("b-next", "team-b", {"gpu": 2})
    admissible = gate.explain("a-next")["admissible"]
    return admissible, [placement.id for placement in gate.admit()]


def test_with_a_half_life_a_tenant_that_used_much_lately_yields(
    gate: Quotagate, clock: ManualClock
) -> None:
    gate.set_fair_share(half_life="1h")
    assert gate.fair_share() == {"half_life": 3600}
    # The dry run plays the same order: team-b's request takes the pool first.
    assert _recent_heavy_user_then_both_ask(gate, clock) == (False, ["b-next"])


def test_without_a_half_life_past_use_changes_nothing(
    gate: Quotagate, clock: ManualClock
) -> None:
    assert gate.fair_share() == {"half_life": None}
    # Equal current shares: queue order decides, as before.
    assert _recent_heavy_user_then_both_ask(gate, clock) == (True, ["a-next"])


def test_past_use_fades_with_the_half_life(gate: Quotagate, clock: ManualClock) -> None:
    gate.set_fair_share(half_life="10m")
    gate.set_pool("pool-1", {"gpu": 1})
    gate.set_tenant("team-a", {"gpu": 1})
    gate.set_tenant("team-b", {"gpu": 1})
    gate.submit("a-heavy", "team-a", {"gpu": 1})
    gate.admit()
    clock.advance(3600)
    gate.complete("a-heavy")
    # Ten half-lives later team-a's past share is under a thousandth: and team-b has
    # used a little more, just now.
    clock.advance(36000)
    gate.submit("b-short", "team-b", {"gpu": 1})
    gate.admit()
    clock.advance(60)
    gate.complete("b-short")
    gate.submit("a-next", "team-a", {"gpu": 1})
    gate.submit("b-next", "team-b", {"gpu": 1})
    assert [placement.id for placement in gate.admit()] == ["a-next"]
    # Removing the half-life forgets past use: queue order again.
    gate.set_fair_share(half_life=None)
    with gate.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.sum(schema.tenant_quota.c.decayed))
                                  ).scalar() == 0
