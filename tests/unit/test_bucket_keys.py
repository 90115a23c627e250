"""Bucket keys and their names in shared stores (docs/invariants.md, 8)."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from quotagate import InvalidInput
from quotagate.rate.keys import BucketKey, redis_key


def test_the_default_tenant_keeps_the_unprefixed_names() -> None:
    assert redis_key(BucketKey("default")) == "quotagate:rate:bucket"
    assert redis_key(BucketKey("default", "orders")) == "quotagate:rate:bucket:orders"


def test_other_tenants_are_prefixed_with_their_name_as_hash_tag() -> None:
    assert redis_key(BucketKey("team-a")) == "tenant:{team-a}:quotagate:rate:bucket"
    assert (redis_key(BucketKey("team-a", "orders"))
            == "tenant:{team-a}:quotagate:rate:bucket:orders")


def test_one_tenants_buckets_share_a_cluster_slot() -> None:
    slots = {key_slot(redis_key(BucketKey("team-a", topic)).encode())
             for topic in (None, "orders", "payments", "x.y_z-1")}
    assert len(slots) == 1


def test_tenants_cannot_collide_with_each_other_or_the_default() -> None:
    names = {redis_key(BucketKey(tenant, topic))
             for tenant in ("default", "team-a", "team-b", "tenant")
             for topic in (None, "orders")}
    assert len(names) == 8


def test_row_keys() -> None:
    assert BucketKey("team-a").name == "team-a"
    assert BucketKey("team-a", "orders").name == "team-a:orders"


@pytest.mark.parametrize(("tenant", "topic"), [("Team-A", None), ("team-a", "a b"),
                                                ("team-a", ""), ("team-a", "{x}")])
def test_bad_names_are_refused(tenant: str, topic: str | None) -> None:
    with pytest.raises(InvalidInput):
        BucketKey(tenant, topic)
