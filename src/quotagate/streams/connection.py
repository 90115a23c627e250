"""One Redis (or Redis Cluster) the stream layer talks to, and its errors mapped once.

``redis://``, ``rediss://`` and ``unix://`` name a single server;
``redis+cluster://host:port`` a Redis Cluster (as for the Redis rate store; both are
built by :func:`quotagate.store.redis_client.redis_client`, with its timeouts).
Driver errors become quotagate errors here: an unreachable server is
:class:`StoreUnavailable`, a fenced script's ``STALE`` reply is
:class:`StaleGeneration`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from quotagate.domain import help_defaults
from quotagate.errors import StaleGeneration, StoreUnavailable
from quotagate.store.redis_client import import_redis, redis_client
from quotagate.streams import scripts

# Kept in domain.help_defaults: the CLI's help shows them.
ENVIRONMENT_VARIABLE = help_defaults.REDIS_VARIABLE
DEFAULT_URL = help_defaults.DEFAULT_REDIS_URL


class StreamRedis:
    """A client plus the registered scripts; safe to share between threads."""

    def __init__(self, client: Any, *, description: str, cluster: bool) -> None:
        self.client = client
        self.cluster = cluster
        self.description = description
        self._redis = import_redis("streams")
        self.scripts = {name: client.register_script(getattr(scripts, name)) for name in (
            "ACQUIRE", "RETIRE", "RENEW", "RELEASE", "READ", "SETTLE", "CLAIM", "MEMBERS",
            "IN_FLIGHT", "PRODUCE")}

    @classmethod
    def from_url(cls, url: str) -> StreamRedis:
        """The client for ``url``, with quotagate's Redis timeouts (quotagate.store.redis_client)."""
        built = redis_client(url, needed_by="streams", invalid_code="invalid_redis_url",
                             unavailable_code="stream_store_unavailable")
        return cls(built.client, description=built.description, cluster=built.cluster)

    def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call one script; STALE → StaleGeneration, unreachable → StoreUnavailable."""
        with self.errors():
            return self.scripts[script](keys=list(keys), args=list(args))

    def run_many(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Several script calls in one round trip; each reply, or the error it raised.

        redis-py refuses scripts in a cluster pipeline: there, one call after another
        (and a single call needs no pipeline anywhere).
        """
        with self.errors():
            if not self.cluster and len(calls) > 1:
                pipeline = self.client.pipeline(transaction=False)
                for script, keys, args in calls:
                    self.scripts[script](keys=list(keys), args=list(args), client=pipeline)
                return list(pipeline.execute(raise_on_error=False))
            replies: list[Any] = []
            for script, keys, args in calls:
                try:
                    replies.append(self.scripts[script](keys=list(keys), args=list(args)))
                except self._redis.exceptions.ResponseError as error:
                    replies.append(error)
            return replies

    def same_server(self, client: Any) -> bool:
        """Is ``client`` (another redis-py client) talking to this very Redis and database?"""
        if self.cluster or not hasattr(client, "connection_pool"):
            return False
        mine = self.client.connection_pool.connection_kwargs
        theirs = client.connection_pool.connection_kwargs
        return all(mine.get(name) == theirs.get(name) for name in ("host", "port", "db", "path"))

    def errors(self) -> _Translate:
        return _Translate(self)

    def close(self) -> None:
        self.client.close()


class _Translate:
    """``with connection.errors(): …`` maps driver errors to quotagate errors."""

    def __init__(self, connection: StreamRedis) -> None:
        self.connection = connection

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, _traceback: Any) -> Literal[False]:
        if error is None:
            return False
        exceptions = self.connection._redis.exceptions
        if isinstance(error, exceptions.ResponseError) and str(error).startswith("STALE"):
            raise StaleGeneration(
                f"refused: {str(error).removeprefix('STALE ')}; a newer lease generation owns "
                "the partition", code="stale_generation") from error
        if isinstance(error, exceptions.ConnectionError | exceptions.TimeoutError):
            raise StoreUnavailable(
                f"the stream Redis {self.connection.description} cannot be reached",
                code="stream_store_unavailable") from error
        if isinstance(error, exceptions.ResponseError):
            # An error reply (a database index the server lacks, WRONGTYPE, READONLY, OOM)
            # is the stream Redis refusing, as the rate store reports it, not a traceback.
            raise StoreUnavailable(
                f"the stream Redis {self.connection.description} refused the operation: {error}",
                code="stream_store_unavailable") from error
        return False
