"""Processes for the budget tests (spawned: importable, top level)."""

from __future__ import annotations

import os
import signal
from typing import Any

from quotagate import Quotagate


def admit_all(url: str, barrier: Any, results: Any) -> None:
    """Admit one at a time, together with the other admitters, until nothing fits."""
    admitted = []
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()  # connect before the race starts
        barrier.wait(timeout=120)
        while placed := gate.admit(1):
            admitted += [placement.id for placement in placed]
    results.put(admitted)


def admit_and_die(url: str, admitted: Any) -> None:
    """Admit what fits, say so, and die by SIGKILL before anything is released."""
    with Quotagate.connect(url) as gate:
        placed = gate.admit(4)
        admitted.put([placement.id for placement in placed])
        admitted.close()
        admitted.join_thread()  # the answer is out before the process dies
        os.kill(os.getpid(), signal.SIGKILL)


def admit_and_release(url: str, rounds: int, barrier: Any, results: Any) -> None:
    """Admit one and complete it at once, ``rounds`` times, racing the other processes:
    admissions and the releases that accrue usage interleave on the same budget rows."""
    admitted = 0
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()
        barrier.wait(timeout=120)
        for _ in range(rounds):
            for placement in gate.admit(1):
                admitted += 1
                gate.complete(placement.id)
    results.put(admitted)
