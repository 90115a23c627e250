"""Functions run in child processes by the concurrency tests (importable for spawn)."""

from __future__ import annotations

import random
import time
from typing import Any

from quotagate import Quotagate


def admit_until_done(url: str, stop_after_idle: float, batch: int, results: Any) -> None:
    """Admit until nothing has fitted for ``stop_after_idle`` seconds in a row."""
    admitted = 0
    with Quotagate.connect(url) as gate:
        idle_since: float | None = None
        while True:
            placed = gate.admit(batch)
            if placed:
                admitted += len(placed)
                idle_since = None
                continue
            now = time.monotonic()
            idle_since = idle_since or now
            if now - idle_since > stop_after_idle:
                break
            time.sleep(0.01)
    results.put(admitted)


def submit_many(url: str, prefix: str, count: int, seed: int, results: Any) -> None:
    generator = random.Random(seed)
    created = 0
    with Quotagate.connect(url) as gate:
        for index in range(count):
            tenant = generator.choice(["team-a", "team-b", "team-c"])
            cost = {"gpu": generator.randint(1, 2), "cpu": generator.randint(1, 8)}
            if generator.random() < 0.3:
                cost = {"cpu": generator.randint(1, 4)}
            result = gate.submit(f"{prefix}-{index}", tenant, cost, priority=generator.randint(0, 3))
            created += result.created
    results.put(created)


def release_one(url: str, request_id: str, barrier: Any, results: Any) -> None:
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()  # connect before the race starts
        barrier.wait()
        result = gate.complete(request_id)
    results.put(result.released)
