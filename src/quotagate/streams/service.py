"""The stream layer's door: topics, producers, consumers and status for any tenant.

One ``Streams`` per :class:`~quotagate.app.Quotagate`. It resolves, per
tenant, which Redis holds its streams (the tenant's own, set with
``quotagate tenant set T --redis URL``, or the shared one) and the tenant's
``StreamKeys``; the ledger database stays the one control plane that sees
every tenant, wherever its streams live.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy.engine import Engine

from quotagate.domain.bucket import BucketConfig
from quotagate.domain.clock import Clock, SystemClock
from quotagate.errors import QuotagateError, StoreUnavailable, quoted
from quotagate.rate.quotas import RateQuotas
from quotagate.store.stream_settings import StreamSettings
from quotagate.streams.connection import DEFAULT_URL, StreamRedis
from quotagate.streams.consumer import Consumer
from quotagate.streams.keys import StreamKeys
from quotagate.streams.producer import Producer, TopicHandle
from quotagate.streams.status import TopicStatus, topic_status
from quotagate.streams.topics import Topics, TopicSpec

log = logging.getLogger("quotagate.streams")


class Streams:
    def __init__(
        self, engine: Engine, rates: RateQuotas, *, redis_url: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.redis_url = redis_url or DEFAULT_URL
        self.rates = rates
        self.topics = Topics(engine, rates, clock=clock or SystemClock())
        self._connections: dict[str, StreamRedis] = {}
        self._producers: dict[tuple[str, str], Producer] = {}
        self._lock = threading.Lock()

    # -- where a tenant's streams live ---------------------------------------------------

    def connection(self, url: str | None = None) -> StreamRedis:
        url = url or self.redis_url
        with self._lock:
            connection = self._connections.get(url)
            if connection is None:
                connection = self._connections[url] = StreamRedis.from_url(url)
            return connection

    def locate(
        self, tenant: str, settings: StreamSettings | None = None
    ) -> tuple[StreamRedis, StreamKeys]:
        """The Redis that holds the tenant's streams, and the tenant's key names."""
        settings = settings or self.topics.settings(tenant)
        connection = self.connection(settings.redis_url)
        return connection, StreamKeys(tenant, cluster=connection.cluster)

    def handle(self, tenant: str, topic: str) -> TopicHandle:
        """Everything a producer or consumer needs, read from the ledger now."""
        spec = self.topics.get(tenant, topic)
        settings = self.topics.settings(tenant)
        connection, keys = self.locate(tenant, settings)
        return TopicHandle(spec, self.topics.rate_config(tenant, topic), connection, keys,
                           settings.max_in_flight)

    # -- topics ---------------------------------------------------------------------

    def create_topic(
        self, tenant: str, topic: str, *, partitions: int, parallelism: int,
        max_len: int | None = None, rate: BucketConfig | None = None, actor: str = "admin",
    ) -> TopicSpec:
        def write_meta(spec: TopicSpec) -> None:
            connection, keys = self.locate(tenant)
            # Streams of an earlier topic of this name whose keys a failed delete left
            # behind are no part of this one: its partitions start empty.
            self._drop_keys(connection, keys, spec)
            with connection.errors():
                connection.client.hset(keys.meta(topic), mapping={
                    "partitions": spec.partitions, "parallelism": spec.parallelism,
                    "max_len": "" if spec.max_len is None else spec.max_len,
                    "created": repr(spec.created)})
                connection.client.sadd(keys.topics(), topic)

        return self.topics.create(
            tenant, topic, partitions=partitions, parallelism=parallelism, max_len=max_len,
            rate=rate, actor=actor, on_created=write_meta)

    def delete_topic(self, tenant: str, topic: str, *, actor: str = "admin") -> TopicSpec:
        """Delete in the ledger (the authority, quota returned once), then the Redis keys.

        An unreachable Redis is refused before the ledger changes; should it fail between
        the two steps, the keys left behind are dropped when the name is created again.
        """
        connection, keys = self.locate(tenant)
        with connection.errors():
            connection.client.ping()
        spec = self.topics.delete(tenant, topic, actor=actor)
        with self._lock:
            self._producers.pop((tenant, topic), None)
        try:
            self._drop_keys(connection, keys, spec)
        except QuotagateError as error:
            log.warning("topic %s/%s is deleted, but its Redis keys could not all be removed "
                        "(they go when the topic is created again): %s", tenant, topic,
                        error.message)
        return spec

    @staticmethod
    def _drop_keys(connection: StreamRedis, keys: StreamKeys, spec: TopicSpec) -> None:
        topic = spec.name
        streams = [keys.partition(topic, partition) for partition in range(spec.partitions)]
        groups: set[str] = set()
        with connection.errors():
            # One round trip for every partition's groups (a missing stream answers an error).
            pipeline = connection.client.pipeline(transaction=False)
            for stream in streams:
                pipeline.xinfo_groups(stream)
            for reply in pipeline.execute(raise_on_error=False):
                if not isinstance(reply, Exception):
                    groups |= {_text(group["name"]) for group in reply}
            names = [*streams, keys.dlq(topic), keys.meta(topic)]
            for group in sorted(groups):
                names += [keys.retry(topic, group), keys.members(topic, group)]
                names += [keys.frontier(topic, group, p) for p in range(spec.partitions)]
            # One key per call: on a cluster a multi-key DEL must stay in one slot.
            pipeline = connection.client.pipeline(transaction=False)
            for name in names:
                pipeline.delete(name)
            pipeline.srem(keys.topics(), topic)
            pipeline.execute()
        # The leases go too, each keeping its generation in the topic's one lease floor,
        # atomically: a topic created again under the same name starts its leases above
        # every generation a consumer of this one may still hold (docs/decisions/412).
        floor = keys.lease_floor(topic)
        for reply in connection.run_many([
            ("RETIRE", [keys.lease(topic, group, partition), floor], [])
            for group in sorted(groups) for partition in range(spec.partitions)
        ]):
            if isinstance(reply, Exception):
                raise StoreUnavailable(f"the stream Redis refused to remove a lease of topic "
                                       f"{quoted(topic)}: {reply}", code="stream_store_unavailable")

    # -- producing and consuming ----------------------------------------------------------

    def producer(self, tenant: str, topic: str, **options: Any) -> Producer:
        self.topics.get(tenant, topic)  # unknown topic: refused now, not at the first send
        return Producer(lambda: self.handle(tenant, topic), self.rates.store, **options)

    def shared_producer(self, tenant: str, topic: str) -> Producer:
        """One producer per topic for a long-lived process (the HTTP API): its cached spec
        is read again after a second, so a deleted topic stops taking messages."""
        key = (tenant, topic)
        with self._lock:
            producer = self._producers.get(key)
        if producer is None:
            producer = self.producer(tenant, topic)
            with self._lock:
                producer = self._producers.setdefault(key, producer)
        return producer

    def consumer(self, tenant: str, topic: str, group: str, name: str, **options: Any) -> Consumer:
        return Consumer(lambda: self.handle(tenant, topic), group, name, **options)

    def status(self, tenant: str, topic: str) -> TopicStatus:
        return topic_status(self.handle(tenant, topic))

    def topic(self, tenant: str, name: str) -> TopicSpec:
        """One topic of ``tenant``; NotFound if it has none of that name."""
        return self.topics.get(tenant, name)

    def list_topics(self, tenant: str | None = None) -> list[TopicSpec]:
        """The topics of ``tenant`` (None: every tenant's)."""
        return self.topics.specs(tenant)

    def settings(self, tenant: str) -> StreamSettings:
        """A tenant's stream settings: max length, in-flight limit, its own Redis."""
        return self.topics.settings(tenant)

    def check_settings(self, tenant: str, **changes: Any) -> None:
        """Raise what :meth:`set_settings` would refuse now; write nothing."""
        self.topics.check_settings(tenant, **changes)

    def set_settings(self, tenant: str, *, actor: str = "admin", **changes: Any) -> StreamSettings:
        """Change the settings given (None clears one); the others stay as they are."""
        return self.topics.set_settings(tenant, actor=actor, **changes)

    def close(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
