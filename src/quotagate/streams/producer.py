"""Producing to a tenant's topic: rate quota first, then one round trip of XADDs.

Each send takes its tokens from the bucket ``<tenant>:<topic>`` in the
configured rate store (the ledger database or Redis) *before* anything is
written (docs/streams.md); a refusal writes nothing and raises
:class:`RateLimited`, or, in blocking mode, waits for the bucket up to a
timeout. A batch takes all its tokens in one take, all or none, and is
appended with ``XADD … MAXLEN ~ L`` per message in one pipeline. When the
bucket lives in the topic's own (non-cluster) Redis, the take and the appends
are one script call (``scripts.PRODUCE``): one round trip, same decision. An
empty key is no key (round robin).

The topic's spec and bucket shape are read from the ledger and kept for
``refresh_every`` seconds, so a send costs no ledger round trip.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from quotagate.domain.bucket import BucketConfig, Decision, decide
from quotagate.domain.model import check_unicode
from quotagate.domain.rate_refusal import retry_after_seconds
from quotagate.errors import InvalidInput, RateLimited, quoted
from quotagate.rate.backend import RateStore
from quotagate.rate.keys import BucketKey, redis_key
from quotagate.rate.redis import RedisRateStore
from quotagate.streams import metrics
from quotagate.streams.connection import StreamRedis
from quotagate.streams.keys import StreamKeys
from quotagate.streams.topics import TopicSpec

MAX_MESSAGE_BYTES = 1024 * 1024
MAX_BATCH = 10_000


@dataclass(frozen=True)
class TopicHandle:
    """What a producer or consumer needs of a topic, resolved once by the service."""

    spec: TopicSpec
    rate: BucketConfig | None
    redis: StreamRedis
    keys: StreamKeys
    max_in_flight: int | None = None


Message = bytes | str | tuple[bytes | str, str | None]


def partition_for(key: str, partitions: int) -> int:
    """A key's partition: CRC-32, the same in every process (``hash()`` is salted)."""
    return zlib.crc32(key.encode()) % partitions


def _encode(data: bytes | str) -> bytes:
    if isinstance(data, str):
        check_unicode(data, what="message data", code="invalid_message")
    encoded = data.encode() if isinstance(data, str) else data
    if not isinstance(encoded, bytes):
        raise InvalidInput("a message is bytes or text", code="invalid_message")
    if len(encoded) > MAX_MESSAGE_BYTES:
        raise InvalidInput(f"a message is at most {MAX_MESSAGE_BYTES} bytes",
                           code="message_too_large")
    return encoded


