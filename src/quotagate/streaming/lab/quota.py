"""Quota: six real threads over two tenants whose buckets hold five tokens each.

Each submission takes its token in one conditional update (docs/rate-quotas.md):
every tenant gets exactly what it asked for while tokens last, and the tenants,
on different rows, never disturb each other.
"""

from __future__ import annotations

import threading
from pathlib import Path

from quotagate.app import Quotagate
from quotagate.domain.model import RequestState
from quotagate.errors import RateLimited
from quotagate.streaming.lab.observations import Observation

TENANTS = {"tenantA": "tenant-a", "tenantB": "tenant-b"}
TOKENS_EACH = 5
THREADS_PER_TENANT = 3


def run(url: str, _workdir: Path) -> list[Observation]:
    with Quotagate.connect(url) as gate:
        gate.init()
        gate.set_pool("lab-pool", {"slots": 100})
        for tenant in TENANTS.values():
            gate.set_tenant(tenant, {"slots": 100})
            gate.set_rate(tenant, {"capacity": TOKENS_EACH, "refill_per_second": 0})
        submitted: dict[str, list[str]] = {tenant: [] for tenant in TENANTS.values()}
        lock = threading.Lock()
        start = threading.Barrier(len(TENANTS) * THREADS_PER_TENANT)
        errors: list[BaseException] = []

        def submit(tenant: str, request_id: str) -> None:
            start.wait()
            try:
                gate.submit(request_id, tenant, {"slots": 1})
            except RateLimited:
                pass  # recorded as rejected; counted from the database below
            except BaseException as error:  # reported after the join, not swallowed
                errors.append(error)
            with lock:
                submitted[tenant].append(request_id)

        threads = [
            threading.Thread(target=submit, args=(tenant, f"{tenant}-job-{index}"))
            for tenant in TENANTS.values() for index in range(THREADS_PER_TENANT)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        # Everything printed is read back from the ledger, not taken from the threads.
        accepted = {
            label: sum(gate.show(request_id).state != RequestState.REJECTED for request_id in submitted[tenant])
            for label, tenant in TENANTS.items()
        }
        remaining = {label: _tokens(gate, tenant) for label, tenant in TENANTS.items()}
    requested = {len(ids) for ids in submitted.values()}
    return [
        Observation("quotaRequests", {**accepted, "total": sum(accepted.values())}),
        Observation("quotaRemaining", {**remaining, "requestedEach": requested.pop() if len(requested) == 1
                                       else "/".join(str(len(ids)) for ids in submitted.values())}),
    ]


def _tokens(gate: Quotagate, tenant: str) -> float:
    status = gate.rate_status(tenant)
    if status is None:
        raise AssertionError(f"tenant {tenant!r} lost its bucket during the lab")
    return float(status["tokens"])
