"""A ledger where a preemption's freed room is held for its preemptor (docs/decisions/721)."""

from __future__ import annotations

from quotagate import Quotagate
from quotagate.domain.model import RequestState


def contested_hold(gate: Quotagate) -> None:
    """team-a preempts its own low-priority work; team-c, first in fair order, waits too.

    Without the hold, the room low's stop frees would go to c-wait: team-c's weight
    puts it ahead of team-a (share 2/4 / 10 against 2/4). Afterwards ``high`` (the
    preemptor), ``c-wait`` and ``low`` (requeued) wait, and the room is held for high.
    """
    gate.set_pool("pool-1", {"gpu": 6})
    gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority", on_preempt="requeue")
    gate.set_tenant("team-c", {"gpu": 4}, weight=10)
    gate.submit("a-keep", "team-a", {"gpu": 2}, priority=9)
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.submit("c-run", "team-c", {"gpu": 2})
    assert gate.admit_until_idle() == 3
    assert {gate.show(name).state.value for name in ("a-keep", "low", "c-run")} == {"reserved"}
    gate.submit("c-wait", "team-c", {"gpu": 2})
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    assert gate.admit() == [] and gate.show("low").state.value == "preempting"
    # The worker's confirmed stop (quotagate.delivery.dispatcher._stopped).
    released = gate.ledger.release("low", RequestState.CANCELLED, stopped=True).released
    assert released == {"gpu": 2}
