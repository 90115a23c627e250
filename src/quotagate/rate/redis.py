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

On a single server a call does not go through redis-py's command layer: the
store keeps its own idle redis-py connections and writes one pre-encoded
EVALSHA on one of them (docs/decisions/110-redis-takes-on-the-connection.md).
redis-py's per-command path (pool checkout and release, retry wrapper,
response callbacks, observability hooks) cost more than the round trip itself
on this machine; the connection still does the connecting, AUTH, TLS and
parsing. The cluster client keeps redis-py's path, which routes by slot.

Every Redis failure — unreachable, a timeout, an error reply such as WRONGTYPE,
READONLY or OOM — is :class:`StoreUnavailable` (HTTP 503,
``rate_store_unavailable``): the store cannot decide, so the gate fails closed.

Redis is not the ledger database, so a take cannot commit with the
submission: see :mod:`quotagate.rate.quotas` for how a token taken for a
submission that then fails is given back.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from itertools import groupby
from typing import Any

from sqlalchemy.engine import Engine

from quotagate.domain.bucket import BucketConfig, Decision, decide
from quotagate.errors import StoreUnavailable
from quotagate.rate.backend import Take
from quotagate.rate.keys import BucketKey, redis_key
from quotagate.store.redis_client import import_redis, redis_client

logger = logging.getLogger(__name__)

SCRIPT = resources.files("quotagate.rate").joinpath("token_bucket.lua").read_text()
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()
UNAVAILABLE = "rate_store_unavailable"
# redis-py turns these error replies into exception classes and drops the code the
# server sent; an operator reads the code (WRONGTYPE, the rest, keeps it in its text).
_ERROR_CODES = {"OutOfMemoryError": "OOM", "ReadOnlyError": "READONLY",
                "NoPermissionError": "NOPERM", "BusyLoadingError": "LOADING",
                "TryAgainError": "TRYAGAIN", "ExecAbortError": "EXECABORT"}
_NEEDED_BY = "the Redis rate store"


@lru_cache(maxsize=4096)
def _redis_key(key: BucketKey) -> str:
    return redis_key(key)


@lru_cache(maxsize=4096)
def _key_bulk(key: BucketKey) -> bytes:
    """The bucket's key as a RESP bulk string, encoded once."""
    return _bulk(redis_key(key).encode())


@lru_cache(maxsize=1024)
def _shape(config: BucketConfig) -> str:
    """``"capacity refill"`` as the script reads it; repr keeps every digit of a float."""
    return f"{float(config.capacity)!r} {float(config.refill_per_second)!r}"


