"""Which bucket a take is about, and the names it has in each store.

A bucket belongs to a tenant, optionally narrowed to a topic (``tenant:topic``
production-rate quotas, docs/streams.md). In shared stores a tenant's keys are
namespaced (docs/invariants.md, 8): ``tenant:{team-a}:`` in front of the name the
key would have without tenants, the tenant in braces so that all of one
tenant's keys share a Redis Cluster hash slot. The default tenant keeps the
un-prefixed names, so a single-tenant deployment's keys do not move.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quotagate.domain.model import validate_name
from quotagate.errors import InvalidInput

DEFAULT_TENANT = "default"
REDIS_BASE_NAME = "quotagate:rate:bucket"

_TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True, order=True)
class BucketKey:
    tenant: str
    topic: str | None = None

    def __post_init__(self) -> None:
        validate_name(self.tenant, "tenant")
        if self.topic is not None and not _TOPIC_PATTERN.fullmatch(self.topic):
            raise InvalidInput(
                "topic must be 1-100 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
                code="invalid_topic",
            )

    @property
    def name(self) -> str:
        """The row key in ``qg_rate_bucket``: ``team-a`` or ``team-a:orders``."""
        return self.tenant if self.topic is None else f"{self.tenant}:{self.topic}"

    def __str__(self) -> str:
        return self.name


def redis_key(key: BucketKey) -> str:
    """The Redis key of a bucket (see the module docstring)."""
    name = REDIS_BASE_NAME if key.topic is None else f"{REDIS_BASE_NAME}:{key.topic}"
    if key.tenant == DEFAULT_TENANT:
        return name
    return f"tenant:{{{key.tenant}}}:{name}"
