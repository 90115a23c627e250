"""Processes for the max-runtime stop tests (spawned: importable, top level)."""

from __future__ import annotations

from typing import Any

from quotagate import Quotagate
from quotagate.store.overruns import stop_overruns


def stop_overruns_at(url: str, now: float, name: str, barrier: Any, results: Any) -> None:
    """Look for overruns at ``now`` together with the other processes; the ids it moved."""
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()  # connect before the race starts
        barrier.wait(timeout=120)
        results.put(stop_overruns(gate.engine, now, actor=f"worker:{name}"))
