"""Rate-limit decisions per second: quotagate's buckets next to other Redis limiters.

One client, one thread, back to back, for a fixed time per row. Every limiter
gets the same limit — 100 per second, so most decisions in a run are refusals,
as under a real overload — and the same throwaway ``redis-server`` of its own
(no persistence, a free port): nothing else's Redis is touched.

Rows:

* quotagate's SQL store on SQLite, PostgreSQL and MariaDB: one conditional
  UPDATE per decision (plus MariaDB's SELECT, as it has no UPDATE … RETURNING),
  or one SELECT for a bucket the store expects to refuse (docs/decisions/114);
* quotagate's Redis store, one take per EVALSHA, and 100 or 1,000 takes per EVALSHA;
  a *decision* is one all-or-nothing take of one token from one bucket;
* the limit we measure against: redis-py calling EVALSHA on a minimal script
  (``DECR`` of one key) — one round trip and nothing else;
* the floor under it: the same EVALSHA written on a bare redis-py connection
  (no client command layer), which is how the store sends its own
  (docs/decisions/110-redis-takes-on-the-connection.md);
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
from quotagate.rate.stores import rate_store_from_url
from quotagate.store.rate_buckets import take_statement

LIMIT = 100  # per second, for every limiter
BATCHES = (100, 1000)  # takes per call in the batched rows
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
    backends: Sequence[str], stack: ExitStack, log: Callable[[str], None],
    pairs: list[PairedTakes] | None = None,
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
            note="held autocommit connection; a refusal expected: 1 SELECT"))
        raw_key = BucketKey("team-raw")
        store.configure(raw_key, CONFIG, fresh=True)
        contenders.append(raw_update_contender(store, raw_key, backend, stack))
        if pairs is not None:
            log(f"paired takes on {backend}")
            paired = PairedTakes(backend)
            paired.measure(
                store, lambda key, store=store, backend=backend: raw_update_contender(
                    store, key, backend, stack), rounds=15, block=20)
            pairs.append(paired)
    return contenders


@dataclass
class PairedTakes:
    """The SQL store and its raw UPDATE on one backend, refusals and grants apart.

    In the interleaved rows, a run begins with a full bucket: its first 100
    takes are grants, each a commit that writes (a WAL flush on a loaded
    disk, 1-20 ms here), the rest refusals that write nothing (about 0.1 ms).
    A row's rate is then mostly how fast the disk flushed during its run, and
    the store and the raw row spread tenfold. Here the two kinds are measured
    apart, store and raw alternating in blocks of a few calls.
    """

    backend: str
    times: dict[str, list[float]] = field(default_factory=dict)

    def measure(self, store: Any, raw_for: Callable[[BucketKey], Contender],
                rounds: int, block: int) -> None:
        for kind, config in (("refused", BucketConfig(1, 0)), ("granted", BucketConfig(10**9, 0))):
            mine, theirs = BucketKey(f"pair-{kind}"), BucketKey(f"pair-raw-{kind}")
            for key in (mine, theirs):
                store.configure(key, config, fresh=True)
            raw = raw_for(theirs)
            calls = {f"store {kind}": lambda key=mine, config=config: store.take(key, config),
                     f"raw {kind}": raw.decide}
            for call in calls.values():  # the refused buckets spend their one token here
                for _ in range(5):
                    call()
            for _ in range(rounds):
                for name, call in calls.items():
                    began = time.perf_counter()
                    for _ in range(block):
                        call()
                    self.times.setdefault(name, []).append(
                        (time.perf_counter() - began) / block * 1e6)

    def row(self, kind: str) -> str:
        mine = statistics.median(self.times[f"store {kind}"])
        theirs = statistics.median(self.times[f"raw {kind}"])
        return (f"{self.backend:<12} {kind:<8} {mine:>10,.0f} {theirs:>10,.0f} "
                f"{theirs / mine:>8.2f}x")


def raw_update_contender(
    store: Any, key: BucketKey, backend: str, stack: ExitStack
) -> Contender:
    """The SQL store's baseline: its conditional UPDATE, compiled once, run on the bare driver.

    Same statement, same driver (psycopg, pymysql, sqlite3), in autocommit as
    the store's own takes are (each UPDATE its own transaction, committed with
    the engine's durability settings), no SQLAlchemy and no reading of the
    bucket: one round trip per take. (Until the store held an autocommit
    connection of its own, this row ran a transaction per take: BEGIN where the
    driver sends one, the UPDATE, COMMIT — docs/decisions/114.)
    """
    engine = store.engine
    statement = take_statement(engine.dialect.name, False).compile(dialect=engine.dialect)
    text = statement.string
    if statement.positional:
        arguments: Any = tuple({"bucket_key": key.name, "amount": 1}.get(name, value)
                               for name, value in
                               ((n, statement.binds[n].value) for n in statement.positiontup))
    else:
        arguments = {**{name: bind.value for name, bind in statement.binds.items()},
                     "bucket_key": key.name, "amount": 1}
    pooled = engine.raw_connection()
    pooled.detach()  # switched to autocommit for good: never back in the pool
    connection: Any = pooled.dbapi_connection
    stack.callback(connection.close)
    if engine.dialect.name == "postgresql":
        connection.autocommit = True
    elif engine.dialect.name == "mysql":
        connection.autocommit(True)
    # sqlite3: the engine's connect hook set isolation_level None, autocommit already.
    cursor = connection.cursor()

    def decide() -> object:
        cursor.execute(text, arguments)
        return cursor.rowcount

    return Contender(f"raw conditional UPDATE, {backend}", decide,
                     note="the store's UPDATE on the bare driver, autocommit: the SQL limit")


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
    batches = [[Take(keys[index % len(keys)], CONFIG) for index in range(size)]
               for size in BATCHES]
    client = redis.Redis.from_url(url)
    stack.callback(client.close)
    sha = client.script_load(MINIMAL_SCRIPT)
    client.set("bench:raw", 10**12)
    pool = client.connection_pool
    bare = pool.connection_class(**pool.connection_kwargs)
    stack.callback(bare.disconnect)
    packed = bare.pack_command("EVALSHA", sha, 1, "bench:raw")

    def bare_evalsha() -> object:
        bare.send_packed_command(packed, check_health=False)
        return bare.read_response()

    return [
        Contender("quotagate Redis store, single", lambda: store.take(key, CONFIG),
                  note="EVALSHA per take"),
        *(Contender(f"quotagate Redis store, batch of {len(batch):,}",
                    lambda batch=batch: store.take_many(batch), per_call=len(batch),
                    note=f"{len(batch):,} takes over 10 tenants per EVALSHA")
          for batch in batches),
        Contender("raw redis-py EVALSHA, minimal script",
                  lambda: client.evalsha(sha, 1, "bench:raw"),
                  note="DECR one key: the round-trip limit"),
        Contender("bare-connection EVALSHA, minimal script", bare_evalsha,
                  note="the same, packed once, no command layer: the floor"),
        *limits_contenders(url, log),
        *pyrate_contenders(client, stack, log),
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


def pyrate_contenders(
    client: Any, stack: ExitStack, log: Callable[[str], None]
) -> list[Contender]:
    try:
        from pyrate_limiter import Duration, Limiter, Rate, RedisBucket
    except ImportError:
        log("skipped pyrate-limiter: pip install -e '.[bench]'")
        return []
    bucket = RedisBucket.init([Rate(LIMIT, Duration.SECOND)], client, "bench:pyrate")
    limiter = Limiter(bucket)
    stack.callback(limiter.close)  # its leaker thread, before the server goes away
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


def render_targets(contenders: Sequence[Contender], baseline: Contender | None) -> str:
    """Issue 14's Redis targets, judged on this run's medians."""
    rows = {each.name: each for each in contenders}
    single = rows.get("quotagate Redis store, single")
    batched = [rows[name] for name in (f"quotagate Redis store, batch of {size:,}"
                                       for size in BATCHES) if name in rows]
    limits = [each for each in contenders if each.name.startswith("limits ")]
    lines = ["Redis targets (this run; a decision = one all-or-nothing take of 1 token)"]
    if single and baseline:
        ratio = single.rate / baseline.rate
        lines.append(f"  single / raw EVALSHA      {ratio:5.2f}x  (target >= 0.90x)  "
                     f"{'met' if ratio >= 0.9 else 'NOT met'}")
    if single and limits:
        best = max(limits, key=lambda each: each.rate)
        lines.append(f"  single / best limits      {single.rate / best.rate:5.2f}x  ({best.name}; "
                     f"target > 1)  {'met' if single.rate > best.rate else 'NOT met'}")
    for batch in batched:
        size = batch.name.rpartition(" ")[2]
        lines.append(f"  batched by {size:>5}, decisions/s {batch.rate:10,.0f}  (target >= 100,000)"
                     f"  {'met' if batch.rate >= 100_000 else 'NOT met'}")
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
        pairs: list[PairedTakes] = []
        contenders = sql_contenders(backends, stack, log, pairs)
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
    if pairs:
        print()
        print("SQL store against its raw conditional UPDATE, refusals and grants apart "
              "(median µs per take, 15 alternating blocks of 20; ratio = raw time / store time)")
        print(f"{'backend':<12} {'take':<8} {'store µs':>10} {'raw µs':>10} {'ratio':>9}")
        print("\n".join(each.row(kind) for each in pairs for kind in ("refused", "granted")))
    print()
    print(render_targets(contenders, baseline))
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
