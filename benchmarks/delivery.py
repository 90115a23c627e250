"""Delivery throughput: the fenced dispatcher next to the same batched writes unfenced.

Both variants do the same work per batch of 64 against the same database: claim
the batch's outbox rows in one transaction, deliver each request to the target,
then write every binding, outbox and request mark and audit row of the batch in
one transaction. The dispatcher adds what fencing and the engine cost: a locking
read of its lease row and a check of each row's claim in both transactions, the
lease-liveness test in the claim query, and its thread pool. The target is an
in-memory dictionary, so the numbers are the ledger's side of delivery, not an
executor's.

Rounds alternate (fenced, baseline, fenced, …) on fresh requests so that load
from other processes on the machine hits both alike.

    .venv/bin/python benchmarks/delivery.py [--backends sqlite,postgresql,mysql] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).parent))

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetConfig
from quotagate.delivery.targets.base import DeliverySpec, ExternalObject, Outcome, StopResult
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import database_now, run_transaction, supports_skip_locked

BATCH = 64


class MemoryTarget:
    kind = "memory"

    def __init__(self) -> None:
        self.objects: dict[str, ExternalObject] = {}

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        found = self.objects.setdefault(
            spec.external_name,
            ExternalObject(spec.external_name, f"uid-{len(self.objects)}", spec.request_id),
        )
        return found

    def read(self, name: str) -> ExternalObject | None:
        return self.objects.get(name)

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        return {}

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        self.objects.pop(obtained.name, None)
        return StopResult(stopped=True)

    def close(self) -> None:
        pass


def prepare(gate: Quotagate, prefix: str, count: int) -> None:
    for index in range(count):
        gate.submit(f"{prefix}-{index:05d}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle(batch=64) == count


def fenced(gate: Quotagate, target: MemoryTarget) -> int:
    dispatcher = Dispatcher(gate, worker_name="bench", batch=BATCH, observe_limit=0)
    config = TargetConfig("memory", "memory", {}, True)
    dispatcher.built.get = lambda _name: (config, target)  # type: ignore[method-assign,assignment]
    delivered = 0
    while True:
        moved = dispatcher.run_once()
        if moved == 0:
            break
        delivered += moved
    dispatcher.release()
    return delivered


def unfenced(gate: Quotagate, target: MemoryTarget) -> int:
    """The dispatcher's batches without lease lock, claim checks or thread pool."""
    outbox, request, binding = schema.outbox, schema.request, schema.binding
    delivered = 0
    while True:
        def claim(connection: sa.Connection) -> tuple[list[Any], dict[str, Any]]:
            query = (
                sa.select(outbox.c.request_id, outbox.c.tenant, outbox.c.claim_token)
                .where(outbox.c.delivered == sa.false(), outbox.c.claimed_by.is_(None))
                .order_by(outbox.c.next_attempt_at, outbox.c.request_id).limit(BATCH)
            )
            if supports_skip_locked(connection):
                query = query.with_for_update(skip_locked=True)
            rows = connection.execute(query).all()
            if not rows:
                return [], {}
            ids = [row.request_id for row in rows]
            connection.execute(
                outbox.update().where(outbox.c.request_id.in_(ids)).values(
                    claimed_by="raw", claim_generation=1, claim_token=outbox.c.claim_token + 1,
                    claimed_until=database_now(connection) + 120,
                ))
            requests = {found.id: found for found in connection.execute(
                sa.select(request.c.id, request.c.cost, request.c.payload)
                .where(request.c.id.in_(ids))
            )}
            return list(rows), requests

        rows, requests = run_transaction(gate.engine, claim)
        if not rows:
            return delivered
        created = [
            (row, target.create_if_absent(DeliverySpec(
                row.request_id, row.tenant, json.loads(requests[row.request_id].cost),
                json.loads(requests[row.request_id].payload), row.claim_token + 1,
                f"raw-{row.request_id}", gate.ledger_id,
            )))
            for row in rows
        ]

        def mark(connection: sa.Connection, created: list[Any] = created) -> None:
            ids = sorted(row.request_id for row, _obtained in created)
            connection.execute(
                sa.select(request.c.state).where(request.c.id.in_(ids))
                .order_by(request.c.id).with_for_update()
            ).all()
            now = time.time()
            connection.execute(binding.insert(), [
                {"request_id": row.request_id, "target": "memory",
                 "external_name": obtained.name, "uid": obtained.uid,
                 "fencing_token": row.claim_token + 1, "created": now}
                for row, obtained in created
            ])
            connection.execute(outbox.update().where(outbox.c.request_id.in_(ids))
                               .values(delivered=True, delivered_at=now))
            connection.execute(request.update().where(request.c.id.in_(ids))
                               .values(state=RequestState.DELIVERED.value, updated=now))
            record(connection, now, *(
                AuditEntry("raw", "deliver", "delivered", row.tenant, row.request_id)
                for row, _obtained in created
            ))

        run_transaction(gate.engine, mark)
        delivered += len(created)


def measure(backend: str, rounds: int, count: int) -> dict[str, Any]:
    with throwaway_database(backend) as url, Quotagate.connect(url) as gate:
        gate.set_tenant("team-a", {"gpu": 10**9})
        gate.set_pool("pool-1", {"gpu": 10**9})
        rates: dict[str, list[float]] = {"fenced": [], "unfenced": []}
        for round_number in range(rounds):
            for variant, deliver in (("fenced", fenced), ("unfenced", unfenced)):
                prepare(gate, f"{variant}-{round_number}", count)
                target = MemoryTarget()
                started = time.perf_counter()
                delivered = deliver(gate, target)
                elapsed = time.perf_counter() - started
                assert delivered == count == len(target.objects), (variant, delivered)
                rates[variant].append(delivered / elapsed)
                print(f"  {backend} round {round_number + 1} {variant}: "
                      f"{delivered / elapsed:.0f}/s", file=sys.stderr)
        violations = gate.check_invariants()
        assert violations == [], violations
        return {variant: statistics.median(values) for variant, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds")
    arguments = parser.parse_args()
    rounds, count = (2, 300) if arguments.quick else (3, 1000)
    print(f"deliveries per second, median of {rounds} alternating rounds of {count} requests, "
          f"one worker, batches of {BATCH}, in-memory target")
    print(f"{'backend':<12}{'fenced (dispatcher)':>22}{'unfenced baseline':>20}{'fencing cost':>15}")
    for backend in arguments.backends.split(","):
        try:
            result = measure(backend, rounds, count)
        except ServerUnavailable as error:
            print(f"{backend:<12}skipped: {error}")
            continue
        cost = 1 - result["fenced"] / result["unfenced"]
        print(f"{backend:<12}{result['fenced']:>22.0f}{result['unfenced']:>20.0f}{cost:>14.0%}")


if __name__ == "__main__":
    main()