class Producer:
    def __init__(
        self,
        resolve: Callable[[], TopicHandle],
        rate_store: RateStore,
        *,
        block: bool = False,
        timeout: float = 10.0,
        refresh_every: float = 1.0,
    ) -> None:
        self._resolve = resolve
        self.rate_store = rate_store
        self.block = block
        self.timeout = timeout
        self.refresh_every = refresh_every
        self._handle: TopicHandle | None = None
        self._partition_keys: list[str] = []
        # The bucket's Redis key when it lives in the topic's own Redis: take and append fused.
        self._bucket_key: str | None = None
        self._resolved_at = float("-inf")
        self._round_robin = itertools.count()

    @property
    def handle(self) -> TopicHandle:
        now = time.monotonic()
        if self._handle is None or now - self._resolved_at >= self.refresh_every:
            self._handle = self._resolve()
            self._resolved_at = now
            spec = self._handle.spec
            self._partition_keys = [self._handle.keys.partition(spec.name, partition)
                                    for partition in range(spec.partitions)]
            self._bucket_key = None
            store = self.rate_store
            if isinstance(store, RedisRateStore) and not store.cluster and \
                    self._handle.redis.same_server(store.client):
                self._bucket_key = redis_key(BucketKey(spec.tenant, spec.name))
        return self._handle

    def send(self, data: bytes | str, *, key: str | None = None) -> str:
        """Append one message; return its entry id (``<partition>/<ms>-<seq>``)."""
        return self.send_many([(data, key)])[0]

    def send_many(self, messages: Iterable[Message]) -> list[str]:
        """Append a batch (all or none by the rate quota); return the entry ids in order."""
        batch: list[tuple[bytes, str | None]] = []
        for message in messages:
            data, key = message if isinstance(message, tuple) else (message, None)
            if key is not None:
                check_unicode(key, what="message key", code="invalid_message")
            batch.append((_encode(data), key))
        if not batch:
            return []
        if len(batch) > MAX_BATCH:
            raise InvalidInput(f"a batch is at most {MAX_BATCH} messages", code="batch_too_large")
        handle = self.handle
        if handle.rate is not None and self._bucket_key is not None:
            return self._take_and_append(handle, handle.rate, batch)
        self._take(handle, len(batch))
        return self._append(handle, batch)

    def _take(self, handle: TopicHandle, amount: int) -> None:
        if handle.rate is None:
            return
        spec = handle.spec
        deadline = time.monotonic() + self.timeout
        while True:
            decision = self.rate_store.take(BucketKey(spec.tenant, spec.name), handle.rate, amount)
            if decision.granted:
                return
            self._refused_or_wait(handle, decision, amount, deadline)

    def _refused_or_wait(
        self, handle: TopicHandle, decision: Decision, amount: int, deadline: float
    ) -> None:
        """Raise RateLimited, or (blocking, and the bucket refills in time) wait for it."""
        spec = handle.spec
        wait = retry_after_seconds(decision)
        if not self.block or decision.retry_after is None or time.monotonic() + wait > deadline:
            metrics.increment("refused", spec.tenant, spec.name, amount)
            raise RateLimited(
                f"topic {quoted(spec.name)} of tenant {quoted(spec.tenant)} has no rate quota left for "
                f"{amount} message(s) ({decision.remaining:g} tokens left); nothing was "
                "written", code="rate_quota_exhausted", retry_after=round(wait, 3),
                tenant=spec.tenant, topic=spec.name, tokens_left=decision.remaining,
                capacity=decision.capacity, refill_per_second=decision.refill_per_second)
        time.sleep(max(wait, 0.001))

    def _take_and_append(
        self, handle: TopicHandle, rate: BucketConfig, batch: Sequence[tuple[bytes, str | None]]
    ) -> list[str]:
        """The bucket is in the topic's Redis: decide and append in one script call."""
        spec, bucket = handle.spec, self._bucket_key
        assert bucket is not None
        partitions = self._partitions(spec, batch)
        args: list[Any] = [repr(rate.capacity), repr(rate.refill_per_second), len(batch),
                           "" if spec.max_len is None else spec.max_len]
        for (data, key), partition in zip(batch, partitions, strict=True):
            args += [partition, data, key or ""]
        deadline = time.monotonic() + self.timeout
        while True:
            reply = handle.redis.run("PRODUCE", [bucket, *self._partition_keys], args)
            if int(reply[0]):
                break
            decision = decide(rate, float(reply[1]), len(batch), False)
            self._refused_or_wait(handle, decision, len(batch), deadline)
        metrics.increment("produced", spec.tenant, spec.name, len(batch))
        return [f"{partition}/{entry.decode()}" for partition, entry in
                zip(partitions, reply[3:], strict=True)]

    def _partitions(self, spec: TopicSpec, batch: Sequence[tuple[bytes, str | None]]) -> list[int]:
        return [
            partition_for(key, spec.partitions) if key else next(self._round_robin) % spec.partitions
            for _, key in batch
        ]

    def _append(self, handle: TopicHandle, batch: Sequence[tuple[bytes, str | None]]) -> list[str]:
        spec, names = handle.spec, self._partition_keys
        partitions = self._partitions(spec, batch)
        trim = {} if spec.max_len is None else {"maxlen": spec.max_len, "approximate": True}
        with handle.redis.errors():
            pipeline = handle.redis.client.pipeline(transaction=False)
            for (data, key), partition in zip(batch, partitions, strict=True):
                fields = {b"data": data, b"key": key.encode()} if key else {b"data": data}
                pipeline.xadd(names[partition], fields, **trim)
            ids = pipeline.execute()
        metrics.increment("produced", spec.tenant, spec.name, len(batch))
        return [f"{partition}/{entry.decode()}" for partition, entry in
                zip(partitions, ids, strict=True)]
