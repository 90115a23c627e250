"""The kubernetes target against the in-suite API server: outcomes per pass, creates per second.

Two tables, each next to a baseline measured in the same run, alternating rounds:

1. Reading the outcomes of N running objects once per worker pass: the target's
   ``outcomes()`` (one LIST by the ledger's label, then a watch; a pass is a
   lookup) against one GET per object per pass (what the target did before,
   over the same reused ApiClient).
2. Creating objects: one target (one ApiClient, one connection pool) shared by
   a pool of threads, against a new ApiClient per create (what rebuilding a
   target per call or per pass costs).

The API server is the suite's own (tests/support/kube_api, decision 230), in
this process: absolute numbers are those of a Python HTTP server on a shared
2-core machine, not of a real cluster; the ratios are the point.

    .venv/bin/python benchmarks/kube_target.py [--objects 100,1000] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kubernetes import client

from quotagate.delivery.targets.base import ExternalObject
from quotagate.delivery.targets.kubernetes import KubernetesTarget
from support.kube_api import KubeApiServer, running_api_server
from support.kube_api.targets import delivery_spec

GROUP, VERSION, PLURAL = "quotagate.io", "v1alpha1", "modelservices"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def api_calls(server: KubeApiServer) -> int:
    with server.lock:
        return len(server.calls)


def get_each(api: client.CustomObjectsApi, objects: list[ExternalObject]) -> int:
    """The baseline: one GET per running object per pass; returns how many ended."""
    ended = 0
    for obtained in objects:
        found = api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, obtained.name)
        if (found.get("status") or {}).get("phase") in ("Completed", "Succeeded", "Failed"):
            ended += 1
    return ended


def timed_passes(run_pass: Callable[[], Any], server: KubeApiServer, passes: int,
                 ) -> tuple[float, float]:
    """Milliseconds per pass and API calls per pass."""
    calls = api_calls(server)
    started = time.perf_counter()
    for _ in range(passes):
        run_pass()
    elapsed = time.perf_counter() - started
    return elapsed / passes * 1000, (api_calls(server) - calls) / passes


def outcomes_table(counts: list[int], rounds: int) -> list[list[str]]:
    rows = []
    for count in counts:
        with running_api_server() as server:
            target = KubernetesTarget({"host": server.host, "timeout": 30.0}, ledger_id="bench1")
            objects = [target.create_if_absent(delivery_spec(f"job-{index}", ledger="bench1"))
                       for index in range(count)]
            for obtained in objects[: count // 10]:  # a tenth have ended
                server.set_status(obtained.name, phase="Completed")
            configuration = client.Configuration()
            configuration.host = server.host
            baseline_client = client.ApiClient(configuration)
            baseline = client.CustomObjectsApi(baseline_client)
            assert len(target.outcomes(objects)) == count // 10  # synced: list + watch running
            passes = max(3, 3000 // count)
            ours, theirs = [], []
            for round_number in range(rounds):
                log(f"outcomes: {count} objects, round {round_number + 1}/{rounds}")
                ours.append(timed_passes(functools.partial(target.outcomes, objects), server,
                                         passes))
                theirs.append(timed_passes(functools.partial(get_each, baseline, objects), server,
                                           passes))
            target.close()
            baseline_client.close()
        our_ms = statistics.median(ms for ms, _ in ours)
        their_ms = statistics.median(ms for ms, _ in theirs)
        rows.append([str(count), f"{our_ms:.2f}", f"{statistics.median(c for _, c in ours):.0f}",
                     f"{their_ms:.1f}", f"{statistics.median(c for _, c in theirs):.0f}",
                     f"{their_ms / our_ms:.0f}x"])
    return rows


def creates_per_second(server: KubeApiServer, count: int, threads: int, shared: bool,
                       offset: int) -> float:
    target = KubernetesTarget({"host": server.host, "timeout": 30.0}, ledger_id="bench1")

    def create(index: int) -> None:
        spec = delivery_spec(f"c-{offset + index}", ledger="bench1")
        if shared:
            target.create_if_absent(spec)
            return
        fresh = KubernetesTarget({"host": server.host, "timeout": 30.0}, ledger_id="bench1")
        try:
            fresh.create_if_absent(spec)
        finally:
            fresh.close()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(count)))
    elapsed = time.perf_counter() - started
    target.close()
    return count / elapsed


def creates_table(count: int, threads: int, rounds: int) -> list[list[str]]:
    ours, theirs = [], []
    with running_api_server() as server:
        for round_number in range(rounds):
            log(f"creates: round {round_number + 1}/{rounds}")
            ours.append(creates_per_second(server, count, threads, True, 2 * round_number * count))
            theirs.append(creates_per_second(server, count, threads, False,
                                             (2 * round_number + 1) * count))
    mine, baseline = statistics.median(ours), statistics.median(theirs)
    return [[str(count), str(threads), f"{mine:.0f}", f"{baseline:.0f}", f"{mine / baseline:.1f}x"]]


def render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
             for line in [header, *rows]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", default="100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="one round, fewer objects")
    arguments = parser.parse_args()
    counts = [int(count) for count in arguments.objects.split(",")]
    rounds, creates = arguments.rounds, arguments.creates
    if arguments.quick:
        counts, rounds, creates = [min(counts[0], 100)], 1, 100
    outcomes = outcomes_table(counts, rounds)
    made = creates_table(creates, arguments.threads, rounds)
    print(f"outcomes of N running objects, one worker pass; median of {rounds} alternating rounds")
    print(render(["objects", "list+watch ms/pass", "calls/pass", "GET each ms/pass",
                  "calls/pass", "speed-up"], outcomes))
    print()
    print(f"creates per second, {arguments.threads} threads; median of {rounds} alternating rounds")
    print(render(["creates", "threads", "one ApiClient", "ApiClient per create", "ratio"], made))


if __name__ == "__main__":
    main()
