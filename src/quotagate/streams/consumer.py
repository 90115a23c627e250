"""A fenced consumer of one group: partitions shared out by leases, acks under the generation.

Every consumer of a group heartbeats into the group's member set; the live
members, by name, share the partitions round-robin (only the first
``parallelism`` of them get any: the topic's parallelism is a cap). A
consumer acquires the lease of each partition assigned to it — only once the
previous holder's lease is free or expired, at a new generation — and lets go
of those no longer assigned to it.

Everything it does on a partition goes through a script that first checks
the lease (``streams.scripts``): reading new entries (``XREADGROUP``),
claiming entries pending past the visibility timeout, moving entries to the
DLQ after ``max_deliveries`` deliveries, acking, and advancing the commit
frontier. A consumer revived after a takeover — even under the same name —
is refused (:class:`StaleGeneration`), drops the partition and says so.

The tenant's in-flight cap (unacked entries across all its consumers) is
enforced once per batch, not per message: before reading, the consumer asks
for ``held + batch`` and reads only what it was allowed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from quotagate.domain.lease import Lease, validate_owner
from quotagate.errors import InvalidInput, NotFound, StaleGeneration
from quotagate.streams import metrics
from quotagate.streams.keys import validate_part
from quotagate.streams.leases import PartitionLeases, PartitionRef
from quotagate.streams.producer import TopicHandle

log = logging.getLogger("quotagate.streams")

MAX_ERROR_CHARS = 500
RESOLVE_EVERY = 5.0  # seconds between reads of the topic's spec and the tenant's settings


@dataclass(frozen=True)
class Entry:
    """One stream entry handed to a handler."""

    partition: int
    id: str
    data: bytes
    key: str | None = None

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")


@dataclass
class SettleResult:
    acked: int = 0
    refused: list[StaleGeneration] = field(default_factory=list)


@dataclass
class _Owned:
    lease: Lease
    consumer: str  # the name inside the Redis group: name and generation
    takeover: bool = True  # claim everything pending first: the old holder is fenced off
    next_claim: float = 0.0


def _decode_entry(partition: int, raw: Any) -> Entry | None:
    entry_id, fields = raw
    if fields is None:  # deleted or trimmed while pending
        return None
    values = fields if isinstance(fields, dict) else dict(zip(fields[0::2], fields[1::2], strict=True))
    key = values.get(b"key")
    return Entry(partition, entry_id.decode(), values.get(b"data", b""),
                 None if key is None else key.decode())


class Consumer:
    def __init__(
        self,
        resolve: Callable[[], TopicHandle],
        group: str,
        name: str,
        *,
        batch: int = 100,
        lease_ttl: float = 3.0,
        visibility_timeout: float = 30.0,
        max_deliveries: int = 5,
        poll_interval: float = 0.02,
        dlq_max_len: int = 100_000,
    ) -> None:
        validate_part(group, "group")
        validate_part(name, "consumer name")  # says "consumer", not the lease's "worker"
        validate_owner(name)
        if batch < 1 or max_deliveries < 1 or visibility_timeout <= 0:
            raise InvalidInput("batch and max deliveries must be at least 1, the visibility "
                               "timeout positive", code="invalid_consumer_option")
        self._resolve = resolve
        self.handle = resolve()
        self._resolved_at = time.monotonic()
        self.group = group
        self.name = name
        self.batch = batch
        self.lease_ttl = lease_ttl
        self.visibility_timeout = visibility_timeout
        self.max_deliveries = max_deliveries
        self.poll_interval = poll_interval
        self.dlq_max_len = dlq_max_len
        # In-flight accounting is per process: two processes of one name are two instances.
        self.instance = f"{name}:{uuid.uuid4().hex[:12]}"
        spec, keys = self.handle.spec, self.handle.keys
        self.tenant, self.topic = spec.tenant, spec.name
        self.redis = self.handle.redis
        self.leases = PartitionLeases(self.redis, keys)
        self.owned: dict[int, _Owned] = {}
        self.assigned: set[int] = set()
        self.refusals: list[StaleGeneration] = []
        # What ``run`` did besides acking, for the CLI's summary: handler failures (each
        # redelivered later) and entries moved to the DLQ.
        self.failures = 0
        self.dead_lettered = 0
        self._held: dict[int, set[str]] = {}
        self._next_tick = 0.0
        self._last_activity = time.monotonic()
        self._streams = [keys.partition(self.topic, p) for p in range(spec.partitions)]
        self._frontiers = [keys.frontier(self.topic, group, p) for p in range(spec.partitions)]
        self._retry = keys.retry(self.topic, group)
        self._dlq = keys.dlq(self.topic)
        self._members = keys.members(self.topic, group)
        self._in_flight = keys.in_flight()

    # -- ownership ----------------------------------------------------------------------

    def tick(self) -> None:
        """Heartbeat, work out this consumer's share, let go of and take leases, renew.

        Every few seconds the topic is read again from the ledger: a deleted topic
        stops its consumers (NotFound) instead of being recreated by their reads.
        """
        if time.monotonic() - self._resolved_at >= RESOLVE_EVERY:
            try:
                self.handle = self._resolve()
            except NotFound:
                for partition in list(self.owned):
                    self._let_go(partition)
                raise
            self._resolved_at = time.monotonic()
        ttl_ms = int(self.lease_ttl * 1000)
        live = [member.decode() for member in
                self.redis.run("MEMBERS", [self._members], [self.name, ttl_ms])]
        active = live[: self.handle.spec.parallelism]
        partitions = self.handle.spec.partitions
        self.assigned = {p for p in range(partitions)
                         if active and active[p % len(active)] == self.name}
        for partition in sorted(set(self.owned) - self.assigned):
            self._let_go(partition)
        for partition, owned in list(self.owned.items()):
            try:
                owned.lease = self.leases.renew(owned.lease, self.lease_ttl)
            except StaleGeneration as refusal:
                self._refused(partition, refusal)
        for partition in sorted(self.assigned - set(self.owned)):
            ref = PartitionRef(self.topic, self.group, partition)
            lease = self.leases.acquire(ref, self.name, self.lease_ttl)
            if lease is None:
                continue
            with self.redis.errors():
                try:
                    self.redis.client.xgroup_create(self._streams[partition], self.group, id="0",
                                                    mkstream=True)
                except self.redis._redis.exceptions.ResponseError as error:
                    if "BUSYGROUP" not in str(error):
                        raise
            self.owned[partition] = _Owned(lease, f"{self.name}:{lease.generation}")
            self._held.setdefault(partition, set())
            self._last_activity = time.monotonic()
            log.info("%s owns %s/%s partition %d at generation %d", self.name, self.tenant,
                     self.topic, partition, lease.generation)
        self._report_lag()
        self._next_tick = time.monotonic() + self.lease_ttl / 3

    def _let_go(self, partition: int) -> None:
        owned = self.owned.pop(partition)
        self._held.pop(partition, None)
        self.leases.release(owned.lease)

    def _refused(self, partition: int, refusal: StaleGeneration) -> None:
        """A newer generation owns the partition: drop it, count it, and say so."""
        self.owned.pop(partition, None)
        self._held.pop(partition, None)
        self.refusals.append(refusal)
        metrics.increment("stale", self.tenant, self.topic)
        log.warning("%s: %s", self.name, refusal.message)

    def _report_lag(self) -> None:
        if not self.owned:
            return
        with self.redis.errors():
            pipeline = self.redis.client.pipeline(transaction=False)
            for partition in self.owned:
                pipeline.xinfo_groups(self._streams[partition])
            replies = pipeline.execute(raise_on_error=False)
        lag = 0
        for groups in replies:
            if isinstance(groups, Exception):
                continue
            for group in groups:
                if group.get("name") in (self.group, self.group.encode()):
                    lag += int(group.get("lag") or 0)
        metrics.set_gauge("lag", self.tenant, self.topic, self.group, lag)

    # -- reading --------------------------------------------------------------------

    @property
    def held(self) -> int:
        return sum(len(ids) for ids in self._held.values())

    def poll(self) -> list[Entry]:
        """Entries to handle now: claimed ones first, then new ones, on owned partitions only."""
        if time.monotonic() >= self._next_tick:
            self.tick()
        budget = self._budget()
        entries: list[Entry] = []
        now = time.monotonic()
        for partition, owned in list(self.owned.items()):
            if budget <= 0:
                break
            if owned.takeover or now >= owned.next_claim:
                claimed = self._claim(partition, owned, budget)
                entries += claimed
                budget -= len(claimed)
        reads = [(partition, owned) for partition, owned in self.owned.items()
                 if not owned.takeover]
        if budget > 0 and reads:
            entries += self._read(reads, budget)
        if entries:
            self._last_activity = time.monotonic()
        return entries

    def _budget(self) -> int:
        cap = self.handle.max_in_flight
        if cap is None:
            return self.batch
        held = self.held
        allowed = int(self.redis.run("IN_FLIGHT", [self._in_flight], [
            self.instance, held + self.batch, cap, int(self.lease_ttl * 3000), held]))
        return max(0, allowed - held)

    def _claim(self, partition: int, owned: _Owned, budget: int) -> list[Entry]:
        min_idle = 0 if owned.takeover else int(self.visibility_timeout * 1000)
        count = min(budget, self.batch)
        lease = owned.lease
        try:
            dead, claimed = self.redis.run(
                "CLAIM", [lease.name, self._streams[partition], self._retry, self._dlq],
                [lease.owner, lease.generation, self.group, owned.consumer, min_idle, count,
                 self.max_deliveries, self.dlq_max_len])
        except StaleGeneration as refusal:
            self._refused(partition, refusal)
            return []
        held = self._held.setdefault(partition, set())
        for entry_id in dead:
            held.discard(entry_id.decode())
        metrics.increment("dead_lettered", self.tenant, self.topic, len(dead))
        self.dead_lettered += len(dead)
        entries = [entry for raw in claimed if (entry := _decode_entry(partition, raw))]
        if owned.takeover and len(claimed) + len(dead) < count:
            owned.takeover = False
        owned.next_claim = time.monotonic() + self.visibility_timeout / 2
        if not owned.takeover:
            metrics.increment("redelivered", self.tenant, self.topic, len(entries))
        held.update(entry.id for entry in entries)
        metrics.increment("consumed", self.tenant, self.topic, len(entries))
        return entries

    def _read(self, reads: Sequence[tuple[int, _Owned]], budget: int) -> list[Entry]:
        share = max(1, budget // len(reads))
        replies = self.redis.run_many([
            ("READ", [owned.lease.name, self._streams[partition]],
             [owned.lease.owner, owned.lease.generation, self.group, owned.consumer,
              min(share, self.batch)])
            for partition, owned in reads])
        entries: list[Entry] = []
        for (partition, _owned), reply in zip(reads, replies, strict=True):
            if isinstance(reply, Exception):
                self._raise_or_refuse(partition, reply)
                continue
            if not reply:
                continue
            _stream, raw_entries = reply[0]
            got = [entry for raw in raw_entries if (entry := _decode_entry(partition, raw))]
            self._held.setdefault(partition, set()).update(entry.id for entry in got)
            entries += got
        metrics.increment("consumed", self.tenant, self.topic, len(entries))
        return entries

    def _raise_or_refuse(self, partition: int, error: Exception) -> None:
        try:
            with self.redis.errors():
                raise error
        except StaleGeneration as refusal:
            self._refused(partition, refusal)

    # -- settling --------------------------------------------------------------------

    def settle(
        self, acked: Iterable[Entry], failed: Iterable[tuple[Entry, str]] = ()
    ) -> SettleResult:
        """Ack ``acked`` and record the errors of ``failed`` (redelivered after the visibility
        timeout), one fenced script per partition, all in one round trip."""
        by_partition: dict[int, tuple[list[str], list[str]]] = {}
        for entry in acked:
            by_partition.setdefault(entry.partition, ([], []))[0].append(entry.id)
        for entry, error in failed:
            by_partition.setdefault(entry.partition, ([], []))[1].extend(
                [entry.id, error[:MAX_ERROR_CHARS]])
        result = SettleResult()
        if not by_partition:
            return result
        calls: list[tuple[int, list[str]]] = []
        scripts: list[tuple[str, list[str], list[Any]]] = []
        for partition, (ids, failures) in sorted(by_partition.items()):
            owned = self.owned.get(partition)
            if owned is None:
                refusal = StaleGeneration(
                    f"{self.name} no longer owns {self.topic} partition {partition}: "
                    f"{len(ids)} ack(s) not sent", code="stale_generation")
                result.refused.append(refusal)
                self.refusals.append(refusal)
                continue
            lease = owned.lease
            scripts.append(("SETTLE", [lease.name, self._streams[partition],
                                       self._frontiers[partition], self._retry],
                            [lease.owner, lease.generation, self.group, len(ids), *ids,
                             *failures]))
            calls.append((partition, ids))
        if calls and self.handle.max_in_flight is not None:
            # In the same round trip: this instance now holds the acked entries less.
            after = self.held - sum(len(ids) for _, ids in calls)
            scripts.append(("IN_FLIGHT", [self._in_flight], [
                self.instance, after, self.handle.max_in_flight, int(self.lease_ttl * 3000),
                after]))
        replies = self.redis.run_many(scripts)[: len(calls)] if calls else []
        for (partition, ids), reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                before = len(self.refusals)
                self._raise_or_refuse(partition, reply)
                result.refused += self.refusals[before:]
                continue
            result.acked += int(reply[0])
            held = self._held.get(partition)
            if held is not None:
                held.difference_update(ids)
        metrics.increment("acked", self.tenant, self.topic, result.acked)
        return result

    # -- the loop -------------------------------------------------------------------------

    def idle_for(self) -> float:
        """Seconds with nothing new or pending on a full share of partitions (0 if busy)."""
        if self.assigned - set(self.owned) or self.held:
            return 0.0
        return time.monotonic() - self._last_activity

    def run(
        self,
        handler: Callable[[Entry], None],
        *,
        stop: threading.Event | None = None,
        until_idle: float | None = None,
    ) -> int:
        """Handle entries until ``stop`` is set (or idle for ``until_idle`` seconds);
        return how many were acked. A handler that raises fails that entry."""
        stop = stop or threading.Event()
        total = 0
        while not stop.is_set():
            entries = self.poll()
            if not entries:
                if until_idle is not None and self.idle_for() >= until_idle:
                    break
                stop.wait(self.poll_interval)
                continue
            acked: list[Entry] = []
            failed: list[tuple[Entry, str]] = []
            for entry in entries:
                try:
                    handler(entry)
                except Exception as error:
                    failed.append((entry, f"{type(error).__name__}: {error}"))
                else:
                    acked.append(entry)
            self.failures += len(failed)
            total += self.settle(acked, failed).acked
        return total

    def close(self) -> None:
        """Release the leases and leave the group, so others need not wait for expiry."""
        try:
            for partition in list(self.owned):
                self._let_go(partition)
            with self.redis.errors():
                self.redis.client.zrem(self._members, self.name)
                self.redis.client.hdel(self._in_flight, self.instance)
        except Exception as error:  # closing must not hide the error that made us close
            self.owned.clear()
            log.warning("%s could not leave the group cleanly (its leases expire by "
                        "themselves): %s", self.name, getattr(error, "message", error))

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
