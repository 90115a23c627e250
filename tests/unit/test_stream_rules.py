"""Pure rules of the stream layer: partitioning, topic specs, the public names."""

from __future__ import annotations

import zlib

import pytest

import quotagate.streams
from quotagate.errors import InvalidInput
from quotagate.streams.producer import partition_for
from quotagate.streams.topics import TopicSpec


def test_a_key_always_lands_on_the_same_partition_in_every_process() -> None:
    # CRC-32, not the salted hash(): the value is fixed, whatever PYTHONHASHSEED says.
    assert partition_for("user-7", 8) == zlib.crc32(b"user-7") % 8 == 1
    assert {partition_for(f"user-{index}", 4) for index in range(100)} == {0, 1, 2, 3}


def test_a_topic_costs_its_partitions_and_parallelism() -> None:
    assert TopicSpec("team-a", "orders", 4, 2).cost == {"partitions": 4, "parallelism": 2}


@pytest.mark.parametrize(("partitions", "parallelism", "max_len", "code"), [
    (0, 1, None, "invalid_partitions"), (1025, 1, None, "invalid_partitions"),
    (1, 0, None, "invalid_parallelism"), (True, 1, None, "invalid_partitions"),
    (1, 1, 0, "invalid_max_length"),
])
def test_bad_topic_specs_say_what_is_wrong(
    partitions: int, parallelism: int, max_len: int | None, code: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        TopicSpec("team-a", "orders", partitions, parallelism, max_len)
    assert refused.value.code == code


def test_the_stream_package_exports_what_we_mean() -> None:
    assert set(quotagate.streams.__all__) == {
        "DEFAULT_TENANT", "Consumer", "Entry", "PartitionLeases", "PartitionRef", "Producer",
        "SettleResult", "StreamKeys", "StreamSettings", "Streams", "TopicHandle", "TopicSpec",
        "TopicStatus", "Topics", "partition_for",
    }
    for name in quotagate.streams.__all__:
        assert getattr(quotagate.streams, name) is not None