@lru_cache(maxsize=256)
def _evalsha_head(key_count: int, operation: str) -> tuple[bytes, bytes]:
    """What comes before the keys (array length, EVALSHA, SHA, key count) and right after."""
    count = str(key_count).encode()
    head = (b"*%d\r\n" % (key_count + 5) + _bulk(b"EVALSHA") + _bulk(SCRIPT_SHA.encode())
            + _bulk(count))
    return head, _bulk(operation.encode())


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class RedisRateStore:
    """Buckets as Redis hashes, decided by :data:`SCRIPT`. Safe to share between threads."""

    def __init__(self, client: Any, *, description: str = "redis", cluster: bool = False) -> None:
        self.client = client
        self.cluster = cluster
        self._description = description
        self._redis = import_redis(_NEEDED_BY)
        # Idle connections of this process; list.pop and list.append are atomic, so
        # threads share it without a lock (each connection is used by one call at a time).
        self._idle: list[Any] = []
        self._pid = os.getpid()

    @classmethod
    def from_url(cls, url: str) -> RedisRateStore:
        built = redis_client(url, needed_by=_NEEDED_BY, invalid_code="invalid_rate_store_url",
                             unavailable_code=UNAVAILABLE)
        return cls(built.client, description=built.description, cluster=built.cluster)

    @property
    def description(self) -> str:
        return self._description

    # -- errors ------------------------------------------------------------------

    def _unavailable(self, error: Exception) -> StoreUnavailable:
        """Any Redis failure, as the 503 the gate answers with (it cannot decide)."""
        exceptions = self._redis.exceptions
        if isinstance(error, exceptions.TimeoutError):
            what = f"did not answer in time ({error})"
        elif isinstance(error, exceptions.ResponseError):
            code = _ERROR_CODES.get(type(error).__name__)
            what = f"refused the operation: {f'{code} ' if code else ''}{error}"
        else:
            what = f"cannot be reached ({error})"
        return StoreUnavailable(
            f"the rate store {self._description} {what}; no rate decision was made, retry later",
            code=UNAVAILABLE)

    # -- one script call ---------------------------------------------------------

    def _evalsha(self, keys: Sequence[BucketKey], operation: str, specification: str) -> bytes:
        if self.cluster:
            return self._evalsha_cluster([_redis_key(key) for key in keys], operation,
                                         specification)
        head, operation_bulk = _evalsha_head(len(keys), operation)
        encoded = specification.encode()
        command = b"".join((head, *map(_key_bulk, keys), operation_bulk,
                            b"$%d\r\n" % len(encoded), encoded, b"\r\n"))
        return self._call(command)

    def _call(self, command: bytes) -> bytes:
        """Send one packed EVALSHA on an idle connection of ours and read its reply.

        A connection that turns out broken while reused (the server restarted
        since) is replaced and the command sent once more; a timeout is not
        retried (the script may have run) and nothing else is.
        """
        errors = self._redis.exceptions
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours
            self._idle, self._pid = [], os.getpid()
        for attempt in (1, 2):
            try:
                connection, reused = self._idle.pop(), True
            except IndexError:  # none idle (another thread may just have taken the last)
                connection, reused = self._new_connection(), False
            try:
                try:
                    connection.send_packed_command((command,), check_health=False)
                    reply: bytes = connection.read_response()
                except errors.NoScriptError:
                    # First call on this server, or it restarted: load once, then by SHA again.
                    connection.send_command("SCRIPT", "LOAD", SCRIPT, check_health=False)
                    connection.read_response()
                    connection.send_packed_command((command,), check_health=False)
                    reply = connection.read_response()
            except errors.ResponseError as error:
                self._idle.append(connection)  # an error reply leaves the connection usable
                raise self._unavailable(error) from error
            except errors.TimeoutError as error:
                connection.disconnect()
                raise self._unavailable(error) from error
            except errors.ConnectionError as error:
                connection.disconnect()
                if reused and attempt == 1:
                    continue
                raise self._unavailable(error) from error
            except BaseException:
                connection.disconnect()
                raise
            self._idle.append(connection)
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    def _new_connection(self) -> Any:
        pool = self.client.connection_pool
        return pool.connection_class(**pool.connection_kwargs)

    def _evalsha_cluster(self, keys: list[str], operation: str, specification: str) -> bytes:
        errors = self._redis.exceptions
        try:
            try:
                result: bytes = self.client.evalsha(SCRIPT_SHA, len(keys), *keys, operation,
                                                    specification)
            except errors.NoScriptError:
                self.client.script_load(SCRIPT)
                result = self.client.evalsha(SCRIPT_SHA, len(keys), *keys, operation,
                                             specification)
        except errors.RedisError as error:
            raise self._unavailable(error) from error
        return result

    def _run(self, operation: str, items: Sequence[Take]) -> list[tuple[bool, float]]:
        """``(granted, tokens left)`` per item, in order: one script call per slot."""
        if not self.cluster:
            return self._decide(operation, items)
        slot = self.client.keyslot
        keys = [_redis_key(item.key) for item in items]
        ordered = sorted(range(len(items)), key=lambda index: slot(keys[index]))
        answers: list[tuple[bool, float]] = [(False, 0.0)] * len(items)
        for _, group in groupby(ordered, key=lambda index: slot(keys[index])):
            indexes = list(group)
            for index, answer in zip(
                indexes, self._decide(operation, [items[index] for index in indexes]),
                strict=True,
            ):
                answers[index] = answer
        return answers

    def _decide(self, operation: str, items: Sequence[Take]) -> list[tuple[bool, float]]:
        """One EVALSHA over ``items`` (all in one slot)."""
        specification = " ".join([f"{_shape(item.config)} {item.amount}" for item in items])
        words = self._evalsha([item.key for item in items], operation, specification).split()
        statuses = list(map(int, words[0::2]))
        if operation != "set" and any(status & 2 for status in statuses):
            for item, status in zip(items, statuses, strict=True):
                if status & 2:
                    self._warn_missing(item.key)
        return [(bool(status & 1), float(tokens))
                for status, tokens in zip(statuses, words[1::2], strict=True)]

    def _warn_missing(self, key: BucketKey) -> None:
        logger.warning("rate bucket %s had no state in %s (lost by a restart or eviction?); "
                       "it restarts empty", key, self._description)

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
        except self._redis.exceptions.RedisError as error:
            raise self._unavailable(error) from error

    def close(self) -> None:
        while self._idle:
            self._idle.pop().disconnect()
        self.client.close()


def open_redis_store(url: str, _ledger_engine: Engine | None) -> RedisRateStore:
    return RedisRateStore.from_url(url)
