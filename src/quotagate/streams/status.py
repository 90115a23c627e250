"""What ``quotagate stream status`` shows: per partition and group, read from Redis.

Length and trimmed entries (``XINFO STREAM``: entries added minus length),
pending and lag per group (``XINFO GROUPS``), the commit frontier, and the
partition lease's owner and generation; and the DLQ's length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from quotagate.streams import metrics
from quotagate.streams.producer import TopicHandle


@dataclass(frozen=True)
class GroupStatus:
    group: str
    pending: int
    lag: int | None
    last_delivered: str
    frontier: str | None
    owner: str | None
    generation: int


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    length: int
    trimmed: int
    groups: list[GroupStatus] = field(default_factory=list)


@dataclass(frozen=True)
class TopicStatus:
    tenant: str
    topic: str
    partitions: list[PartitionStatus]
    dlq_length: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def topic_status(handle: TopicHandle) -> TopicStatus:
    spec, keys, redis = handle.spec, handle.keys, handle.redis
    streams = [keys.partition(spec.name, partition) for partition in range(spec.partitions)]
    with redis.errors():
        pipeline = redis.client.pipeline(transaction=False)
        for stream in streams:
            pipeline.xinfo_stream(stream)
            pipeline.xinfo_groups(stream)
        pipeline.xlen(keys.dlq(spec.name))
        replies = pipeline.execute(raise_on_error=False)
        infos = list(zip(replies[0:-1:2], replies[1:-1:2], strict=True))
        dlq_length = replies[-1] if isinstance(replies[-1], int) else 0
        details = redis.client.pipeline(transaction=False)
        wanted: list[tuple[int, str]] = []
        for partition, (_info, groups) in enumerate(infos):
            if isinstance(groups, Exception):
                continue  # no such stream yet: nothing produced, no group
            for group in groups:
                name = _text(group["name"])
                wanted.append((partition, name))
                details.get(keys.frontier(spec.name, name, partition))
                details.hmget(keys.lease(spec.name, name, partition), "owner", "generation")
        values = details.execute() if wanted else []
    per_group: dict[tuple[int, str], tuple[Any, Any]] = {
        item: (values[2 * index], values[2 * index + 1]) for index, item in enumerate(wanted)}
    partitions: list[PartitionStatus] = []
    trimmed_total = 0
    for partition, (info, groups) in enumerate(infos):
        if isinstance(info, Exception):
            partitions.append(PartitionStatus(partition, 0, 0))
            continue
        length = int(info["length"])
        trimmed = max(0, int(info.get("entries-added", length)) - length)
        trimmed_total += trimmed
        group_rows = []
        for group in groups:
            name = _text(group["name"])
            frontier, (owner, generation) = per_group[(partition, name)]
            group_rows.append(GroupStatus(
                group=name, pending=int(group["pending"]),
                lag=None if group.get("lag") is None else int(group["lag"]),
                last_delivered=_text(group["last-delivered-id"]),
                frontier=None if frontier is None else _text(frontier),
                owner=_text(owner) if owner else None,
                generation=int(generation or 0)))
        partitions.append(PartitionStatus(partition, length, trimmed, group_rows))
    metrics.set_gauge("trimmed", spec.tenant, spec.name, "", trimmed_total)
    lags: dict[str, int] = {}
    for row in partitions:
        for group_row in row.groups:
            lags[group_row.group] = lags.get(group_row.group, 0) + (group_row.lag or 0)
    for group_name, lag in lags.items():
        metrics.set_gauge("lag", spec.tenant, spec.name, group_name, lag)
    return TopicStatus(spec.tenant, spec.name, partitions, int(dlq_length))
