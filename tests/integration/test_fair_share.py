"""Fair share between tenants, priority within one, and the priority cap, on every backend."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from quotagate import ManualClock, Quotagate
from quotagate.errors import InvalidInput
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
    assert snapshot(gate) == before
    simulated = gate.simulate("team-a", {"gpu": 1}, priority=11)
    assert simulated["admissible"] is False
    assert simulated["reasons"][0] == {"code": "priority_above_max", "resource": "priority",
                                       "needed": 11, "available": 10}
    gate.set_tenant("team-a", {}, max_priority=None)
    gate.submit("greedy", "team-a", {"gpu": 1}, priority=11)
    with pytest.raises(InvalidInput):
        gate.set_tenant("team-a", {}, max_priority=10**9)
