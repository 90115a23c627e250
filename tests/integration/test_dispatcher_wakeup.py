"""The bell between serve's admission loop and its dispatcher, on every backend.

An idle dispatcher looks for work once per ``poll_interval``; rung, it looks at once
(docs/decisions/258). Here the interval is an hour, so a delivery that arrives at all
arrived because of the bell.
"""

from __future__ import annotations

import threading
from pathlib import Path

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.wakeup import Wakeup
from support.waiting import wait_for

HOUR = 3600.0


def test_an_idle_dispatcher_delivers_what_was_admitted_once_the_bell_rings(
    gate: Quotagate, tmp_path: Path,
) -> None:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 8})
    TargetStore(gate.engine, clock=gate.clock).set(
        "local", "process", {"command": ["true"], "run_dir": str(tmp_path / "runs")},
        default=True)
    wakeup = Wakeup()
    dispatcher = Dispatcher(gate, worker_name="belled", poll_interval=HOUR, observe_limit=0,
                            wakeup=wakeup)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,))
    thread.start()
    try:
        # Its first pass found nothing to do: it now waits for the bell or the hour.
        wait_for(lambda: dispatcher.last_pass is not None, "the first pass")
        gate.submit("r-1", "team-a", {"gpu": 1})
        assert [placement.id for placement in gate.admit(1)] == ["r-1"]
        wakeup.ring()
        wait_for(lambda: gate.show("r-1").state == RequestState.DELIVERED, "the delivery")
    finally:
        stop.set()
        wakeup.ring()  # as serve does: a stop is not kept waiting for the hour
        thread.join(30)
    assert not thread.is_alive()
    assert gate.check_invariants() == []
