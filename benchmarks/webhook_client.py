"""Client CPU per webhook POST: the webhook target next to the HTTP clients it could use.

One receiver (benchmarks/_receiver.py, in its own process, answering every POST at once)
and, in this process, POSTs of a delivery's body from 1 and from N threads (the
worker's delivery threads, ``serve --concurrency``), each way in turn, round after round:

* ``WebhookTarget.create_if_absent`` — quotagate's webhook target (docs/decisions/255);
* a bare ``urllib3.PoolManager`` — the baseline: the same POST with nothing around it;
* a bare ``httpx.Client`` — the client the target used before decision 255.

Printed: client CPU µs per POST (``time.process_time``: this process only, not the
receiver's) and POSTs/s, medians over the rounds, and the target's CPU as a multiple
of the bare urllib3 POST.

    .venv/bin/python benchmarks/webhook_client.py [--posts 1920] [--threads 1,32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import httpx
import urllib3

from _receiver import serve as run_receiver
from pipeline import _free_port, _wait_ready
from quotagate.cli.common import render_table
from quotagate.delivery.targets.base import DeliverySpec
from quotagate.delivery.targets.webhook import WebhookTarget


def _spec(name: str) -> DeliverySpec:
    return DeliverySpec(request_id=name, tenant="team-a", cost={"gpu": 1}, payload={"n": name},
                        fencing_token=1, external_name=name, ledger_id="bench")


def _body(name: str) -> bytes:
    return json.dumps({"name": name, "ledger_id": "bench", "request_id": name,
                       "tenant": "team-a", "cost": {"gpu": 1}, "payload": {"n": name},
                       "fencing_token": 1, "attempt": 1}).encode()


def _measure(post: Callable[[str], None], threads: int, posts: int,
             names: Callable[[], str]) -> tuple[float, float]:
    """(client CPU µs per POST, POSTs/s) of ``posts`` POSTs spread over ``threads``."""
    each = posts // threads

    def work() -> None:
        for _ in range(each):
            post(names())

    started, wall = time.process_time(), time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done = each * threads
    return ((time.process_time() - started) / done * 1e6,
            done / (time.perf_counter() - wall))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=1920, help="POSTs per measurement")
    parser.add_argument("--threads", default="1,32", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args(argv)
    port = _free_port()
    receiver = multiprocessing.get_context("spawn").Process(
        target=run_receiver, args=(port, "read", "http://127.0.0.1:9", "unused"), daemon=True)
    receiver.start()
    url = f"http://127.0.0.1:{port}/hooks"
    try:
        _wait_ready(f"http://127.0.0.1:{port}/arrivals", receiver, "the receiver")
        counter = itertools.count()
        lock = threading.Lock()

        def names() -> str:
            with lock:
                return f"post-{next(counter)}"

        target = WebhookTarget({"url": url, "timeout": 10}, ledger_id="bench")
        pool = urllib3.PoolManager(maxsize=64, block=True, retries=False)
        client = httpx.Client(timeout=10, limits=httpx.Limits(max_connections=64,
                                                              max_keepalive_connections=64))
        headers = {"Content-Type": "application/json"}

        def through_target(name: str) -> None:
            target.create_if_absent(_spec(name))

        def through_urllib3(name: str) -> None:
            json.loads(pool.request("POST", url, body=_body(name), redirect=False,
                                    headers={**headers, "Idempotency-Key": name}).data)

        def through_httpx(name: str) -> None:
            client.post(url, content=_body(name),
                        headers={**headers, "Idempotency-Key": name}).json()

        ways: dict[str, Callable[[str], None]] = {
            "webhook target": through_target, "urllib3 (baseline)": through_urllib3,
            "httpx": through_httpx,
        }
        thread_counts = [int(count) for count in arguments.threads.split(",") if count.strip()]
        results: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for post in ways.values():  # warm up: connections, imports
            for _ in range(20):
                post(names())
        for round_number in range(arguments.rounds):
            for threads in thread_counts:
                for way, post in ways.items():
                    results.setdefault((threads, way), []).append(
                        _measure(post, threads, arguments.posts, names))
            print(f"round {round_number + 1} of {arguments.rounds} done")
        rows = []
        for threads in thread_counts:
            baseline = statistics.median(cpu for cpu, _ in results[(threads, "urllib3 (baseline)")])
            for way in ways:
                cpu = statistics.median(value for value, _ in results[(threads, way)])
                rate = statistics.median(value for _, value in results[(threads, way)])
                rows.append([str(threads), way, f"{cpu:.0f}", f"{rate:.0f}",
                             f"{cpu / baseline:.2f}x"])
        print(render_table(["threads", "client", "CPU µs/POST", "POSTs/s", "CPU vs urllib3"],
                           rows))
        target.close()
        client.close()
    finally:
        receiver.terminate()
        receiver.join(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
