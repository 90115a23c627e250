"""Tenant-isolated Redis Streams (docs/streams.md): keys, topics, producers, fenced consumers."""

from quotagate.store.stream_settings import StreamSettings
from quotagate.streams.consumer import Consumer, Entry, SettleResult
from quotagate.streams.keys import DEFAULT_TENANT, StreamKeys
from quotagate.streams.leases import PartitionLeases, PartitionRef
from quotagate.streams.producer import Producer, TopicHandle, partition_for
from quotagate.streams.service import Streams
from quotagate.streams.status import TopicStatus
from quotagate.streams.topics import Topics, TopicSpec

__all__ = [
    "DEFAULT_TENANT",
    "Consumer",
    "Entry",
    "PartitionLeases",
    "PartitionRef",
    "Producer",
    "SettleResult",
    "StreamKeys",
    "StreamSettings",
    "Streams",
    "TopicHandle",
    "TopicSpec",
    "TopicStatus",
    "Topics",
    "partition_for",
]
