"""``serve``'s database pool: fixed, never exceeded, and HTTP calls queue for it on the
event loop (docs/decisions/314-serve-connection-pool.md).

The application runs in-process on the real database, served by uvicorn in a thread
through the same ``run_server`` as ``quotagate serve``, and is called over HTTP by
many real threads at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import anyio.from_thread
import anyio.to_thread
import httpx
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.auth.authorizer import Actor, default_authorizer
from quotagate.cli.server import serve
from quotagate.http import create_app
from quotagate.http.connections import DEFAULT_CONNECTIONS, http_threads
from support import cli
from support.http_servers import bearer, make_token, serving

CONNECTIONS = 4
CALLERS = 24  # six times the pool, and more than AnyIO's threads left to themselves would be


def test_more_concurrent_calls_than_connections_all_succeed_on_a_warm_fixed_pool(
    db_url: str,
) -> None:
    admin, tenant = make_token(db_url), make_token(db_url, tenant="team-a")
    threads = http_threads(CONNECTIONS, workers=False, retention=False)
    with Quotagate.connect(db_url, connections=CONNECTIONS) as gate:
        opened: list[int] = []
        holders: set[str] = set()

        def on_connect(*_: Any) -> None:
            opened.append(1)

        def on_checkout(*_: Any) -> None:
            holders.add(threading.current_thread().name)

        # Called on the worker thread of each call: what bounds those threads on the
        # loop that serves it, and how many calls run at once.
        limits: set[float] = set()
        running = [0, 0]  # now, most at once
        lock = threading.Lock()

        def authorizer(tenant_name: str | None, actor: Actor, operation: str) -> bool:
            with lock:
                running[0] += 1
                running[1] = max(running)
            limits.add(anyio.from_thread.run_sync(
                lambda: anyio.to_thread.current_default_thread_limiter().total_tokens))
            with lock:
                running[0] -= 1
            return default_authorizer(tenant_name, actor, operation)

        sa.event.listen(gate.engine, "connect", on_connect)
        sa.event.listen(gate.engine, "checkout", on_checkout)
        with serving(create_app(gate, authorizer=authorizer), threads=threads) as url, \
                httpx.Client(base_url=url, timeout=60) as client, \
                concurrent.futures.ThreadPoolExecutor(CALLERS) as callers:
            client.put("/v1/pools/main", json={"capacity": {"gpu": 10_000}},
                       headers=bearer(admin)).raise_for_status()
            client.put("/v1/tenants/team-a", json={"quota": {"gpu": 10_000}},
                       headers=bearer(admin)).raise_for_status()

            def submit(number: int) -> int:
                response = client.post("/v1/tenants/team-a/requests", headers=bearer(tenant),
                                       json={"id": f"job-{number}", "cost": {"gpu": 1}})
                return response.status_code

            warm_up = list(callers.map(submit, range(CALLERS * 2)))
            opened_warm = len(opened)
            rest = list(callers.map(submit, range(CALLERS * 2, CALLERS * 6)))

        assert warm_up + rest == [202] * (CALLERS * 6)
        assert opened_warm <= CONNECTIONS
        assert len(opened) == opened_warm, "a warm pool opened connections again"
        assert limits == {threads}
        assert 0 < running[1] <= threads
        workers = {name for name in holders if name.startswith("AnyIO worker")}
        assert 0 < len(workers) <= threads
        assert gate.check_invariants() == []


def test_too_few_connections_for_serves_own_threads_is_refused_before_anything_opens(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    result = cli.run("serve", "--db-connections", "6", db=db, cwd=tmp_path, expect=2)
    assert "invalid_connections" in result.stderr
    assert "at least 8" in result.stderr
    assert not (tmp_path / "ledger.db").exists()
    result = cli.run("serve", "--db-connections", "7", "--prune-older-than", "30d", db=db,
                     cwd=tmp_path, expect=2, env={"QUOTAGATE_DB_CONNECTIONS": "3"})
    assert "at least 9" in result.stderr
    assert not (tmp_path / "ledger.db").exists()


def test_the_option_from_the_environment(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    result = cli.run("serve", "--no-workers", db=db, cwd=tmp_path, expect=2,
                     env={"QUOTAGATE_DB_CONNECTIONS": "1"})
    assert "--db-connections" in result.stderr
    assert not (tmp_path / "ledger.db").exists()


def test_the_option_default_is_the_modules() -> None:
    option = next(param for param in serve.params if param.name == "db_connections")
    assert option.default == DEFAULT_CONNECTIONS
