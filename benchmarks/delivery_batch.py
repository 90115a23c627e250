"""A delivery batch's claim and record, timed and counted (docs/decisions/253, 254).

    .venv/bin/python benchmarks/delivery_batch.py [--backend postgresql] [--requests 4000]
        [--batch 64] [--show]

On one throwaway ledger, ``--requests`` requests are submitted and admitted;
then one worker claims a batch (``OutboxStore.claim_work``) and records it
delivered (``record_deliveries``), batch after batch, until none is left, as the
dispatcher does without its targets. Printed: wall and CPU time
(``time.process_time``) per claim and per record, the median of all batches and
of the first and last ten (the outbox grows dead rows as it goes, and a plan
that reads them shows there), and the round trips of one batch, counted at the
driver as ``benchmarks/end_round_trips.py`` counts them (``--show`` lists them;
not on SQLite).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from _databases import throwaway_database
from end_round_trips import _count, _patched, _shown
from quotagate import Quotagate
from quotagate.delivery.registry import TargetStore
from quotagate.domain.external_object import ExternalObject
from quotagate.store.outbox import OutboxStore

COUNTED_BATCH = 20  # the batch whose round trips are counted: past the first compiles


def _median(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1000:.2f} ms (first 10 "
            f"{statistics.median(values[:10]) * 1000:.2f}, last 10 "
            f"{statistics.median(values[-10:]) * 1000:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="postgresql",
                        choices=("sqlite", "postgresql", "mysql"))
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--show", action="store_true", help="print each command counted")
    options = parser.parse_args()
    with throwaway_database(options.backend) as url, Quotagate.connect(url) as gate:
        gate.set_pool("main", {"gpu": 10**6})
        gate.set_tenant("team-a", {"gpu": 10**6})
        TargetStore(gate.engine).set("hook", "webhook", {"url": "http://127.0.0.1:9/"},
                                     default=True)
        for start in range(0, options.requests, 500):
            gate.submit_many("team-a", [{"id": f"b-{index:06}", "cost": {"gpu": 1}}
                                        for index in range(start, min(start + 500,
                                                                      options.requests))])
        gate.admit_until_idle(batch=64)
        outbox = OutboxStore(gate.engine, gate.leases, gate.clock)
        lease = gate.leases.acquire("worker/bench", "bench", 600.0)
        assert lease is not None
        times: dict[str, list[float]] = {"claim wall": [], "claim cpu": [], "record wall": [],
                                         "record cpu": []}
        trips = ""
        for number in range(options.requests // options.batch):
            counted = number == COUNTED_BATCH and options.backend != "sqlite"
            if counted:
                _count[0] = 0
                _shown.clear()
            with _patched(options.backend) if counted else contextlib.nullcontext():
                wall, cpu = time.perf_counter(), time.process_time()
                claims = outbox.claim_work(lease, options.batch)
                times["claim wall"].append(time.perf_counter() - wall)
                times["claim cpu"].append(time.process_time() - cpu)
                claim_trips = _count[0]
                wall, cpu = time.perf_counter(), time.process_time()
                outbox.record_deliveries(lease, [
                    (claim, "hook", ExternalObject(f"o-{claim.request_id}", None,
                                                   claim.request_id))
                    for claim in claims], actor="bench")
                times["record wall"].append(time.perf_counter() - wall)
                times["record cpu"].append(time.process_time() - cpu)
            if counted:
                trips = f"round trips: claim {claim_trips}, record {_count[0] - claim_trips}"
                if options.show:
                    trips += "".join(f"\n    {line}" for line in _shown)
        violations = gate.check_invariants()
        assert violations == [], violations
    print(f"{options.backend}, {options.requests} requests, batches of {options.batch}")
    for name, values in times.items():
        print(f"  {name:12} {_median(values)}")
    if trips:
        print(f"  {trips}")


if __name__ == "__main__":
    main()
