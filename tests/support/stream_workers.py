"""Functions run in child processes by the stream tests (importable for spawn)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from quotagate import Quotagate, RateLimited
from quotagate.streams.consumer import Entry


def produce_until_refused(db_url: str, redis_url: str, rate_store: str | None, tenant: str,
                          topic: str, sends: int, barrier: Any, results: Any) -> None:
    """Send ``sends`` single messages as fast as possible; report (granted, refused)."""
    granted = refused = 0
    with Quotagate.connect(db_url, redis=redis_url, rate_store=rate_store) as gate:
        producer = gate.streams.producer(tenant, topic)
        producer.handle  # noqa: B018 - resolve before the race starts
        barrier.wait(timeout=120)  # a worker that died never leaves the others waiting
        for index in range(sends):
            try:
                producer.send(f"{os.getpid()}-{index}")
                granted += 1
            except RateLimited:
                refused += 1
    results.put((granted, refused))


def consume_with_log(db_url: str, redis_url: str, tenant: str, topic: str, group: str,
                     name: str, log_path: str, block_on: str | None, lease_ttl: float) -> None:
    """Consume until killed (or idle), logging with unbuffered writes:

    ``processed <id>`` after the handler ran, ``acked <n>`` after each settle
    returned, ``owns <partition> <generation>`` on acquiring a partition, and
    ``blocked`` when the handler reaches the message ``block_on`` — where it
    then hangs, mid-batch, for the test to SIGKILL it.
    """
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def write(line: str) -> None:
        os.write(log, (line + "\n").encode())

    with Quotagate.connect(db_url, redis=redis_url) as gate:
        consumer = gate.streams.consumer(tenant, topic, group, name, batch=10,
                                         lease_ttl=lease_ttl, visibility_timeout=60.0)
        reported: set[tuple[int, int]] = set()
        while True:
            entries = consumer.poll()
            for partition, owned in consumer.owned.items():
                if (partition, owned.lease.generation) not in reported:
                    reported.add((partition, owned.lease.generation))
                    write(f"owns {partition} {owned.lease.generation}")
            if not entries:
                if block_on is None and consumer.idle_for() >= 1.0:
                    break
                time.sleep(0.02)
                continue
            done: list[Entry] = []
            for entry in entries:
                if entry.text == block_on:
                    write("blocked")
                    time.sleep(3600)
                write(f"processed {entry.id} {entry.text}")
                done.append(entry)
            result = consumer.settle(done)
            write(f"acked {result.acked}")
        consumer.close()
    os.close(log)


def read_log(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
