"""The whole path a user runs, end to end, next to pgqueuer on the same PostgreSQL.

Per backend, on one throwaway database: client processes submit requests over
HTTP (tenant tokens, one submit per call) to one ``quotagate serve`` that admits
them and delivers them to a fast local webhook receiver (benchmarks/_receiver.py,
its own process), which ends each one — by calling back with an executor token
and the fencing token (``--outcome callback``, the default) or by answering the
worker's outcome read (``--outcome read``) — until every request is
``completed``. Reported: submits/s (first submit to last submit answered),
completed/s (first submit to last completion), the p50/p99 latency from a
client sending a submit to the receiver getting its delivery, and the CPU time
``serve`` spent per completed request (user + system, from ready until every
request ended: less noisy than the rates on a shared machine).

The baseline, in the same run on the same PostgreSQL server: pgqueuer
enqueues the same number of no-op jobs (in batches of 1,000, its fastest way)
and drains them with one ``QueueManager`` (``mode=drain``); its drain rate is
the bar (docs/delivery.md: completed/s end to end at least half of it).

    .venv/bin/python benchmarks/pipeline.py [--backends postgresql,mysql] [--requests 2000] \\
        [--clients 8] [--outcome callback|callback-batch|read] [--batch 1] [--batch-deliver 1] \\
        [--rounds 1] [--timeout 300]

Needs the ``bench`` extra (pgqueuer) and the services of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from _receiver import serve as run_receiver
from quotagate import Quotagate
from quotagate.auth.tokens import TokenStore
from quotagate.cli.common import render_table
from quotagate.delivery.registry import TargetStore
from quotagate.store import schema

QUOTAGATE = str(Path(sys.executable).with_name("quotagate"))
Barrier = Any  # multiprocessing.synchronize.Barrier


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_ready(url: str, process: Any, what: str) -> None:
    until = time.monotonic() + 60
    while True:
        if not process.is_alive() if hasattr(process, "is_alive") else process.poll() is not None:
            raise RuntimeError(f"{what} exited before it was ready")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > until:
            raise RuntimeError(f"{what} did not become ready")
        time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name, in parentheses, may hold spaces: count fields after it.
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def serve(db_url: str, port: int, options: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """One ``quotagate serve`` with its admission loop and delivery worker: its URL and pid."""
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("QUOTAGATE_")}
    process = subprocess.Popen(
        [QUOTAGATE, "serve", "--port", str(port), "--log-level", "warning", "--db", db_url,
         "--worker-name", "pipeline", *options],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}/readyz", process, "serve")
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def receiver(mode: str, quotagate_url: str, executor_token: str) -> Iterator[str]:
    port = _free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=run_receiver, args=(port, mode, quotagate_url, executor_token), daemon=True
    )
    process.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}/arrivals", process, "the receiver")
        yield url
    finally:
        process.terminate()
        process.join(30)


def _client(url: str, token: str, tenant: str, ids: list[str], barrier: Barrier,
            batch: int) -> tuple[float, float, dict[str, float]]:
    """Submit ``ids`` one by one (or ``batch`` per batch submit); (start, end, send times)."""
    path = f"/v1/tenants/{tenant}/requests"
    sent: dict[str, float] = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as client:
        client.get("/healthz")
        barrier.wait()
        started = time.perf_counter()
        if batch > 1:
            for offset in range(0, len(ids), batch):
                chunk = ids[offset:offset + batch]
                now = time.time()
                sent.update(dict.fromkeys(chunk, now))
                response = client.post(f"{path}:batch", json={"requests": [
                    {"id": request_id, "cost": {"gpu": 1}, "payload": {"n": request_id}}
                    for request_id in chunk]})
                statuses = {entry["status"] for entry in response.json().get("results", [])}
                if response.status_code != 200 or statuses != {202}:
                    raise RuntimeError(f"batch submit answered {response.status_code}: "
                                       f"{response.text[:300]}")
            return started, time.perf_counter(), sent
        for request_id in ids:
            sent[request_id] = time.time()
            response = client.post(path, json={"id": request_id, "cost": {"gpu": 1},
                                               "payload": {"n": request_id}})
            if response.status_code != 202:
                raise RuntimeError(f"submit answered {response.status_code}: {response.text}")
        return started, time.perf_counter(), sent


def _completed(gate: Quotagate) -> tuple[int, float | None, int]:
    request = schema.request
    with gate.engine.connect() as connection:
        done, last = connection.execute(
            sa.select(sa.func.count(), sa.func.max(request.c.updated))
            .where(request.c.state == "completed")
        ).one()
        ended_otherwise = connection.execute(
            sa.select(sa.func.count()).where(request.c.state.in_(("failed", "cancelled")))
        ).scalar_one()
    return int(done), last, int(ended_otherwise)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _drive(gate: Quotagate, url: str, tenants: list[str], tenant_tokens: list[str],
           per_client: int, count: int, timeout: float, hooks: str, batch: int
           ) -> tuple[list[Any], dict[str, Any], int, float | None]:
    """Submit from every client at once, then wait until every request ended."""
    context = multiprocessing.get_context("spawn")
    clients = len(tenants)
    barrier = context.Manager().Barrier(clients)
    jobs = [(url, tenant_tokens[c], tenants[c], [f"req-{c}-{n}" for n in range(per_client)],
             barrier, batch) for c in range(clients)]
    with context.Pool(clients) as pool:
        spans = pool.starmap(_client, jobs)
    until = time.monotonic() + timeout
    while True:
        done, last, ended_otherwise = _completed(gate)
        if done + ended_otherwise >= count or time.monotonic() > until:
            break
        time.sleep(0.1)
    report = httpx.get(f"{hooks}/arrivals", timeout=30).json()
    return spans, report, done, last


def run_pipeline(backend: str, total: int, clients: int, outcome: str, timeout: float,
                 batch: int = 1, batch_deliver: int = 1,
                 serve_options: Sequence[str] = ()) -> list[Any]:
    per_client = total // clients
    count = per_client * clients
    with throwaway_database(backend) as db_url, Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 10**9})
        tenants = [f"tenant-{c}" for c in range(clients)]
        tokens = TokenStore(gate.engine)
        tenant_tokens = []
        for tenant in tenants:
            gate.set_tenant(tenant, {"gpu": 10**9})
            tenant_tokens.append(tokens.create(tenant=tenant).token)
        # The receiver needs the executor token, which needs the target, whose URL
        # is the receiver's: create the target, start the receiver, point the
        # target at it, and only then start serve, so its worker reads the final
        # target at start (a worker re-reads targets once a second: pointing a
        # running one elsewhere would send the first requests to the old URL).
        targets = TargetStore(gate.engine)
        # A receiver that calls back needs outcome reads only as a rare safety net.
        # A worker that reads outcomes reads many per call.
        hook_config: dict[str, Any] = (
            {"poll_every": 30.0} if outcome.startswith("callback") else {"batch_read": True})
        if batch_deliver > 1:
            hook_config["batch_deliver"] = batch_deliver
        targets.set("receiver", "webhook", {"url": "http://127.0.0.1:9/hooks"}, default=True)
        executor = tokens.create(executor_target="receiver").token
        port = _free_port()
        with receiver(outcome, f"http://127.0.0.1:{port}", executor) as hooks:
            targets.set("receiver", "webhook", {"url": f"{hooks}/hooks", **hook_config},
                        default=True)
            with serve(db_url, port, serve_options) as (url, pid):
                serve_cpu = _cpu_seconds(pid)
                spans, report, done, last = _drive(gate, url, tenants, tenant_tokens, per_client,
                                                   count, timeout, hooks, batch)
                # From ready to the last completion seen: what serve spent on the requests.
                serve_cpu = _cpu_seconds(pid) - serve_cpu
    submit_seconds = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    first = min(min(sent.values()) for _, _, sent in spans)
    sent_at = {key: value for _, _, sent in spans for key, value in sent.items()}
    latencies = [report["arrivals"][key] - sent_at[key]
                 for key in sent_at if key in report["arrivals"]]
    if outcome.startswith("callback"):
        print(f"  {backend}: {report['callbacks']} callbacks, {report['not_delivered']} of them "
              f"answered not_delivered, {report['transport_errors']} lost a connection",
              file=sys.stderr)
    if report["callback_error_count"]:
        print(f"  {backend}: {report['callback_error_count']} callbacks failed, e.g. "
              f"{report['callback_errors']}", file=sys.stderr)
    complete_rate = done / (last - first) if done and last else 0.0
    submits = "single submits" if batch == 1 else f"batch submits of {batch}"
    if batch_deliver > 1:
        submits += f", deliveries in POSTs of {batch_deliver}"
    return [backend, f"quotagate ({outcome}, {submits})", count, f"{count / submit_seconds:.0f}",
            f"{complete_rate:.1f}", f"{done}/{count}",
            f"{statistics.median(latencies) * 1000:.0f}" if latencies else "-",
            f"{_percentile(latencies, 0.99) * 1000:.0f}" if latencies else "-",
            f"{serve_cpu / max(done, 1) * 1000:.2f}"]


async def _pgqueuer(dsn: str, count: int) -> tuple[float, float]:
    import psycopg
    from pgqueuer import Job, PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        driver = PsycopgDriver(connection)
        queries = Queries(driver)
        await queries.install()
        started = time.perf_counter()
        for offset in range(0, count, 1000):
            size = min(1000, count - offset)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
        enqueued = time.perf_counter()
        manager = QueueManager(queries)
        last_done = [0.0]

        @manager.entrypoint("noop")
        async def noop(_job: Job) -> None:
            last_done[0] = time.perf_counter()

        drain_started = time.perf_counter()
        await manager.run(mode=QueueExecutionMode.drain, batch_size=10)
        # Up to the last job, not to run() returning: drain mode then still waits
        # out a quiet poll before it concludes the queue is empty.
        drained = last_done[0]
    finally:
        await connection.close()
    return enqueued - started, drained - drain_started


def run_pgqueuer(count: int) -> list[Any]:
    with throwaway_database("postgresql", create_schema=False) as url:
        enqueue_seconds, drain_seconds = asyncio.run(_pgqueuer(url, count))
    return ["postgresql", "pgqueuer (no-op jobs)", count, f"{count / enqueue_seconds:.0f}",
            f"{count / drain_seconds:.1f}", f"{count}/{count}", "-", "-", "-"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="postgresql,mysql",
                        help=f"Comma-separated, of {', '.join(BACKENDS)}.")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8, help="Submitting client processes.")
    parser.add_argument("--outcome", choices=("callback", "callback-batch", "read"),
                        default="callback",
                        help="How the receiver ends each request.")
    parser.add_argument("--batch", type=int, default=1,
                        help="Requests per submit call: 1 (POST …/requests) or more "
                        "(POST …/requests:batch).")
    parser.add_argument("--batch-deliver", default="1",
                        help="Deliveries per webhook POST: 1 (POST <url>) or more "
                        "(POST <url>/_batch, the target's --batch-deliver); comma-separated "
                        "values give one row each, in the same run.")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="Seconds to wait for every request to complete.")
    parser.add_argument("--serve-options", default="",
                        help="More options for quotagate serve, space-separated "
                        "(e.g. '--concurrency 8').")
    parser.add_argument("--rounds", type=int, default=1,
                        help="Run pgqueuer and every row this many times, in turns; with more "
                        "than one, also print each row's median and its median ratio to the "
                        "pgqueuer drain of its own round.")
    arguments = parser.parse_args()
    backends = [name.strip() for name in arguments.backends.split(",") if name.strip()]
    sizes = [int(size) for size in arguments.batch_deliver.split(",") if size.strip()]
    rates: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    try:
        for round_number in range(arguments.rounds):
            rows = _round(arguments, backends, sizes)
            if arguments.rounds > 1:
                print(f"round {round_number + 1} of {arguments.rounds}")
            print(render_table(
                ["backend", "system", "requests", "submits/s", "completed/s", "completed",
                 "p50 submit→delivered ms", "p99 ms", "serve CPU ms/request"], rows,
            ))
            bar = next((float(row[4]) for row in rows if row[1].startswith("pgqueuer")), None)
            for row in rows:
                rates.setdefault((row[0], row[1]), []).append(float(row[4]))
                if bar and row[1].startswith("quotagate"):
                    ratios.setdefault((row[0], row[1]), []).append(float(row[4]) / bar)
                    print(f"{row[0]}: completed/s is {float(row[4]) / bar:.2f}x pgqueuer's "
                          "drain rate (target: at least 0.5x)")
    except ServerUnavailable as error:
        sys.exit(f"skipped: {error}")
    if arguments.rounds > 1:
        print(f"medians of {arguments.rounds} rounds")
        print(render_table(
            ["backend", "system", "completed/s (median)", "range", "x pgqueuer (median)"],
            [[backend, system, f"{statistics.median(values):.1f}",
              f"{min(values):.0f}-{max(values):.0f}",
              f"{statistics.median(ratios[(backend, system)]):.2f}"
              if (backend, system) in ratios else "-"]
             for (backend, system), values in rates.items()],
        ))


def _round(arguments: argparse.Namespace, backends: list[str], sizes: list[int]) -> list[Any]:
    rows: list[list[Any]] = []
    if "postgresql" in backends:
        print("postgresql: pgqueuer", file=sys.stderr)
        rows.append(run_pgqueuer(arguments.requests // arguments.clients * arguments.clients))
    for backend in backends:
        for size in sizes:
            print(f"{backend}: quotagate pipeline", file=sys.stderr)
            rows.append(run_pipeline(backend, arguments.requests, arguments.clients,
                                     arguments.outcome, arguments.timeout, arguments.batch,
                                     size, arguments.serve_options.split()))
    return rows


if __name__ == "__main__":
    main()
