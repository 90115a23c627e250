"""What the dashboard's Streams view costs per poll, next to one status read per topic.

A throwaway ``redis-server`` and a SQLite ledger; ``topics`` topics of 4
partitions, 100 entries each, one consumer group that has read some of them.

- ``view``: ``streams_overview`` — the Streams view of one poll of ``/v1/dashboard``
  (one pipeline for the streams, one for the leases);
- ``per-topic``: the baseline, measured in the same run — ``gate.streams.status``
  (what ``quotagate stream status`` reads) for each topic, one after another.

Prints the median of ``--repeat`` runs in milliseconds.

    .venv/bin/python benchmarks/dashboard_streams.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import median_ms
from quotagate import Quotagate
from quotagate.cli.common import render_table
from quotagate.streams.overview import streams_overview
from ratelimit import redis_server

PARTITIONS = 4


def _fill(gate: Quotagate, topics: int) -> str:
    tenant = f"bench-{topics}"  # one Redis for every size: each its own tenant's keys
    gate.set_tenant(tenant, {"partitions": topics * PARTITIONS, "parallelism": topics})
    for index in range(topics):
        name = f"topic-{index:03d}"
        gate.streams.create_topic(tenant, name, partitions=PARTITIONS, parallelism=1)
        gate.streams.producer(tenant, name).send_many(
            [(f"m{n}", f"k{n}") for n in range(100)])
        with gate.streams.consumer(tenant, name, "billing", "c1", batch=10) as consumer:
            deadline = time.monotonic() + 10
            while not consumer.poll() and time.monotonic() < deadline:
                time.sleep(0.01)  # the first poll may come before the leases are taken
    return tenant


def measure(url: str, directory: str, topics: int, repeat: int) -> list[str]:
    print(f"{topics} topics…", file=sys.stderr)
    with Quotagate.connect(f"sqlite:///{directory}/ledger-{topics}.db", redis=url) as gate:
        gate.init()
        tenant = _fill(gate, topics)
        view = streams_overview(gate.streams, tenant)
        assert view.error is None and len(view.topics) == topics
        assert all(row.length == 100 and row.lag is not None for row in view.topics), view
        names = [row.topic for row in view.topics]
        poll = median_ms(lambda: streams_overview(gate.streams, tenant), repeat)
        per_topic = median_ms(lambda: [gate.streams.status(tenant, name) for name in names],
                               max(3, repeat // 4))
    return [str(topics), str(topics * PARTITIONS), f"{poll:.1f}", f"{per_topic:.1f}",
            f"{per_topic / poll:.1f}x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer topics and repeats")
    arguments = parser.parse_args()
    sizes = [5, 20] if arguments.quick else [10, 50]
    repeat = 8 if arguments.quick else 20
    with redis_server() as url, tempfile.TemporaryDirectory() as directory:
        table = [measure(url, directory, size, repeat) for size in sizes]
    headers = ["topics", "partitions", "view ms", "per-topic status ms (baseline)",
               "per-topic/view"]
    print(render_table(headers, table))


if __name__ == "__main__":
    main()
