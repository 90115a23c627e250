"""Producing to a tenant's topic: rate quota first, then one round trip of XADDs.

Each send takes its tokens from the bucket ``<tenant>:<topic>`` in the
configured rate store (the ledger database or Redis) *before* anything is
written (docs/streams.md); a refusal writes nothing and raises
:class:`RateLimited`, or, in blocking mode, waits for the bucket up to a
timeout. A batch takes all its tokens in one take, all or none, and is
appended with ``XADD … MAXLEN ~ L`` per message in one pipeline.

The topic's spec and bucket shape are read from the ledger and kept for
``refresh_every`` seconds, so a send costs no ledger round trip.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from quotagate.domain.bucket import BucketConfig
from quotagate.errors import InvalidInput, RateLimited
from quotagate.rate.backend import RateStore
from quotagate.rate.gate import retry_after_seconds
from quotagate.rate.keys import BucketKey
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
        return self._handle

    def send(self, data: bytes | str, *, key: str | None = None) -> str:
        """Append one message; return its entry id (``<partition>/<ms>-<seq>``)."""
        return self.send_many([(data, key)])[0]

    def send_many(self, messages: Iterable[Message]) -> list[str]:
        """Append a batch (all or none by the rate quota); return the entry ids in order."""
        batch: list[tuple[bytes, str | None]] = []
        for message in messages:
            data, key = message if isinstance(message, tuple) else (message, None)
            batch.append((_encode(data), key))
        if not batch:
            return []
        if len(batch) > MAX_BATCH:
            raise InvalidInput(f"a batch is at most {MAX_BATCH} messages", code="batch_too_large")
        handle = self.handle
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
            wait = retry_after_seconds(decision)
            if not self.block or decision.retry_after is None or (
                    time.monotonic() + wait > deadline):
                metrics.increment("refused", spec.tenant, spec.name, amount)
                raise RateLimited(
                    f"topic {spec.name!r} of tenant {spec.tenant!r} has no rate quota left for "
                    f"{amount} message(s) ({decision.remaining:g} tokens left); nothing was "
                    "written", code="rate_quota_exhausted", retry_after=round(wait, 3),
                    tenant=spec.tenant, topic=spec.name, tokens_left=decision.remaining,
                    capacity=decision.capacity, refill_per_second=decision.refill_per_second)
            time.sleep(max(wait, 0.001))

    def _append(self, handle: TopicHandle, batch: Sequence[tuple[bytes, str | None]]) -> list[str]:
        spec, names = handle.spec, self._partition_keys
        partitions = [
            partition_for(key, spec.partitions) if key is not None
            else next(self._round_robin) % spec.partitions
            for _, key in batch
        ]
        trim = {} if spec.max_len is None else {"maxlen": spec.max_len, "approximate": True}
        with handle.redis.errors():
            pipeline = handle.redis.client.pipeline(transaction=False)
            for (data, key), partition in zip(batch, partitions, strict=True):
                fields = {b"data": data} if key is None else {b"data": data, b"key": key.encode()}
                pipeline.xadd(names[partition], fields, **trim)
            ids = pipeline.execute()
        metrics.increment("produced", spec.tenant, spec.name, len(batch))
        return [f"{partition}/{entry.decode()}" for partition, entry in
                zip(partitions, ids, strict=True)]
