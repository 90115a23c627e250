"""Stream throughput: quotagate's producer and consumer next to raw redis-py and FastStream.

One client, one partition (one Redis stream), a throwaway ``redis-server`` of
its own (no persistence, a free port), a throwaway SQLite ledger. Each row
moves the same number of 100-byte messages; rounds interleave the rows and
the median rate is shown.

Produce rows (messages per second):

* quotagate ``Producer.send`` (one message per call) and ``send_many`` (100
  per call), *with the checks*: a take from the topic's rate bucket (in the
  same Redis, one EVALSHA) before the write, ``XADD … MAXLEN ~`` the topic's
  max length;
* the baseline: raw redis-py ``XADD … MAXLEN ~`` — one call per message, and
  100 per pipeline;
* FastStream's ``RedisBroker.publish(stream=…)`` — one awaited call per
  message, and 100 calls gathered at once (it has no batch publish for streams).

Consume rows (entries consumed and acked per second, from a stream filled
beforehand): quotagate ``Consumer.run`` (fenced reads and acks, batch 100);
raw ``XREADGROUP COUNT 100`` + ``XACK`` of the batch; FastStream's
consumer-group subscriber (``StreamSub(group=…, batch=True, max_records=100)``).

Needs ``pip install -e '.[bench]'`` for FastStream; without it those rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from quotagate import Quotagate
from quotagate.domain.bucket import BucketConfig
from ratelimit import redis_server

BATCH = 100
PAYLOAD = "x" * 100
MAX_LEN = 10_000_000
# Wide enough never to refuse: the row measures the cost of the check, not refusals.
RATE = BucketConfig(capacity=10**11, refill_per_second=10**9)


@dataclass
class Row:
    kind: str
    name: str
    run: Callable[[int], float]  # messages → seconds taken
    rates: list[float] = field(default_factory=list)
    baseline: str = ""

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def _timed(work: Callable[[], object]) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


class Bench:
    def __init__(self, url: str, ledger: Path) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url)
        self.gate = Quotagate.connect(f"sqlite:///{ledger}", redis=url, rate_store=url)
        self.gate.init()
        self.gate.set_tenant("bench", {"partitions": 10**6, "parallelism": 10**6})

    def topic(self, max_len: int | None = MAX_LEN) -> str:
        name = f"t{uuid.uuid4().hex[:10]}"
        self.gate.streams.create_topic("bench", name, partitions=1, parallelism=1,
                                       max_len=max_len, rate=RATE)
        return name

    # -- produce ---------------------------------------------------------------------

    def quotagate_single(self, count: int) -> float:
        producer = self.gate.streams.producer("bench", self.topic())
        producer.send(PAYLOAD)  # resolve the topic outside the timing
        return _timed(lambda: [producer.send(PAYLOAD) for _ in range(count)])

    def quotagate_batched(self, count: int) -> float:
        producer = self.gate.streams.producer("bench", self.topic())
        producer.send(PAYLOAD)
        batch = [PAYLOAD] * BATCH
        return _timed(lambda: [producer.send_many(batch) for _ in range(count // BATCH)])

    def raw_single(self, count: int) -> float:
        key = f"raw:{uuid.uuid4().hex}"
        fields = {"data": PAYLOAD}
        return _timed(lambda: [self.client.xadd(key, fields, maxlen=MAX_LEN, approximate=True)
                               for _ in range(count)])

    def raw_batched(self, count: int) -> float:
        key = f"raw:{uuid.uuid4().hex}"

        def work() -> None:
            for _ in range(count // BATCH):
                pipeline = self.client.pipeline(transaction=False)
                for _ in range(BATCH):
                    pipeline.xadd(key, {"data": PAYLOAD}, maxlen=MAX_LEN, approximate=True)
                pipeline.execute()

        return _timed(work)

    def faststream_single(self, count: int) -> float:
        return asyncio.run(self._faststream_publish(count, gathered=False))

    def faststream_gathered(self, count: int) -> float:
        return asyncio.run(self._faststream_publish(count, gathered=True))

    async def _faststream_publish(self, count: int, *, gathered: bool) -> float:
        from faststream.redis import RedisBroker

        stream = f"fs:{uuid.uuid4().hex}"
        broker = RedisBroker(self.url, logger=None)
        await broker.connect()
        try:
            await broker.publish(PAYLOAD, stream=stream, maxlen=MAX_LEN)
            began = time.perf_counter()
            if gathered:
                for _ in range(count // BATCH):
                    await asyncio.gather(*(broker.publish(PAYLOAD, stream=stream, maxlen=MAX_LEN)
                                           for _ in range(BATCH)))
            else:
                for _ in range(count):
                    await broker.publish(PAYLOAD, stream=stream, maxlen=MAX_LEN)
            return time.perf_counter() - began
        finally:
            await broker.stop()

    # -- consume -----------------------------------------------------------------------

    def _filled_raw(self, count: int) -> str:
        key = f"raw:{uuid.uuid4().hex}"
        for _ in range(count // BATCH):
            pipeline = self.client.pipeline(transaction=False)
            for _ in range(BATCH):
                pipeline.xadd(key, {"data": PAYLOAD})
            pipeline.execute()
        return key

    def quotagate_consume(self, count: int) -> float:
        topic = self.topic(max_len=None)
        producer = self.gate.streams.producer("bench", topic)
        for _ in range(count // BATCH):
            producer.send_many([PAYLOAD] * BATCH)
        consumer = self.gate.streams.consumer("bench", topic, "g", "c1", batch=BATCH,
                                              poll_interval=0.001)
        consumer.tick()  # take the partition's lease outside the timing
        stop = threading.Event()
        handled = 0

        def handler(_entry: object) -> None:
            nonlocal handled
            handled += 1
            if handled >= count:
                stop.set()

        seconds = _timed(lambda: consumer.run(handler, stop=stop))
        consumer.close()
        return seconds

    def raw_consume(self, count: int) -> float:
        key = self._filled_raw(count)
        self.client.xgroup_create(key, "g", id="0")

        def work() -> None:
            done = 0
            while done < count:
                reply = self.client.xreadgroup("g", "c1", {key: ">"}, count=BATCH)
                ids = [entry_id for entry_id, _fields in reply[0][1]]
                self.client.xack(key, "g", *ids)
                done += len(ids)

        return _timed(work)

    def faststream_consume(self, count: int) -> float:
        return asyncio.run(self._faststream_consume(count))

    async def _faststream_consume(self, count: int) -> float:
        from faststream.redis import RedisBroker, StreamSub

        key = self._filled_raw(count)
        broker = RedisBroker(self.url, logger=None)
        done = asyncio.Event()
        handled = 0

        @broker.subscriber(stream=StreamSub(key, group="g", consumer="c1", batch=True,
                                            max_records=BATCH, last_id="0"))
        async def handle(messages: list[Any]) -> None:
            nonlocal handled
            handled += len(messages)
            if handled >= count:
                done.set()

        began = time.perf_counter()
        await broker.start()
        try:
            await asyncio.wait_for(done.wait(), timeout=600)
            seconds = time.perf_counter() - began
        finally:
            await broker.stop()
        pending = self.client.xpending(key, "g")["pending"]
        if pending:
            raise RuntimeError(f"FastStream left {pending} entries unacked")
        return seconds

    def close(self) -> None:
        self.gate.close()
        self.client.close()


def _has_faststream() -> bool:
    try:
        import faststream.redis  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per row and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; median shown")
    settings = parser.parse_args(argv)
    count = settings.messages // BATCH * BATCH
    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {line}", file=sys.stderr, flush=True)

    faststream = _has_faststream()
    if not faststream:
        log("skipped FastStream: pip install -e '.[bench]'")
    with redis_server() as url, tempfile.TemporaryDirectory() as directory:
        bench = Bench(url, Path(directory) / "ledger.db")
        rows = [
            Row("produce", "quotagate send (1/call, rate + max len)", bench.quotagate_single,
                baseline="raw redis-py XADD (1/call)"),
            Row("produce", "raw redis-py XADD (1/call)", bench.raw_single),
            Row("produce", "quotagate send_many (100/call, rate + max len)",
                bench.quotagate_batched, baseline="raw redis-py XADD (100/pipeline)"),
            Row("produce", "raw redis-py XADD (100/pipeline)", bench.raw_batched),
            Row("consume", "quotagate Consumer (fenced read + settle, 100)",
                bench.quotagate_consume, baseline="raw XREADGROUP + XACK (100)"),
            Row("consume", "raw XREADGROUP + XACK (100)", bench.raw_consume),
        ]
        if faststream:
            rows[4:4] = [
                Row("produce", "FastStream publish (1/call)", bench.faststream_single,
                    baseline="raw redis-py XADD (1/call)"),
                Row("produce", "FastStream publish (100 gathered)", bench.faststream_gathered,
                    baseline="raw redis-py XADD (100/pipeline)"),
            ]
            rows.append(Row("consume", "FastStream StreamSub group (batch 100)",
                            bench.faststream_consume, baseline="raw XREADGROUP + XACK (100)"))
        for row in rows:  # warm up: connections, scripts, imports
            row.run(BATCH * 2)
        for round_number in range(1, settings.rounds + 1):
            log(f"round {round_number} of {settings.rounds}")
            order = rows if round_number % 2 else list(reversed(rows))
            for row in order:
                row.rates.append(count / row.run(count))
        bench.close()
    by_name = {row.name: row for row in rows}
    print()
    print(f"Streams: {count:,} messages of {len(PAYLOAD)} bytes per row, one client, one "
          f"partition; median of {settings.rounds} interleaved rounds")
    print(f"{'':8} {'contender':<50} {'msg/s':>10} {'min-max':>17} {'vs raw':>7}")
    for row in rows:
        relative = (f"{row.rate / by_name[row.baseline].rate:6.2f}x" if row.baseline else "")
        spread = f"{min(row.rates):,.0f}-{max(row.rates):,.0f}"
        print(f"{row.kind:8} {row.name:<50} {row.rate:>10,.0f} {spread:>17} {relative:>7}")
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
