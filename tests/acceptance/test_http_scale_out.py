"""Two `serve` processes on one PostgreSQL or MariaDB, hammered by concurrent clients.

Pairs of clients submit the same ids with the same content (idempotent
replays, through different servers) and race to complete the same requests;
both servers run admission at the same time. All along, a monitor reads the
ledger in consistent snapshots: nothing oversold, usage equal to the charged
costs, promise ⇔ outbox. At the end invariants 1-3 (docs/invariants.md) hold and everything was returned.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from quotagate import Quotagate
from quotagate.store import schema
from quotagate.store.engine import create_engine
from quotagate.store.views import LedgerViews
from support.databases import fresh_database
from support.http_servers import bearer, make_token, running_server
from support.worker_processes import table

CLIENTS = 4
REQUESTS_PER_CLIENT = 30
DEADLINE = 120.0
TENANT_QUOTAS = {"team-a": {"gpu": 3}, "team-b": {"gpu": 4}}
POOLS = {"pool-1": {"gpu": 4}, "pool-2": {"gpu": 2}}


def run_client(urls: list[str], token: str, tenant: str, ids: list[str],
               admin_token: str) -> dict[str, Any]:
    """Submit every id, then complete each one once it is admitted; alternate servers.

    The tenant submits; the completions stand for its executor, with an admin
    token (a tenant token may not end charged work). The servers have no target, so
    their workers' delivery attempts fail: an admin's complete between two attempts
    ends the request at once (200), one during an attempt, or after one failed, is a
    stop (202 ``completing``) the workers confirm (docs/decisions/819, 821); the loop
    waits for ``completed`` either way.
    """
    statuses: dict[str, int] = {}
    released_total = 0
    clients = [httpx.Client(base_url=url, headers=bearer(token), timeout=60) for url in urls]
    enders = [httpx.Client(base_url=url, headers=bearer(admin_token), timeout=60) for url in urls]
    try:
        for index, request_id in enumerate(ids):
            client = clients[index % len(clients)]
            response = client.post(f"/v1/tenants/{tenant}/requests",
                                   json={"id": request_id, "cost": {"gpu": 1 + index % 2},
                                         "payload": {"n": index}})
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
        remaining = list(ids)
        until = time.monotonic() + DEADLINE
        turn = 0
        while remaining and time.monotonic() < until:
            still = []
            for request_id in remaining:
                turn += 1
                client = clients[turn % len(clients)]
                state = client.get(f"/v1/tenants/{tenant}/requests/{request_id}").json()["state"]
                if state in ("reserved", "delivered"):
                    ender = enders[turn % len(enders)]
                    done = ender.post(f"/v1/tenants/{tenant}/requests/{request_id}/complete")
                    assert done.status_code in (200, 202), done.text
                    released_total += sum(done.json()["released"].values())
                elif state != "completed":
                    still.append(request_id)
            remaining = still
            if remaining:
                time.sleep(0.05)
        return {"statuses": statuses, "released": released_total, "left": remaining}
    finally:
        for client in [*clients, *enders]:
            client.close()


class Monitor:
    """Checks the invariants over and over while the clients run.

    REPEATABLE READ: each check reads the requests, outbox and usage in one
    snapshot, so a violation it reports was there, not an artefact of reading
    tables at different moments.
    """

    def __init__(self, db_url: str) -> None:
        self.engine = create_engine(db_url, isolation_level="REPEATABLE READ")
        self.views = LedgerViews(self.engine)
        self.checks = 0
        self.charged_seen = 0
        self.violations: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="monitor")

    def _run(self) -> None:
        while not self.stop.is_set():
            found = self.views.check_invariants()
            self.violations.extend(found)
            usage = self.views.usage()
            self.charged_seen += any(row["used"] for row in usage["tenants"])
            self.checks += 1
            self.stop.wait(0.02)

    def __enter__(self) -> Monitor:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgresql),
                                     pytest.param("mysql", marks=pytest.mark.mysql)])
def test_two_servers_and_concurrent_clients_keep_the_invariants(
    tmp_path: Path, backend: str
) -> None:
    with fresh_database(backend, tmp_path) as db_url:
        admin = make_token(db_url)
        with running_server(db_url, tmp_path) as first, running_server(db_url, tmp_path) as second:
            for pool, capacity in POOLS.items():
                httpx.put(f"{first.url}/v1/pools/{pool}", json={"capacity": capacity},
                          headers=bearer(admin)).raise_for_status()
            for tenant, quota in TENANT_QUOTAS.items():
                httpx.put(f"{second.url}/v1/tenants/{tenant}", json={"quota": quota},
                          headers=bearer(admin)).raise_for_status()
            tokens = {tenant: make_token(db_url, tenant=tenant) for tenant in TENANT_QUOTAS}
            tenants = list(TENANT_QUOTAS)
            # Clients 0 and 1 share ids (team-a), clients 2 and 3 share ids (team-b).
            jobs = []
            for client in range(CLIENTS):
                tenant = tenants[client // 2]
                ids = [f"{tenant}-{n}" for n in range(REQUESTS_PER_CLIENT)]
                urls = [first.url, second.url] if client % 2 else [second.url, first.url]
                jobs.append((urls, tokens[tenant], tenant, ids, admin))
            context = multiprocessing.get_context("spawn")
            with Monitor(db_url) as monitor, ProcessPoolExecutor(CLIENTS,
                                                                 mp_context=context) as pool:
                results = list(pool.map(run_client, *zip(*jobs, strict=True)))
            first_status, second_status = first.stop(), second.stop()
        assert first_status == second_status == 0
        # Checked during the run, and while work was charged, not only at the end.
        assert monitor.violations == [], monitor.violations[:10]
        assert monitor.checks >= 10 and monitor.charged_seen >= 3, (
            monitor.checks, monitor.charged_seen)

        assert all(not result["left"] for result in results), results
        for pair in (results[0:2], results[2:4]):
            statuses: dict[str, int] = {}
            for result in pair:
                for status, count in result["statuses"].items():
                    statuses[status] = statuses.get(status, 0) + count
            # Each id is new exactly once; its twin submission is a replay.
            assert statuses == {"202": REQUESTS_PER_CLIENT, "200": REQUESTS_PER_CLIENT}, statuses
            # Racing completes return each request's cost at most once; the rest came
            # back through confirmed stops (counted below, from the audit).
            expected = sum(1 + n % 2 for n in range(REQUESTS_PER_CLIENT))
            assert sum(result["released"] for result in pair) <= expected
        with Quotagate.connect(db_url) as gate:
            assert gate.check_invariants() == []
            rows = gate.inspect(limit=1000)
            assert len(rows["requests"]) == len(TENANT_QUOTAS) * REQUESTS_PER_CLIENT
            assert {row["state"] for row in rows["requests"]} == {"completed"}
            # Each request's cost came back exactly once: one end that released it.
            releases = Counter(row["target"] for row in table(gate, schema.audit)
                               if row["operation"] == "completed" and row["outcome"] == "released")
            assert set(releases.values()) == {1} and len(releases) == len(rows["requests"])
            assert all(row["used"] == 0 for row in rows["tenants"] + rows["pools"])
