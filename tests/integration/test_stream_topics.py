"""Topics on the ledger side, on every SQL backend: quotas charged once, refusals change nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

from quotagate import Conflict, InvalidInput, NotFound, Quotagate, StoreUnavailable
from quotagate.domain.bucket import parse_rate
from quotagate.store import schema
from quotagate.store.stream_settings import StreamSettings
from quotagate.streams.keys import StreamKeys
from support.streams import keys_of, shared_redis_url, stream_gate, tenant_with_quota


@pytest.fixture
def gate(db_url: str) -> Iterator[Quotagate]:
    with stream_gate(db_url, shared_redis_url()) as quotagate:
        yield quotagate


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(shared_redis_url())
    yield connection
    connection.close()


def _used(gate: Quotagate, tenant: str) -> dict[str, int]:
    return {row["resource"]: row["used"] for row in gate.usage()["tenants"]
            if row["tenant"] == tenant}


def _audit(gate: Quotagate, tenant: str) -> list[tuple[str, str]]:
    return [(operation, outcome) for _actor, operation, outcome in _audit_rows(gate, tenant)]


def _audit_rows(gate: Quotagate, tenant: str) -> list[tuple[str, str, str]]:
    with gate.engine.connect() as connection:
        return [(row.actor, row.operation, row.outcome) for row in connection.execute(
            sa.select(schema.audit.c.actor, schema.audit.c.operation, schema.audit.c.outcome)
            .where(schema.audit.c.tenant == tenant).order_by(schema.audit.c.id))]


def test_creating_a_topic_charges_partitions_and_parallelism_with_an_audit_entry(
    gate: Quotagate, client: redis.Redis
) -> None:
    tenant = tenant_with_quota(gate, partitions=8, parallelism=4)
    spec = gate.streams.create_topic(tenant, "orders", partitions=6, parallelism=3,
                                     actor="token:alice")
    assert (spec.partitions, spec.parallelism) == (6, 3)
    assert _used(gate, tenant) == {"partitions": 6, "parallelism": 3}
    keys = StreamKeys(tenant)
    assert client.hget(keys.meta("orders"), "partitions") == b"6"
    assert client.smembers(keys.topics()) == {b"orders"}
    assert gate.check_invariants() == []
    gate.streams.delete_topic(tenant, "orders", actor="token:bob")
    # Tenant, actor and operation of both control-plane changes, in the ledger's audit log.
    assert _audit_rows(gate, tenant)[-2:] == [("token:alice", "topic.create", "ok"),
                                              ("token:bob", "topic.delete", "released")]


def test_a_topic_over_quota_is_refused_and_nothing_is_created(
    gate: Quotagate, client: redis.Redis
) -> None:
    tenant = tenant_with_quota(gate, partitions=4, parallelism=2)
    gate.streams.create_topic(tenant, "first", partitions=3, parallelism=1)
    audit_before = _audit(gate, tenant)
    with pytest.raises(Conflict) as refused:
        gate.streams.create_topic(tenant, "second", partitions=2, parallelism=1)
    assert refused.value.code == "topic_quota_exceeded"
    assert "partitions needs 2, 1 of 4 left" in refused.value.message
    # Parallelism fits exactly (1 of 2 used): the refusal names only what is short, as committed,
    # not a row the rolled-back transaction had charged already.
    assert "parallelism" not in refused.value.message
    assert _used(gate, tenant) == {"partitions": 3, "parallelism": 1}
    assert [spec.name for spec in gate.streams.topics.specs(tenant)] == ["first"]
    assert _audit(gate, tenant) == audit_before
    assert keys_of(client, f"*tenant:{tenant}:second*") == []
    assert client.smembers(StreamKeys(tenant).topics()) == {b"first"}
    gate.streams.delete_topic(tenant, "first")


def test_a_tenant_without_a_partitions_quota_cannot_create_topics(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.set_tenant(tenant + "x", {"gpu": 1})
    with pytest.raises(Conflict, match="partitions: no quota"):
        gate.streams.create_topic(tenant + "x", "orders", partitions=1, parallelism=1)
    assert gate.streams.topics.specs(tenant + "x") == []


def test_delete_returns_the_quota_exactly_once(gate: Quotagate, client: redis.Redis) -> None:
    tenant = tenant_with_quota(gate, partitions=4, parallelism=4)
    gate.streams.create_topic(tenant, "orders", partitions=4, parallelism=2)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def delete() -> None:
        barrier.wait(timeout=30)
        try:
            gate.streams.delete_topic(tenant, "orders")
            outcomes.append("deleted")
        except NotFound:
            outcomes.append("not found")

    threads = [threading.Thread(target=delete) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["deleted", "not found", "not found", "not found"]
    assert _used(gate, tenant) == {"partitions": 0, "parallelism": 0}
    assert gate.check_invariants() == []
    assert keys_of(client, f"*tenant:{tenant}:*") == []
    # The quota is whole again: the same topic fits once more.
    gate.streams.create_topic(tenant, "orders", partitions=4, parallelism=4)
    gate.streams.delete_topic(tenant, "orders")


def test_max_length_is_capped_by_the_tenants_stream_length_limit(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.topics.set_settings(tenant, max_len=1000)
    with pytest.raises(InvalidInput) as refused:
        gate.streams.create_topic(tenant, "big", partitions=1, parallelism=1, max_len=1001)
    assert refused.value.code == "max_len_above_limit"
    assert _used(gate, tenant) == {"partitions": 0, "parallelism": 0}
    assert gate.streams.create_topic(tenant, "default-len", partitions=1,
                                     parallelism=1).max_len == 1000
    assert gate.streams.create_topic(tenant, "small", partitions=1, parallelism=1,
                                     max_len=10).max_len == 10
    for name in ("default-len", "small"):
        gate.streams.delete_topic(tenant, name)


def test_a_second_topic_of_the_same_name_is_a_conflict_and_charges_nothing(
    gate: Quotagate,
) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    with pytest.raises(Conflict, match="exists already"):
        gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    assert _used(gate, tenant) == {"partitions": 2, "parallelism": 1}
    gate.streams.delete_topic(tenant, "orders")


@pytest.mark.parametrize("options", [{"partitions": 0, "parallelism": 1},
                                     {"partitions": 1, "parallelism": 0},
                                     {"partitions": 1, "parallelism": 1, "max_len": 0}])
def test_bad_specs_are_refused_with_nothing_changed(
    gate: Quotagate, options: dict[str, int]
) -> None:
    tenant = tenant_with_quota(gate)
    with pytest.raises(InvalidInput):
        gate.streams.create_topic(tenant, "orders", **options)
    assert _used(gate, tenant) == {"partitions": 0, "parallelism": 0}


def test_a_topic_rate_quota_is_the_tenant_topic_bucket(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1,
                              rate=parse_rate("capacity=3,refill=0"))
    status = gate.rate_status(tenant, topic="orders")
    assert status is not None and status["key"] == f"{tenant}:orders" and status["capacity"] == 3
    gate.streams.delete_topic(tenant, "orders")
    assert gate.rate_status(tenant, topic="orders") is None


def test_the_invariant_check_sees_a_topic_charge_that_drifted(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    with gate.engine.begin() as connection:
        connection.execute(schema.topic.delete().where(schema.topic.c.tenant == tenant))
    assert any(f"tenant {tenant} partitions: used 2" in v for v in gate.check_invariants())


def test_a_tenant_with_topics_is_not_moved_to_another_redis(gate: Quotagate) -> None:
    """Its streams would stay behind in the old Redis while the ledger sent its producers
    and consumers to the new one: refused, nothing changed, until its topics are gone."""
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    audit_before = _audit(gate, tenant)
    with pytest.raises(Conflict) as refused:
        gate.streams.set_settings(tenant, redis_url="redis://127.0.0.1:6390/0", max_len=5)
    assert refused.value.code == "tenant_has_topics" and "orders" in refused.value.message
    assert gate.streams.settings(tenant) == StreamSettings(tenant)
    assert _audit(gate, tenant) == audit_before
    gate.streams.set_settings(tenant, max_len=5)  # other settings still change
    gate.streams.delete_topic(tenant, "orders")
    moved = gate.streams.set_settings(tenant, redis_url="redis://127.0.0.1:6390/0")
    assert moved.redis_url == "redis://127.0.0.1:6390/0" and moved.max_len == 5


@pytest.mark.parametrize(("changes", "code"), [
    ({"redis_url": "http://example.com"}, "invalid_redis_url"),
    ({"max_len": 0}, "invalid_max_length"),
    ({"max_in_flight": -1}, "invalid_max_in_flight"),
])
def test_bad_stream_settings_are_refused_with_nothing_changed(
    gate: Quotagate, changes: dict[str, object], code: str
) -> None:
    tenant = tenant_with_quota(gate)
    audit_before = _audit(gate, tenant)
    with pytest.raises(InvalidInput) as refused:
        gate.streams.set_settings(tenant, **changes)
    assert refused.value.code == code
    assert gate.streams.settings(tenant) == StreamSettings(tenant)
    assert _audit(gate, tenant) == audit_before


def test_a_delete_refused_while_the_stream_redis_is_unreachable_changes_nothing(
    gate: Quotagate, db_url: str, client: redis.Redis
) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    audit_before = _audit(gate, tenant)
    with stream_gate(db_url, "redis://127.0.0.1:1/0") as cut_off, pytest.raises(
            StoreUnavailable) as refused:
        cut_off.streams.delete_topic(tenant, "orders")
    assert refused.value.code == "stream_store_unavailable"
    assert [spec.name for spec in gate.streams.list_topics(tenant)] == ["orders"]
    assert _used(gate, tenant) == {"partitions": 2, "parallelism": 1}
    assert _audit(gate, tenant) == audit_before
    assert client.exists(StreamKeys(tenant).meta("orders"))
    gate.streams.delete_topic(tenant, "orders")


def test_a_topic_created_again_starts_empty_whatever_an_earlier_one_left(
    gate: Quotagate, client: redis.Redis
) -> None:
    """Keys an interrupted delete left behind (streams, DLQ, a group's frontier) are no part
    of a new topic of the same name."""
    tenant = tenant_with_quota(gate)
    keys = StreamKeys(tenant)
    client.xadd(keys.partition("orders", 0), {"data": "old"})
    client.xgroup_create(keys.partition("orders", 0), "g", id="0")
    client.set(keys.frontier("orders", "g", 0), "1-0")
    client.xadd(keys.dlq("orders"), {"data": "old"})
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    status = gate.streams.status(tenant, "orders")
    assert status.partitions[0].length == 0 and status.partitions[0].groups == []
    assert status.dlq_length == 0 and not client.exists(keys.frontier("orders", "g", 0))
    gate.streams.delete_topic(tenant, "orders")


def test_a_topic_created_while_the_stream_redis_is_unreachable_leaves_nothing(
    gate: Quotagate, db_url: str
) -> None:
    """Redis is written as the transaction's last step: its failure rolls the charge back."""
    tenant = tenant_with_quota(gate)
    audit_before = _audit(gate, tenant)
    with stream_gate(db_url, "redis://127.0.0.1:1/0") as cut_off, pytest.raises(
            StoreUnavailable):
        cut_off.streams.create_topic(tenant, "orders", partitions=2, parallelism=1,
                                     rate=parse_rate("capacity=5,refill=1"))
    assert gate.streams.list_topics(tenant) == []
    assert _used(gate, tenant) == {"partitions": 0, "parallelism": 0}
    assert _audit(gate, tenant) == audit_before
    assert gate.rate_status(tenant, topic="orders") is None


def test_a_stream_redis_answering_an_error_is_unavailable_not_a_crash(
    gate: Quotagate, db_url: str
) -> None:
    """A database index the server does not have: every connection's SELECT is refused."""
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    with stream_gate(db_url, "redis://127.0.0.1:6379/999999") as refusing:
        with pytest.raises(StoreUnavailable) as status_refused:
            refusing.streams.status(tenant, "orders")
        with pytest.raises(StoreUnavailable) as produce_refused:
            refusing.streams.producer(tenant, "orders").send_many([b"hello"])
    for refused in (status_refused, produce_refused):
        assert refused.value.code == "stream_store_unavailable"
        assert "DB index is out of range" in str(refused.value)
    gate.streams.delete_topic(tenant, "orders")
