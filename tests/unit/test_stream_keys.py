"""StreamKeys: the default tenant's names byte for byte, every other tenant namespaced."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from quotagate.errors import InvalidInput
from quotagate.streams.keys import StreamKeys


def _all_keys(keys: StreamKeys, topic: str = "orders") -> list[str]:
    return [
        keys.partition(topic, 0), keys.partition(topic, 3), keys.dlq(topic), keys.meta(topic),
        keys.lease(topic, "billing", 3), keys.retry(topic, "billing"),
        keys.frontier(topic, "billing", 3), keys.members(topic, "billing"), keys.topics(),
        keys.in_flight(), keys.checkpoint("job-1"), keys.dedup("job-1"),
        keys.state("job-1", "user-7"),
    ]


def test_default_tenant_keeps_todays_names_byte_for_byte() -> None:
    keys = StreamKeys()
    assert keys.partition("orders", 3) == "stream:topic:orders:3"
    assert keys.dlq("orders") == "streaming:mq:dlq:orders"
    assert keys.meta("orders") == "streaming:mq:meta:orders"
    assert keys.lease("orders", "billing", 3) == "streaming:mq:lease:orders:billing:3"
    assert keys.retry("orders", "billing") == "streaming:mq:retry:orders:billing"
    assert keys.frontier("orders", "billing", 3) == "streaming:mq:frontier:orders:billing:3"
    assert keys.topics() == "streaming:mq:topics"
    assert keys.checkpoint("job-1") == "streaming:runtime:checkpoint:job-1"
    assert keys.dedup("job-1") == "streaming:runtime:dedup:job-1"
    assert keys.state("job-1", "user-7") == "streaming:state:job-1:user-7"


def test_prefixes_are_configurable_per_instance() -> None:
    custom = StreamKeys(control_prefix="app2:mq", stream_prefix="app2:topic",
                        runtime_prefix="app2:runtime", state_prefix="app2:state")
    assert custom.partition("orders", 0) == "app2:topic:orders:0"
    assert custom.lease("orders", "g", 0) == "app2:mq:lease:orders:g:0"
    assert custom.checkpoint("job") == "app2:runtime:checkpoint:job"
    assert custom.state("job", "k") == "app2:state:job:k"
    # Another instance in the same process is unaffected: no global state.
    assert StreamKeys().partition("orders", 0) == "stream:topic:orders:0"


def test_every_key_of_another_tenant_carries_the_tenant_segment() -> None:
    for name in _all_keys(StreamKeys("team-a")):
        assert "tenant:team-a:" in name, name


def test_two_tenants_with_a_topic_of_the_same_name_share_no_key() -> None:
    names = [set(_all_keys(StreamKeys(tenant))) for tenant in ("default", "team-a", "team-b")]
    assert not names[0] & names[1] and not names[0] & names[2] and not names[1] & names[2]


@pytest.mark.parametrize("keys", [StreamKeys("team-a"), StreamKeys(cluster=True)],
                         ids=["tenant", "default-on-cluster"])
def test_the_keys_a_script_touches_together_share_one_cluster_slot(keys: StreamKeys) -> None:
    together = [keys.partition("orders", p) for p in range(8)] + [
        keys.dlq("orders"), keys.meta("orders"), keys.retry("orders", "g"),
        keys.members("orders", "g"),
        *(keys.lease("orders", "g", p) for p in range(8)),
        *(keys.frontier("orders", "g", p) for p in range(8))]
    assert len({key_slot(name.encode()) for name in together}) == 1


def test_a_big_tenant_is_not_forced_into_one_slot() -> None:
    keys = StreamKeys("team-a")
    slots = {key_slot(keys.partition(f"topic-{index}", 0).encode()) for index in range(32)}
    assert len(slots) > 16


def test_a_default_tenant_on_a_cluster_keeps_its_names_inside_a_tag() -> None:
    assert StreamKeys(cluster=True).partition("orders", 3) == "{orders}:stream:topic:orders:3"
    assert StreamKeys(cluster=True).topics() == "streaming:mq:topics"


@pytest.mark.parametrize("topic", ["a:b", "{x}", "", "-lead", "a b", "x" * 101])
def test_a_topic_name_cannot_forge_another_key_or_slot(topic: str) -> None:
    with pytest.raises(InvalidInput):
        StreamKeys("team-a").partition(topic, 0)


@pytest.mark.parametrize("options", [{"tenant": "Bad_Name"}, {"control_prefix": "tenant:x"},
                                     {"stream_prefix": "a{b}"}])
def test_bad_tenants_and_prefixes_are_refused(options: dict[str, str]) -> None:
    with pytest.raises(InvalidInput):
        StreamKeys(**options)  # type: ignore[arg-type]


def test_a_negative_partition_is_refused() -> None:
    with pytest.raises(InvalidInput):
        StreamKeys().partition("orders", -1)
