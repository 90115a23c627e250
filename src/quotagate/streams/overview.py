"""The dashboard's Streams view: every topic in scope with its length, pending, lag and DLQ.

The topics and each tenant's stream Redis come from the ledger (two queries);
Redis is then read with one pipeline per stream Redis — ``XLEN`` and
``XINFO GROUPS`` per partition, ``XLEN`` of each DLQ — and, only when groups
exist, a second one for the partition leases' owner and generation. A Redis
that cannot be reached (or a missing driver) leaves its topics' numbers empty
and the view says why; it never fails the dashboard. See docs/dashboard.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from quotagate.errors import QuotagateError
from quotagate.streams import metrics
from quotagate.streams.keys import StreamKeys
from quotagate.streams.topics import TopicSpec

if TYPE_CHECKING:
    from quotagate.streams.connection import StreamRedis
    from quotagate.streams.service import Streams

# At most this many topics per poll, so that a poll's cost does not grow with the tenants.
MAX_TOPICS = 50


@dataclass(frozen=True)
class PartitionOwner:
    partition: int
    owner: str | None
    generation: int


@dataclass(frozen=True)
class GroupRow:
    group: str
    pending: int
    lag: int | None
    partitions: list[PartitionOwner] = field(default_factory=list)


@dataclass(frozen=True)
class TopicRow:
    tenant: str
    topic: str
    partitions: int
    parallelism: int
    max_len: int | None
    # None: the topic's Redis did not answer (see StreamsView.error).
    length: int | None = None
    pending: int | None = None
    lag: int | None = None
    dlq: int | None = None
    groups: list[GroupRow] = field(default_factory=list)


@dataclass(frozen=True)
class StreamsView:
    topics: list[TopicRow]
    total: int
    error: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def streams_overview(streams: Streams, tenant: str | None = None) -> StreamsView:
    """The Streams view of ``tenant`` (None: every tenant), at most ``MAX_TOPICS`` topics."""
    specs = streams.topics.specs(tenant)
    shown = specs[:MAX_TOPICS]
    if not shown:
        return StreamsView([], 0)  # no topic: Redis is not touched at all
    redis_of = {settings.tenant: settings.redis_url for settings in streams.topics.all_settings()}
    by_url: dict[str | None, list[TopicSpec]] = {}
    for spec in shown:
        by_url.setdefault(redis_of.get(spec.tenant), []).append(spec)
    rows: dict[tuple[str, str], TopicRow] = {}
    error: dict[str, str] | None = None
    for url, group_specs in by_url.items():
        try:
            connection = streams.connection(url)
            rows.update(_read(connection, group_specs))
        except QuotagateError as failure:
            error = error or {"code": failure.code, "message": failure.message}
    topics = [rows.get((spec.tenant, spec.name)) or TopicRow(
        spec.tenant, spec.name, spec.partitions, spec.parallelism, spec.max_len)
        for spec in shown]
    return StreamsView(topics, len(specs), error)


def _read(connection: StreamRedis, specs: list[TopicSpec]) -> dict[tuple[str, str], TopicRow]:
    keys = {spec.tenant: StreamKeys(spec.tenant, cluster=connection.cluster) for spec in specs}
    with connection.errors():
        pipeline = connection.client.pipeline(transaction=False)
        for spec in specs:
            for partition in range(spec.partitions):
                stream = keys[spec.tenant].partition(spec.name, partition)
                pipeline.xlen(stream)  # the length alone: a small reply, unlike XINFO STREAM
                pipeline.xinfo_groups(stream)
            pipeline.xlen(keys[spec.tenant].dlq(spec.name))
        replies = iter(pipeline.execute(raise_on_error=False))
        read: list[tuple[TopicSpec, list[tuple[Any, Any]], Any]] = []
        for spec in specs:
            infos = [(next(replies), next(replies)) for _ in range(spec.partitions)]
            read.append((spec, infos, next(replies)))
        leases = connection.client.pipeline(transaction=False)
        wanted: list[tuple[str, str, str, int]] = []
        for spec, infos, _dlq in read:
            for partition, (_info, groups) in enumerate(infos):
                if isinstance(groups, Exception):
                    continue  # no such stream yet: nothing produced, no group
                for group in groups:
                    name = _text(group["name"])
                    wanted.append((spec.tenant, spec.name, name, partition))
                    leases.hmget(keys[spec.tenant].lease(spec.name, name, partition),
                                 "owner", "generation")
        owners = dict(zip(wanted, leases.execute(), strict=True)) if wanted else {}
    return {(spec.tenant, spec.name): _row(spec, infos, dlq, owners) for spec, infos, dlq in read}


def _row(spec: TopicSpec, infos: list[tuple[Any, Any]], dlq: Any,
         owners: dict[tuple[str, str, str, int], Any]) -> TopicRow:
    length = 0
    groups: dict[str, GroupRow] = {}
    unknown_lag: set[str] = set()
    for partition, (partition_length, partition_groups) in enumerate(infos):
        length += partition_length if isinstance(partition_length, int) else 0
        if isinstance(partition_groups, Exception):
            continue  # nothing produced to this partition yet: no stream, no group
        for group in partition_groups:
            name = _text(group["name"])
            row = groups.setdefault(name, GroupRow(name, 0, 0))
            # Redis answers no lag when it cannot tell (entries deleted past the group).
            lag = group.get("lag")
            if lag is None:
                unknown_lag.add(name)
            owner, generation = owners.get((spec.tenant, spec.name, name, partition), (None, 0))
            row.partitions.append(PartitionOwner(
                partition, _text(owner) if owner else None, int(generation or 0)))
            groups[name] = GroupRow(name, row.pending + int(group["pending"]),
                                    (row.lag or 0) + int(lag or 0), row.partitions)
    group_rows = [GroupRow(row.group, row.pending, None if row.group in unknown_lag else row.lag,
                           row.partitions) for _, row in sorted(groups.items())]
    for row in group_rows:
        if row.lag is not None:
            metrics.set_gauge("lag", spec.tenant, spec.name, row.group, row.lag)
    lags = [row.lag for row in group_rows]
    return TopicRow(
        spec.tenant, spec.name, spec.partitions, spec.parallelism, spec.max_len,
        length=length, pending=sum(row.pending for row in group_rows),
        # The topic's lag is its most behind group's: what the slowest consumer still has to read.
        # No group yet: nobody is behind; an unknown group lag makes the topic's unknown.
        lag=None if not group_rows or None in lags else max(lag or 0 for lag in lags),
        dlq=dlq if isinstance(dlq, int) else 0, groups=group_rows)
