"""Rate-limit decisions per second: quotagate's buckets next to other Redis limiters.

One client, one thread, back to back, for a fixed time per row. Every limiter
gets the same limit — 100 per second, so most decisions in a run are refusals,
as under a real overload — and the same throwaway ``redis-server`` of its own
(no persistence, a free port): nothing else's Redis is touched.

Rows:

* quotagate's SQL store on SQLite, PostgreSQL and MariaDB: one conditional
  UPDATE per decision (plus MariaDB's SELECT, as it has no UPDATE … RETURNING);
* quotagate's Redis store, one take per EVALSHA and 100 takes per EVALSHA;
* the limit we measure against: redis-py calling EVALSHA on a minimal script
  (``DECR`` of one key) — one round trip and nothing else;
* the ``limits`` library's Redis strategies (fixed window, moving window,
  sliding window counter) and ``pyrate-limiter``'s Redis bucket.

Needs ``pip install -e '.[bench]'`` for the last two; a missing one is skipped.
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from quotagate.domain.bucket import BucketConfig
from quotagate.rate.backend import Take
from quotagate.rate.keys import BucketKey
from quotagate.rate.redis import RedisRateStore
from quotagate.rate.sql import _take_statement
from quotagate.rate.stores import rate_store_from_url

LIMIT = 100  # per second, for every limiter
BATCH = 100
CONFIG = BucketConfig(capacity=LIMIT, refill_per_second=LIMIT)
MINIMAL_SCRIPT = "return redis.call('DECR', KEYS[1])"


@dataclass
class Contender:
    name: str
    decide: Callable[[], object]
    per_call: int = 1
    note: str = ""
    rates: list[float] = field(default_factory=list)

    def run(self, seconds: float) -> None:
        """Call ``decide`` back to back for ``seconds``; record decisions per second."""
        decisions = 0
        began = time.perf_counter()
        deadline = began + seconds
        while True:
            self.decide()
            decisions += self.per_call
            now = time.perf_counter()
            if now >= deadline:
                self.rates.append(decisions / (now - began))
                return

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


@contextmanager
def redis_server() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="quotagate-bench-redis-") as directory:
        process = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", directory],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.kill()
            process.wait()


def sql_contenders(
    backends: Sequence[str], stack: ExitStack, log: Callable[[str], None]
) -> list[Contender]:
    contenders = []
    for backend in backends:
        try:
            url = stack.enter_context(throwaway_database(backend))
        except ServerUnavailable as error:
            log(f"skipped: {error}")
            continue
        store = rate_store_from_url(url)
        stack.callback(store.close)
        key = BucketKey("team-a")
        store.configure(key, CONFIG, fresh=True)
        contenders.append(Contender(
            f"quotagate SQL store, {backend}",
            lambda store=store, key=key: store.take(key, CONFIG),
            note="1 UPDATE per take, own transaction"))
        raw_key = BucketKey("team-raw")
        store.configure(raw_key, CONFIG, fresh=True)
        contenders.append(raw_update_contender(store, raw_key, backend, stack))
    return contenders


def raw_update_contender(
    store: Any, key: BucketKey, backend: str, stack: ExitStack
) -> Contender:
    """The SQL store's baseline: its conditional UPDATE, compiled once, run on the bare driver.

    Same statement, same driver (psycopg, pymysql, sqlite3), one transaction
    per take, no SQLAlchemy and no reading of the refused bucket: one round
    trip and a commit.
    """
    engine = store.engine
    statement = _take_statement(engine.dialect.name, False).compile(dialect=engine.dialect)
    text = statement.string
    if statement.positional:
        arguments: Any = tuple({"bucket_key": key.name, "amount": 1}.get(name, value)
                               for name, value in
                               ((n, statement.binds[n].value) for n in statement.positiontup))
    else:
        arguments = {**{name: bind.value for name, bind in statement.binds.items()},
                     "bucket_key": key.name, "amount": 1}
    connection = engine.raw_connection()
    stack.callback(connection.close)
    cursor = connection.cursor()

    def decide() -> object:
        cursor.execute(text, arguments)
        connection.commit()
        return cursor.rowcount

    return Contender(f"raw conditional UPDATE, {backend}", decide,
                     note="the store's UPDATE on the bare driver: the SQL limit")


def redis_contenders(url: str, stack: ExitStack, log: Callable[[str], None]) -> list[Contender]:
    import redis

    store = rate_store_from_url(url)
    stack.callback(store.close)
    assert isinstance(store, RedisRateStore)
    key = BucketKey("team-a")
    store.configure(key, CONFIG, fresh=True)
    keys = [BucketKey(f"team-{index}") for index in range(10)]
    for each in keys:
        store.configure(each, CONFIG, fresh=True)
    batch = [Take(keys[index % len(keys)], CONFIG) for index in range(BATCH)]
    client = redis.Redis.from_url(url)
    stack.callback(client.close)
    sha = client.script_load(MINIMAL_SCRIPT)
    client.set("bench:raw", 10**12)
    return [
        Contender("quotagate Redis store, single", lambda: store.take(key, CONFIG),
                  note="EVALSHA per take"),
        Contender(f"quotagate Redis store, batch of {BATCH}", lambda: store.take_many(batch),
                  per_call=BATCH, note=f"{BATCH} takes over 10 tenants per EVALSHA"),
        Contender("raw redis-py EVALSHA, minimal script",
                  lambda: client.evalsha(sha, 1, "bench:raw"),
                  note="DECR one key: the round-trip limit"),
        *limits_contenders(url, log),
        *pyrate_contenders(client, log),
    ]


def limits_contenders(url: str, log: Callable[[str], None]) -> list[Contender]:
    try:
        from limits import parse
        from limits.storage import storage_from_string
        from limits.strategies import (
            FixedWindowRateLimiter,
            MovingWindowRateLimiter,
            SlidingWindowCounterRateLimiter,
        )
    except ImportError:
        log("skipped limits: pip install -e '.[bench]'")
        return []
    storage = storage_from_string(url)
    limit = parse(f"{LIMIT}/second")
    contenders = []
    for name, strategy in (("fixed window", FixedWindowRateLimiter),
                           ("moving window", MovingWindowRateLimiter),
                           ("sliding window counter", SlidingWindowCounterRateLimiter)):
        limiter = strategy(storage)
        # Each strategy keeps a different type under the same key name: one key each.
        identifier = name.replace(" ", "-")
        contenders.append(Contender(
            f"limits {name}",
            lambda limiter=limiter, identifier=identifier: limiter.hit(limit, identifier),
            note="limits' own Lua script" if name != "fixed window" else "INCR + EXPIRE"))
    return contenders


def pyrate_contenders(client: Any, log: Callable[[str], None]) -> list[Contender]:
    try:
        from pyrate_limiter import Duration, Limiter, Rate, RedisBucket
    except ImportError:
        log("skipped pyrate-limiter: pip install -e '.[bench]'")
        return []
    bucket = RedisBucket.init([Rate(LIMIT, Duration.SECOND)], client, "bench:pyrate")
    limiter = Limiter(bucket)
    return [Contender("pyrate-limiter RedisBucket",
                      lambda: limiter.try_acquire("team-a", blocking=False),
                      note="a sorted set of hits per bucket")]


def render_table(contenders: Sequence[Contender], baseline: Contender | None) -> str:
    lines = [f"{'limiter':<40} {'decisions/s':>12} {'min-max':>17} {'vs raw':>7}  note",
             f"{'-' * 40} {'-' * 12} {'-' * 17} {'-' * 7}  {'-' * 4}"]
    for each in contenders:
        relative = f"{each.rate / baseline.rate:6.0%}" if baseline else ""
        spread = f"{min(each.rates):,.0f}-{max(each.rates):,.0f}"
        lines.append(f"{each.name:<40} {each.rate:>12,.0f} {spread:>17} {relative:>7}  {each.note}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one row's run")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds over all rows, interleaved; the median is shown")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="SQL backends, comma-separated (default: all)")
    settings = parser.parse_args(argv)
    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {line}", file=sys.stderr, flush=True)

    backends = [name for name in settings.backends.split(",") if name]
    with ExitStack() as stack:
        contenders = sql_contenders(backends, stack, log)
        url = stack.enter_context(redis_server())
        contenders += redis_contenders(url, stack, log)
        for each in contenders:  # warm up: connections, script caches, statement caches
            for _ in range(20):
                each.decide()
        # Rounds interleave the rows, so a burst of load elsewhere on the machine
        # spreads over all of them instead of sinking one; each round runs them in
        # another order, as a row right after the SQL rows runs measurably slower.
        shuffler = random.Random(0)
        for round_number in range(1, settings.rounds + 1):
            log(f"round {round_number} of {settings.rounds}")
            for each in shuffler.sample(contenders, len(contenders)):
                each.run(settings.seconds)
    baseline = next((each for each in contenders if each.name.startswith("raw redis-py")), None)
    print()
    print(f"Rate-limit decisions per second: one client; median of {settings.rounds} interleaved "
          f"{settings.seconds:g} s runs; limit {LIMIT}/s; 'vs raw' = against raw EVALSHA")
    print(render_table(contenders, baseline))
    sql_rows = []
    for each in contenders:
        if each.name.startswith("quotagate SQL store, "):
            backend = each.name.removeprefix("quotagate SQL store, ")
            raw = next(c for c in contenders if c.name == f"raw conditional UPDATE, {backend}")
            sql_rows.append(f"{backend:<12} {each.rate:>12,.0f} {raw.rate:>12,.0f} "
                            f"{each.rate / raw.rate:>8.2f}x")
    if sql_rows:
        print()
        print("SQL store against its raw conditional UPDATE on the same driver (same run)")
        print(f"{'backend':<12} {'store/s':>12} {'raw/s':>12} {'ratio':>9}")
        print("\n".join(sql_rows))
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
