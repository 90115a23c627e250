"""Partition leases in Redis, by the rules of ``domain.lease``.

One lease per (topic, group, partition), a Redis hash ``owner``,
``generation``, ``expires`` (ms of the Redis server's clock) changed only by
the scripts in ``streams.scripts``. Acquisition succeeds only when the lease
is free or expired and always moves the generation on, so a consumer
restarted under the same name never inherits its predecessor's fencing token.
The hash is never deleted while the topic lives: the generation only grows.
Deleting the topic deletes its leases and keeps one number, the topic's lease
floor (their highest generation); a lease of a topic of the same name created
later starts above it, so a consumer of the deleted topic stays fenced
(docs/decisions/412).
"""

from __future__ import annotations

from dataclasses import dataclass

from quotagate.domain.lease import Lease, validate_owner, validate_ttl
from quotagate.errors import StaleGeneration
from quotagate.streams.connection import StreamRedis
from quotagate.streams.keys import StreamKeys


@dataclass(frozen=True)
class PartitionRef:
    topic: str
    group: str
    partition: int


class PartitionLeases:
    """Acquire, renew and release the leases of one tenant's partitions."""

    def __init__(self, redis: StreamRedis, keys: StreamKeys) -> None:
        self.redis = redis
        self.keys = keys

    def key(self, ref: PartitionRef) -> str:
        return self.keys.lease(ref.topic, ref.group, ref.partition)

    def acquire(self, ref: PartitionRef, owner: str, ttl: float) -> Lease | None:
        """The lease at a new generation, or None while someone else holds it."""
        validate_owner(owner)
        ttl_ms = int(validate_ttl(ttl) * 1000)
        name = self.key(ref)
        acquired, generation, expires, _holder = self.redis.run(
            "ACQUIRE", [name, self.keys.lease_floor(ref.topic)], [owner, ttl_ms])
        if not int(acquired):
            return None
        return Lease(name, owner, int(generation), int(expires) / 1000)

    def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend; raises StaleGeneration once a newer generation holds the lease."""
        assert lease.owner is not None
        expires = self.redis.run("RENEW", [lease.name],
                                 [lease.owner, lease.generation, int(validate_ttl(ttl) * 1000)])
        return Lease(lease.name, lease.owner, lease.generation, int(expires) / 1000)

    def release(self, lease: Lease) -> bool:
        """Give the lease up (the generation stays); False if it had moved on already."""
        assert lease.owner is not None
        try:
            self.redis.run("RELEASE", [lease.name], [lease.owner, lease.generation])
        except StaleGeneration:
            return False
        return True

    def read(self, ref: PartitionRef) -> Lease | None:
        """The lease as Redis has it now (None if never taken)."""
        name = self.key(ref)
        with self.redis.errors():
            values = self.redis.client.hmget(name, "owner", "generation", "expires")
        if values[1] is None:
            return None
        owner = values[0].decode() if values[0] else None
        return Lease(name, owner, int(values[1]), int(values[2] or 0) / 1000)
