"""What one dashboard poll costs, as the ledger grows, next to one query per row; and the read deadline's cost.

For each backend and ledger size (waiting requests, with as many audit entries):

- ``snapshot``: ``Quotagate.dashboard()``, the whole of one poll of ``/v1/dashboard``;
- ``per-row``: the baseline, measured in the same run — what the queue view would cost
  built from the per-request API instead, ``explain`` for each of the 50 rows it shows;
- ``cohorts``: the same poll once every tenant is a member of one cohort, so each queue
  row's reason is the dry run's verdict (docs/decisions/610); its ratio to ``snapshot``
  is what the verdicts cost;
- ``show`` with the read deadline (5 s) and without (0): one small read-only view.

Prints the median of ``--repeat`` runs in milliseconds.

    .venv/bin/python benchmarks/dashboard.py [--backends sqlite,postgresql,mysql] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from _timing import median_ms
from quotagate import Quotagate
from quotagate.cli.common import render_table
from quotagate.domain.ordering import queue_key
from quotagate.store import schema
from quotagate.store.engine import create_engine

TENANTS = 10


def _fill(gate: Quotagate, waiting: int) -> list[str]:
    """``waiting`` requests that cannot be admitted (quota 0 room), and their audit entries."""
    gate.set_pool("main", {"gpu": 1_000_000})
    for index in range(TENANTS):
        gate.set_tenant(f"team-{index}", {"gpu": 1})
    now = gate.clock.now() - waiting
    requests, entries = [], []
    for number in range(waiting):
        tenant = f"team-{number % TENANTS}"
        created = now + number * 0.5
        request_id = f"job-{number:07d}"
        requests.append({
            "id": request_id, "tenant": tenant, "state": "waiting", "cost": '{"gpu":2}',
            "priority": number % 5, "payload": "null", "target": None, "pool": None,
            "queue_key": queue_key(number % 5, created, 30.0), "created": created,
            "updated": created, "reason": None,
        })
        entries.append({"at": created, "actor": "bench", "tenant": tenant, "operation": "submit",
                        "target": request_id, "outcome": "accepted", "reason": None})
    with gate.engine.begin() as connection:
        for start in range(0, waiting, 5000):
            connection.execute(schema.request.insert(), requests[start:start + 5000])
            connection.execute(schema.audit.insert(), entries[start:start + 5000])
    return [row["id"] for row in requests]


def measure(backend: str, size: int, repeat: int) -> list[str]:
    print(f"{backend}: {size} waiting requests…", file=sys.stderr)
    with throwaway_database(backend) as url, Quotagate.connect(url) as gate:
        first = _fill(gate, size)[0]
        head = [entry.id for entry in gate.dashboard().queue]
        assert len(head) == 50
        snapshot = median_ms(gate.dashboard, repeat)
        per_row = median_ms(lambda: [gate.explain(request_id) for request_id in head],
                             max(3, repeat // 4))
        with_deadline = median_ms(lambda: gate.show(first), repeat * 5)
        bare = Quotagate(create_engine(url, read_timeout=0), clock=gate.clock)
        try:
            without_deadline = median_ms(lambda: bare.show(first), repeat * 5)
        finally:
            bare.close()
        gate.set_cohort("org")
        for index in range(TENANTS):
            gate.set_tenant(f"team-{index}", {}, cohort="org")
        assert all(row.cohort == "org" for row in gate.dashboard().tenants)
        shared = median_ms(gate.dashboard, repeat)
    return [backend, str(size), f"{snapshot:.1f}", f"{per_row:.1f}",
            f"{per_row / snapshot:.1f}x", f"{shared:.1f}", f"{shared / snapshot:.2f}x",
            f"{with_deadline:.2f}", f"{without_deadline:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="smaller ledgers, fewer repeats")
    arguments = parser.parse_args()
    sizes = [1_000, 5_000] if arguments.quick else [1_000, 20_000]
    repeat = 8 if arguments.quick else 20
    table = []
    for backend in arguments.backends.split(","):
        try:
            table += [measure(backend, size, repeat) for size in sizes]
        except ServerUnavailable as error:
            print(f"{backend}: skipped ({error})", file=sys.stderr)
    headers = ["backend", "waiting", "snapshot ms", "per-row ms (baseline)", "per-row/snapshot",
               "cohorts ms", "cohorts/snapshot", "show ms (deadline 5 s)", "show ms (no deadline)"]
    print(render_table(headers, table))


if __name__ == "__main__":
    main()
