"""Every Redis key of the stream layer, derived from one per-tenant ``StreamKeys`` value.

There is no process-global prefix: each producer, consumer and status view
holds its own ``StreamKeys``, so two tenants (or two deployments with other
prefixes) can share a process and a Redis without sharing a key.

The default tenant keeps the names a single-tenant deployment already has,
byte for byte (``stream:topic:<topic>:<partition>``, ``streaming:mq:…``), so
it needs no migration. Every other tenant's key carries ``tenant:<tenant>``:

* keys that the fenced scripts touch together (a topic's partition streams,
  DLQ, meta, leases, retry set, frontiers, group members) start with the hash
  tag ``{tenant:<tenant>:<topic>}``, so they share one Redis Cluster slot per
  *topic* — a big tenant's topics spread over the cluster;
* keys that are always used alone (the topics registry, in-flight counts,
  runtime and keyed-state keys) start with ``tenant:<tenant>:`` and no tag.

On a Redis Cluster the default tenant's topic keys need a tag too (a script
may only touch one slot): ``cluster=True`` puts ``{<topic>}:`` in front of
them; on a single Redis the names stay exactly as above (docs/streams.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quotagate.domain.model import validate_name
from quotagate.errors import InvalidInput, quoted

DEFAULT_TENANT = "default"
DEFAULT_CONTROL_PREFIX = "streaming:mq"
DEFAULT_STREAM_PREFIX = "stream:topic"
DEFAULT_RUNTIME_PREFIX = "streaming:runtime"
DEFAULT_STATE_PREFIX = "streaming:state"

# Topic, group and consumer names: no ':' (the key separator) and no braces
# (hash tags), so a name can never forge another key or slot.
# Topic names and other key parts; the HTTP API's OpenAPI document states it too.
PART_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
_PART = re.compile(PART_PATTERN)
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")


def validate_part(value: object, what: str) -> str:
    if not isinstance(value, str) or not _PART.fullmatch(value):
        raise InvalidInput(
            f"{what} must be 1-100 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            code=f"invalid_{what.replace(' ', '_')}",
        )
    return value


def _validate_prefix(value: str, what: str) -> str:
    if not _PREFIX.fullmatch(value) or value.startswith("tenant:"):
        raise InvalidInput(f"{what} {quoted(value)} must be letters, digits, '.', '_', ':' or '-' "
                           "and must not start with 'tenant:'", code="invalid_key_prefix")
    return value


@dataclass(frozen=True)
class StreamKeys:
    """The key names of one tenant's streams."""

    tenant: str = DEFAULT_TENANT
    control_prefix: str = DEFAULT_CONTROL_PREFIX
    stream_prefix: str = DEFAULT_STREAM_PREFIX
    runtime_prefix: str = DEFAULT_RUNTIME_PREFIX
    state_prefix: str = DEFAULT_STATE_PREFIX
    cluster: bool = False

    def __post_init__(self) -> None:
        validate_name(self.tenant, "tenant")
        for prefix, what in ((self.control_prefix, "control prefix"),
                             (self.stream_prefix, "stream prefix"),
                             (self.runtime_prefix, "runtime prefix"),
                             (self.state_prefix, "state key prefix")):
            _validate_prefix(prefix, what)

    @property
    def is_default(self) -> bool:
        return self.tenant == DEFAULT_TENANT

    # -- derivation ------------------------------------------------------------------

    def _topic_key(self, topic: str, name: str) -> str:
        """A key a script may touch with the topic's other keys (one slot per topic)."""
        validate_part(topic, "topic")
        if not self.is_default:
            return f"{{tenant:{self.tenant}:{topic}}}:{name}"
        return f"{{{topic}}}:{name}" if self.cluster else name

    def _tenant_key(self, name: str) -> str:
        """A key always used alone: the tenant segment, no hash tag."""
        return name if self.is_default else f"tenant:{self.tenant}:{name}"

    # -- topic keys (fenced scripts touch these together) ---------------------------------

    def partition(self, topic: str, partition: int) -> str:
        return self._topic_key(topic, f"{self.stream_prefix}:{topic}:{_index(partition)}")

    def dlq(self, topic: str) -> str:
        return self._topic_key(topic, f"{self.control_prefix}:dlq:{topic}")

    def meta(self, topic: str) -> str:
        return self._topic_key(topic, f"{self.control_prefix}:meta:{topic}")

    def lease(self, topic: str, group: str, partition: int) -> str:
        validate_part(group, "group")
        return self._topic_key(
            topic, f"{self.control_prefix}:lease:{topic}:{group}:{_index(partition)}")

    def lease_floor(self, topic: str) -> str:
        """The highest generation any deleted lease of the topic reached (docs/decisions/412):
        a lease made again starts above it."""
        return self._topic_key(topic, f"{self.control_prefix}:leasefloor:{topic}")

    def retry(self, topic: str, group: str) -> str:
        validate_part(group, "group")
        return self._topic_key(topic, f"{self.control_prefix}:retry:{topic}:{group}")

    def frontier(self, topic: str, group: str, partition: int) -> str:
        validate_part(group, "group")
        return self._topic_key(
            topic, f"{self.control_prefix}:frontier:{topic}:{group}:{_index(partition)}")

    def members(self, topic: str, group: str) -> str:
        """The group's live consumers (a sorted set scored by heartbeat expiry)."""
        validate_part(group, "group")
        return self._topic_key(topic, f"{self.control_prefix}:members:{topic}:{group}")

    # -- tenant keys (used alone) ------------------------------------------------------

    def topics(self) -> str:
        return self._tenant_key(f"{self.control_prefix}:topics")

    def in_flight(self) -> str:
        """Unacked entries per consumer, across all the tenant's topics and groups."""
        return self._tenant_key(f"{self.control_prefix}:inflight")

    def checkpoint(self, job: str) -> str:
        return self._tenant_key(f"{self.runtime_prefix}:checkpoint:{validate_part(job, 'job')}")

    def dedup(self, job: str) -> str:
        return self._tenant_key(f"{self.runtime_prefix}:dedup:{validate_part(job, 'job')}")

    def state(self, job: str, key: str = "") -> str:
        """Keyed state of ``job``: ``<stateKeyPrefix>:<job>:<key>``."""
        return self._tenant_key(f"{self.state_prefix}:{validate_part(job, 'job')}:{key}")


def _index(partition: int) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidInput("partition must be a whole number >= 0", code="invalid_partition")
    return partition
