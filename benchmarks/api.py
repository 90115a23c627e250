"""Submit throughput over HTTP (1 and 2 `serve` processes) next to the Python API.

The same workload three ways in one run, on one throwaway database: client
processes submit new requests (one transaction and one audit row each)

* through the Python API (``Quotagate.submit``) directly — the baseline;
* over HTTP to one ``quotagate serve --no-workers`` process;
* over HTTP to two such processes, clients split between them;
* over HTTP to one process, through batch submit (``requests:batch``, 100 per call).

Admission is off (``--no-workers``) so only submission is measured. Every
client process connects and warms up first; the clock runs from when all are
ready (a barrier) to when the last finishes. The paths take turns, round after
round (``--rounds``), and each one's ratio to the Python API is taken within
its round: on a shared machine the load moves during a run. About a minute
with the defaults.

    .venv/bin/python benchmarks/api.py [--backend postgresql] [--requests 600] [--clients 4] \
        [--servers 1,2] [--no-batch] [--token-cache S]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import statistics
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
BATCH = 100


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve(db_url: str, *options: str) -> Iterator[str]:
    port = _free_port()
    environment = {key: value for key, value in os.environ.items() if key != "QUOTAGATE_DB"}
    process = subprocess.Popen(
        [QUOTAGATE, "serve", "--no-workers", "--port", str(port), "--log-level", "warning",
         "--db", db_url, *options],
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


def _batch_client(
    url: str, token: str, tenant: str, ids: list[str], barrier: Barrier
) -> tuple[float, float]:
    path = f"/v1/tenants/{tenant}/requests:batch"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as client:
        client.post(path, json={"requests": [{"id": f"{ids[0]}-warm", "cost": {"gpu": 1}}]})
        barrier.wait()
        started = time.perf_counter()
        for offset in range(0, len(ids), BATCH):
            entries = [{"id": request_id, "cost": {"gpu": 1}, "payload": {"n": request_id}}
                       for request_id in ids[offset:offset + BATCH]]
            response = client.post(path, json={"requests": entries})
            statuses = {entry["status"] for entry in response.json()["results"]}
            if response.status_code != 200 or statuses != {202}:
                raise RuntimeError(f"batch answered {response.status_code}: {response.text[:300]}")
        return started, time.perf_counter()


def _timed(function: Callable[..., tuple[float, float]], jobs: Sequence[tuple[Any, ...]]) -> float:
    """Run one client process per job; seconds from all-ready to last-done."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Manager().Barrier(len(jobs))
    with context.Pool(len(jobs)) as pool:
        spans = pool.starmap(function, [(*job, barrier) for job in jobs])
    return max(end for _, end in spans) - min(start for start, _ in spans)


def run(backend: str, total: int, clients: int, server_counts: Sequence[int] = (1, 2),
        batch: bool = True, rounds: int = 3, token_cache: float = 0.0) -> list[list[Any]]:
    """Every path once per round, rounds interleaved, so that a machine whose load
    changes during the run (it is shared) weighs on all paths alike; each path's
    ratio to the Python API is taken within its round, then the median."""
    per_client = total // clients
    count = per_client * clients
    paths = [("python api", "-"), *(("http", n) for n in server_counts)]
    if token_cache:
        paths.append((f"http, token cache {token_cache:g} s", 1))
    if batch:
        paths.append((f"http batch of {BATCH}", 1))
    rates: dict[tuple[str, Any], list[float]] = {path: [] for path in paths}
    ratios: dict[tuple[str, Any], list[float]] = {path: [] for path in paths}

    def ids(phase: str, client: int) -> list[str]:
        return [f"{phase}-{client}-{n}" for n in range(per_client)]

    with throwaway_database(backend) as db_url:
        with Quotagate.connect(db_url) as gate:
            gate.set_pool("main", {"gpu": 10**9})
            for round_number in range(rounds):
                for index in range(len(paths)):
                    for client in range(clients):
                        gate.set_tenant(f"p{index}-r{round_number}-{client}", {"gpu": 10**9})
            token = TokenStore(gate.engine).create(admin=True, label="benchmark").token
        with ExitStack() as stack:
            urls = [stack.enter_context(serve(db_url)) for _ in range(max(server_counts, default=1))]
            cached = (stack.enter_context(serve(db_url, "--token-cache-ttl", str(token_cache)))
                      if token_cache else None)
            for round_number in range(rounds):
                baseline = 0.0
                for index, (label, servers) in enumerate(paths):
                    phase = f"p{index}-r{round_number}"
                    if label == "python api":
                        seconds = _timed(_python_client, [
                            (db_url, f"{phase}-{c}", ids(phase, c)) for c in range(clients)])
                    else:
                        function = _batch_client if label.startswith("http batch") else _http_client
                        seconds = _timed(function, [
                            (cached if cached and "token cache" in label
                             else urls[c % int(servers)], token, f"{phase}-{c}", ids(phase, c))
                            for c in range(clients)])
                    rate = count / seconds
                    baseline = baseline or rate
                    rates[(label, servers)].append(rate)
                    ratios[(label, servers)].append(rate / baseline)
                    print(f"  round {round_number + 1}: {label} ({servers}): {rate:.0f} submits/s",
                          file=sys.stderr)
    return [
        [backend, label, servers, clients, count, rounds,
         f"{statistics.median(rates[(label, servers)]):.0f}",
         f"{min(rates[(label, servers)]):.0f}-{max(rates[(label, servers)]):.0f}",
         f"{statistics.median(ratios[(label, servers)]):.2f}"]
        for label, servers in paths
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="postgresql", choices=BACKENDS)
    parser.add_argument("--requests", type=int, default=600, help="Submits per measurement.")
    parser.add_argument("--clients", type=int, default=4, help="Client processes.")
    parser.add_argument("--servers", default="1,2",
                        help="Server process counts to measure, comma-separated.")
    parser.add_argument("--no-batch", action="store_true", help="Skip the batch submit row.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds of every path.")
    parser.add_argument("--token-cache", type=float, default=0.0, metavar="S",
                        help="Also measure one serve started with --token-cache-ttl S.")
    arguments = parser.parse_args()
    counts = [int(part) for part in arguments.servers.split(",") if part.strip()]
    try:
        rows = run(arguments.backend, arguments.requests, arguments.clients, counts,
                   not arguments.no_batch, arguments.rounds, arguments.token_cache)
    except ServerUnavailable as error:
        sys.exit(f"skipped: {error}")
    print(render_table(
        ["backend", "path", "servers", "clients", "submits", "rounds", "submits/s (median)",
         "range", "x python api"], rows
    ))


if __name__ == "__main__":
    main()
