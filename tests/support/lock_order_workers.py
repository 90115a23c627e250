"""Processes for the lock-order tests (spawned: importable, top level).

Each one does a fixed number of operations and answers how many deadlocks
its own transactions met: the admission's rerun counter for an admitter,
``run_transaction``'s retry hook for a releaser (the same call
``Ledger.release_many`` makes, with the hook that hears every rerun).
"""

from __future__ import annotations

import random
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from quotagate import Quotagate
from quotagate.domain.model import RequestState
from quotagate.store import admission_stats, schema
from quotagate.store.dialect import retry_cause, run_transaction
from quotagate.store.release import End, release_batch


def _end(connection: sa.Connection, ends: list[End], now: float) -> list[Any]:
    return list(release_batch(connection, ends, now))


class _CountingReleaser:
    """Ends batches as ``Ledger.release_many`` does, counting the reruns a deadlock caused."""

    def __init__(self, gate: Quotagate) -> None:
        self.gate = gate
        self.deadlocks = 0

    def heard(self, error: DBAPIError) -> None:
        self.deadlocks += retry_cause(error) == "deadlock"

    def end(self, ends: list[End]) -> list[Any]:
        return run_transaction(
            self.gate.engine, partial(_end, ends=ends, now=self.gate.ledger.clock.now()),
            on_retry=self.heard)


def admit_rounds(url: str, rounds: int, batch: int, barrier: Any, results: Any) -> None:
    """``rounds`` admission passes of up to ``batch``; answers (admitted, deadlocks, bound hits)."""
    admitted = 0
    bound_hits = 0
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()
        barrier.wait(timeout=120)
        for _ in range(rounds):
            before = admission_stats.snapshot().reruns["stale_snapshot"]
            admitted += len(gate.admit(batch))
            # Ledger.admit gives up after 50 reruns of one call.
            if admission_stats.snapshot().reruns["stale_snapshot"] - before >= 50:
                bound_hits += 1
    results.put(("admit", admitted, admission_stats.snapshot().reruns["deadlock"], bound_hits))


def release_rounds(url: str, rounds: int, batch: int, seed: int, barrier: Any,
                   results: Any) -> None:
    """``rounds`` batched releases of up to ``batch`` reserved requests of any tenants."""
    generator = random.Random(seed)
    released = 0
    request = schema.request
    with Quotagate.connect(url) as gate:
        releaser = _CountingReleaser(gate)
        gate.engine.connect().close()
        barrier.wait(timeout=120)
        for _ in range(rounds):
            with gate.engine.connect() as connection:
                reserved = list(connection.execute(
                    sa.select(request.c.id).where(request.c.state == "reserved")
                    .order_by(request.c.id)).scalars())
            chosen = generator.sample(reserved, min(batch, len(reserved)))
            if not chosen:
                continue
            ends = [End(request_id, RequestState.COMPLETED, actor="releaser")
                    for request_id in chosen]
            answers = releaser.end(ends)
            released += sum(1 for answer in answers
                            if not isinstance(answer, Exception) and answer.released)
    results.put(("release", released, releaser.deadlocks, 0))


def confirm_stop_rounds(url: str, rounds: int, seed: int, barrier: Any, results: Any) -> None:
    """``rounds`` passes of a stand-in worker confirming every preempting request's stop,
    each batch with one reserved request completed too (a batch that takes the
    decision lock while it holds a row a preemption could choose)."""
    generator = random.Random(seed)
    confirmed = 0
    request = schema.request
    with Quotagate.connect(url) as gate:
        releaser = _CountingReleaser(gate)
        gate.engine.connect().close()
        barrier.wait(timeout=120)
        batches = 0
        # Polls are bounded too: a run in which nothing is preempted ends as well.
        for _ in range(rounds * 50):
            if batches == rounds:
                break
            with gate.engine.connect() as connection:
                rows = connection.execute(
                    sa.select(request.c.id, request.c.state)
                    .where(request.c.state.in_(["preempting", "reserved"]))
                    .order_by(request.c.id)).all()
            stopping = [row.id for row in rows if row.state == "preempting"]
            reserved = [row.id for row in rows if row.state == "reserved"]
            ends = [End(request_id, RequestState.CANCELLED, actor="worker", stopped=True)
                    for request_id in stopping]
            if reserved:
                ends.append(End(generator.choice(reserved), RequestState.COMPLETED,
                                actor="worker"))
            if not stopping:
                continue
            batches += 1
            answers = releaser.end(ends)
            confirmed += sum(1 for end, answer in zip(ends, answers, strict=True)
                             if end.stopped and not isinstance(answer, Exception)
                             and answer.released)
    results.put(("stop", confirmed, releaser.deadlocks, 0))
