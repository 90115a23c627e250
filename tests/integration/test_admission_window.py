"""The admission window (docs/decisions/004): what admission does not look at, explain says."""

from __future__ import annotations

from quotagate import ManualClock, Quotagate, RequestState


def test_a_request_behind_the_window_waits_and_explain_says_why(
    db_url: str, clock: ManualClock
) -> None:
    with Quotagate.connect(db_url, clock=clock, admission_window=2) as gate:
        gate.set_tenant("team-a", {"gpu": 1000})
        gate.set_pool("pool-1", {"gpu": 100})
        for number in range(3):  # ahead in the queue, and never fit the pool shrunk below
            gate.submit(f"big-{number}", "team-a", {"gpu": 100}, priority=5)
            clock.advance(1)
        gate.set_pool("pool-1", {"gpu": 8})
        gate.submit("small", "team-a", {"gpu": 1})
        assert gate.admit_until_idle() == 0  # admission looks at big-0 and big-1 only
        explained = gate.explain("small")
        assert explained["tenant_position"] == 4
        assert explained["reason"] == (
            "fits, but is number 4 in its tenant's queue; admission looks at the first 2 "
            "of each tenant")
        assert gate.show("small").state == RequestState.WAITING
    # With a window that reaches it, the same ledger admits it at once.
    with Quotagate.connect(db_url, clock=clock, admission_window=4) as gate:
        assert gate.explain("small")["reason"] == (
            "fits now; it will be admitted by the next admission pass")
        assert [placement.id for placement in gate.admit(1)] == ["small"]
        assert gate.check_invariants() == []
