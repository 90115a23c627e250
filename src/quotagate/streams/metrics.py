"""Process-wide stream counters with ``tenant`` and ``topic`` labels, and the lag gauge.

Plain numbers behind a lock, module-wide (the delivery counters are the app's
instead, docs/decisions/903): producers and consumers count here whatever
process they run in, and ``/metrics`` exports them
(``observability.metrics.StreamStatsCollector``). Lag and trimmed entries
are gauges: the last value a consumer or a status read saw.
"""

from __future__ import annotations

import threading

COUNTERS = {
    "produced": "Messages appended to a topic",
    "refused": "Messages refused by the topic's rate quota",
    "consumed": "Entries handed to a consumer's handler",
    "acked": "Entries acknowledged",
    "redelivered": "Entries claimed again after their visibility timeout",
    "dead_lettered": "Entries moved to the DLQ after their last delivery",
    "stale": "Consumer writes refused because a newer lease generation owns the partition",
}

_lock = threading.Lock()
_counters: dict[tuple[str, str, str], float] = {}
_gauges: dict[tuple[str, str, str, str], float] = {}
GAUGES = {
    "lag": "Entries of a topic not yet delivered to a group (last seen)",
    "trimmed": "Entries trimmed from a topic by its max length (last seen)",
}


def increment(name: str, tenant: str, topic: str, amount: float = 1) -> None:
    if name not in COUNTERS:
        raise KeyError(f"unknown stream counter {name!r}")
    if amount <= 0:
        return
    with _lock:
        key = (name, tenant, topic)
        _counters[key] = _counters.get(key, 0) + amount


def set_gauge(name: str, tenant: str, topic: str, group: str, value: float) -> None:
    if name not in GAUGES:
        raise KeyError(f"unknown stream gauge {name!r}")
    with _lock:
        _gauges[(name, tenant, topic, group)] = value


def snapshot() -> tuple[dict[tuple[str, str, str], float], dict[tuple[str, str, str, str], float]]:
    """(counters by (name, tenant, topic), gauges by (name, tenant, topic, group))."""
    with _lock:
        return dict(_counters), dict(_gauges)


def count(name: str, tenant: str, topic: str) -> float:
    with _lock:
        return _counters.get((name, tenant, topic), 0)


def reset() -> None:
    with _lock:
        _counters.clear()
        _gauges.clear()
