"""Submit throughput over HTTP (1 and 2 `serve` processes) next to the Python API.

The same workload three ways in one run, on one throwaway database: client
processes submit new requests (one transaction and one audit row each)

* through the Python API (``Quotagate.submit``) directly — the baseline;
* over HTTP to one ``quotagate serve --no-workers`` process;
* over HTTP to two such processes, clients split between them.

Admission is off (``--no-workers``) so only submission is measured. Every
client process connects and warms up first; the clock runs from when all are
ready (a barrier) to when the last finishes. About a minute with the defaults.

    .venv/bin/python benchmarks/api.py [--backend postgresql] [--requests 600] [--clients 4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from quotagate import Quotagate
from quotagate.auth.tokens import TokenStore
from quotagate.cli.common import render_table

QUOTAGATE = str(Path(sys.executable).with_name("quotagate"))
Barrier = Any  # multiprocessing.synchronize.Barrier, which is not generic-friendly


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve(db_url: str) -> Iterator[str]:
    port = _free_port()
    environment = {key: value for key, value in os.environ.items() if key != "QUOTAGATE_DB"}
    process = subprocess.Popen(
        [QUOTAGATE, "serve", "--no-workers", "--port", str(port), "--log-level", "warning",
         "--db", db_url],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        until = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited: {process.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > until:
                raise RuntimeError("serve did not become ready")
            time.sleep(0.05)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def _python_client(
    db_url: str, tenant: str, ids: list[str], barrier: Barrier
) -> tuple[float, float]:
    with Quotagate.connect(db_url) as gate:
        gate.submit(f"{ids[0]}-warm", tenant, {"gpu": 1})
        barrier.wait()
        started = time.perf_counter()
        for request_id in ids:
            gate.submit(request_id, tenant, {"gpu": 1}, payload={"n": request_id})
        return started, time.perf_counter()


def _http_client(
    url: str, token: str, tenant: str, ids: list[str], barrier: Barrier
) -> tuple[float, float]:
    path = f"/v1/tenants/{tenant}/requests"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as client:
        client.post(path, json={"id": f"{ids[0]}-warm", "cost": {"gpu": 1}}).raise_for_status()
        barrier.wait()
        started = time.perf_counter()
        for request_id in ids:
            response = client.post(path, json={"id": request_id, "cost": {"gpu": 1},
                                               "payload": {"n": request_id}})
            if response.status_code != 202:
                raise RuntimeError(f"submit answered {response.status_code}: {response.text}")
        return started, time.perf_counter()


def _timed(function: Callable[..., tuple[float, float]], jobs: Sequence[tuple[Any, ...]]) -> float:
    """Run one client process per job; seconds from all-ready to last-done."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Manager().Barrier(len(jobs))
    with context.Pool(len(jobs)) as pool:
        spans = pool.starmap(function, [(*job, barrier) for job in jobs])
    return max(end for _, end in spans) - min(start for start, _ in spans)


def run(backend: str, total: int, clients: int) -> list[list[Any]]:
    per_client = total // clients
    rows: list[list[Any]] = []

    def ids(phase: str, client: int) -> list[str]:
        return [f"{phase}-{client}-{n}" for n in range(per_client)]

    with throwaway_database(backend) as db_url:
        with Quotagate.connect(db_url) as gate:
            gate.set_pool("main", {"gpu": 10**9})
            for phase in ("python", "http1", "http2"):
                for client in range(clients):
                    gate.set_tenant(f"{phase}-{client}", {"gpu": 10**9})
            tokens = TokenStore(gate.engine)
            token = tokens.create(admin=True, label="benchmark").token

        def record(label: str, servers: int | str, seconds: float) -> None:
            count = per_client * clients
            rows.append([backend, label, servers, clients, count, f"{seconds:.2f}",
                         f"{count / seconds:.0f}"])
            print(f"  {label} ({servers}): {count / seconds:.0f} submits/s", file=sys.stderr)

        print(f"{backend}: Python API", file=sys.stderr)
        seconds = _timed(_python_client,
                         [(db_url, f"python-{c}", ids("python", c)) for c in range(clients)])
        record("python api", "-", seconds)
        for servers in (1, 2):
            print(f"{backend}: HTTP, {servers} server process(es)", file=sys.stderr)
            with ExitStack() as stack:
                urls = [stack.enter_context(serve(db_url)) for _ in range(servers)]
                phase = f"http{servers}"
                seconds = _timed(_http_client, [
                    (urls[c % servers], token, f"{phase}-{c}", ids(phase, c))
                    for c in range(clients)
                ])
            record("http", servers, seconds)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="postgresql", choices=BACKENDS)
    parser.add_argument("--requests", type=int, default=600, help="Submits per measurement.")
    parser.add_argument("--clients", type=int, default=4, help="Client processes.")
    arguments = parser.parse_args()
    try:
        rows = run(arguments.backend, arguments.requests, arguments.clients)
    except ServerUnavailable as error:
        sys.exit(f"skipped: {error}")
    print(render_table(
        ["backend", "path", "servers", "clients", "submits", "seconds", "submits/s"], rows
    ))


if __name__ == "__main__":
    main()
