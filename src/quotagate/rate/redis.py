"""Token buckets in Redis: one Lua script, loaded once, decides every operation.

The script (``token_bucket.lua``) refills from the Redis server's clock and
takes all-or-nothing in one atomic step. It is sent once per server with
SCRIPT LOAD and then called by its SHA (EVALSHA); a server that answers
NOSCRIPT — restarted, or failed over — gets it again.

Keys follow :func:`quotagate.rate.keys.redis_key`: the default tenant keeps
the un-prefixed names, other tenants' keys carry ``tenant:{name}:``, whose
hash tag keeps one tenant's buckets in one Redis Cluster slot. A batch of
takes is one EVALSHA on a single server; on a cluster (``redis+cluster://``)
one EVALSHA per hash slot, since a script may only touch keys of one slot.

Redis is not the ledger database, so a take cannot commit with the
submission: see :mod:`quotagate.rate.quotas` for how a token taken for a
submission that then fails is given back.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from itertools import groupby
from typing import Any

from sqlalchemy.engine import Engine

from quotagate.domain.bucket import BucketConfig, Decision, decide
from quotagate.errors import InvalidInput, StoreUnavailable
from quotagate.rate.backend import Take
from quotagate.rate.keys import BucketKey, redis_key
from quotagate.store.engine import redact

logger = logging.getLogger(__name__)

SCRIPT = resources.files("quotagate.rate").joinpath("token_bucket.lua").read_text()
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


@lru_cache(maxsize=4096)
def _redis_key(key: BucketKey) -> str:
    return redis_key(key)


@lru_cache(maxsize=1024)
def _shape(config: BucketConfig) -> str:
    """``"capacity refill"`` as the script reads it; repr keeps every digit of a float."""
    return f"{float(config.capacity)!r} {float(config.refill_per_second)!r}"


def _import_redis() -> Any:
    try:
        import redis
    except ModuleNotFoundError as exc:
        raise InvalidInput(
            "the Redis rate store needs the redis package: pip install 'quotagate[redis]'",
            code="driver_missing",
        ) from exc
    return redis


class RedisRateStore:
    """Buckets as Redis hashes, decided by :data:`SCRIPT`."""

    def __init__(self, client: Any, *, description: str = "redis", cluster: bool = False) -> None:
        self.client = client
        self.cluster = cluster
        self._description = description
        self._redis = _import_redis()

    @classmethod
    def from_url(cls, url: str) -> RedisRateStore:
        redis = _import_redis()
        cluster = url.startswith("redis+cluster://")
        try:
            if cluster:
                client = redis.RedisCluster.from_url("redis://" + url.removeprefix("redis+cluster://"))
            else:
                client = redis.Redis.from_url(url)
        except ValueError as exc:
            raise InvalidInput(f"rate store URL is not a Redis URL: {exc}",
                               code="invalid_rate_store_url") from exc
        return cls(client, description=redact(url), cluster=cluster)

    @property
    def description(self) -> str:
        return self._description

    # -- the script ------------------------------------------------------------

    def _evalsha(self, keys: list[str], args: list[Any]) -> bytes:
        errors = self._redis.exceptions
        try:
            try:
                result: bytes = self.client.evalsha(SCRIPT_SHA, len(keys), *keys, *args)
            except errors.NoScriptError:
                # First call on this server, or it restarted: load once, then by SHA again.
                self.client.script_load(SCRIPT)
                result = self.client.evalsha(SCRIPT_SHA, len(keys), *keys, *args)
        except (errors.ConnectionError, errors.TimeoutError) as exc:
            raise StoreUnavailable(
                f"the rate store {self._description} cannot be reached; nothing was taken",
                code="rate_store_unavailable",
            ) from exc
        return result

    def _run(self, operation: str, items: Sequence[Take]) -> list[tuple[bool, float]]:
        keys = [_redis_key(item.key) for item in items]
        if not self.cluster:
            groups = [list(range(len(items)))]
        else:
            slot = self.client.keyslot
            ordered = sorted(range(len(items)), key=lambda index: slot(keys[index]))
            groups = [list(group) for _, group in groupby(ordered, key=lambda i: slot(keys[i]))]
        answers: list[tuple[bool, float]] = [(False, 0.0)] * len(items)
        for group in groups:
            specification = " ".join(
                f"{_shape(items[index].config)} {items[index].amount}" for index in group
            )
            words = self._evalsha([keys[index] for index in group], [operation, specification])
            reply = words.split()
            for position, index in enumerate(group):
                status = int(reply[2 * position])
                if status & 2 and operation != "set":
                    logger.warning("rate bucket %s had no state in %s (lost by a restart or "
                                   "eviction?); it restarts empty", items[index].key,
                                   self._description)
                answers[index] = (bool(status & 1), float(reply[2 * position + 1]))
        return answers

    # -- the port ----------------------------------------------------------------

    def configure(self, key: BucketKey, config: BucketConfig, *, fresh: bool) -> float:
        start = int(config.capacity) if fresh else -1
        return self._run("set", [Take(key, config, start)])[0][1]

    def take(self, key: BucketKey, config: BucketConfig, amount: int = 1) -> Decision:
        return self.take_many([Take(key, config, amount)])[0]

    def take_many(self, takes: Sequence[Take]) -> list[Decision]:
        answers = self._run("take", takes)
        return [decide(item.config, tokens, item.amount, granted)
                for item, (granted, tokens) in zip(takes, answers, strict=True)]

    def add(self, key: BucketKey, config: BucketConfig, amount: int) -> float:
        return self._run("add", [Take(key, config, amount)])[0][1]

    def peek(self, key: BucketKey, config: BucketConfig) -> float:
        return self._run("peek", [Take(key, config, 0)])[0][1]

    def forget(self, key: BucketKey) -> None:
        try:
            self.client.delete(redis_key(key))
        except (self._redis.exceptions.ConnectionError, self._redis.exceptions.TimeoutError) as exc:
            raise StoreUnavailable(f"the rate store {self._description} cannot be reached",
                                   code="rate_store_unavailable") from exc

    def close(self) -> None:
        self.client.close()


def open_redis_store(url: str, _ledger_engine: Engine | None) -> RedisRateStore:
    return RedisRateStore.from_url(url)
