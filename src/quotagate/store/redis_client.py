"""redis-py clients built one way for everything that talks to Redis (rate store, streams).

``redis://``, ``rediss://`` and ``unix://`` name one server;
``redis+cluster://host:port`` a Redis Cluster.

Every client gets explicit, short timeouts (docs/decisions/109-redis-timeouts.md):
redis-py's own defaults are no read timeout at all and three retries with
exponential backoff, so a Redis that accepts connections and never answers
held its caller for as long as the operating system allowed. Here a connect
gives up after :data:`DEFAULT_CONNECT_TIMEOUT` and a reply after
:data:`DEFAULT_TIMEOUT` seconds; a timeout is never retried (a script that
timed out may have run), a connection found broken is retried once on a new
connection (a server that restarted since the connection was pooled).
Both are set per URL with redis-py's own query parameters:
``redis://host:6379/0?socket_timeout=0.5&socket_connect_timeout=0.2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quotagate.errors import InvalidInput, StoreUnavailable
from quotagate.store.engine import redact

DEFAULT_CONNECT_TIMEOUT = 1.0  # seconds
DEFAULT_TIMEOUT = 2.0  # seconds, for one reply
CLUSTER_SCHEME = "redis+cluster://"


def import_redis(needed_by: str) -> Any:
    """redis-py, or a clear error naming the extra to install."""
    try:
        import redis
    except ModuleNotFoundError as exc:
        raise InvalidInput(f"{needed_by} needs the redis package: pip install 'quotagate[redis]'",
                           code="driver_missing") from exc
    return redis


@dataclass(frozen=True)
class RedisClient:
    """A redis-py client (``redis.Redis`` or ``redis.RedisCluster``) and what it points at."""

    client: Any
    cluster: bool
    description: str  # the URL without its password, safe to print


def redis_client(
    url: str, *, needed_by: str, invalid_code: str, unavailable_code: str
) -> RedisClient:
    """The client for ``url``, with the timeouts and retry policy above.

    A URL redis-py cannot read is :class:`InvalidInput` with ``invalid_code``.
    A single server is connected at the first command; a cluster client asks
    for the slot map at once, and an unreachable cluster is
    :class:`StoreUnavailable` with ``unavailable_code``.
    """
    redis = import_redis(needed_by)
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT,
        "socket_timeout": DEFAULT_TIMEOUT,
    }
    cluster = url.startswith(CLUSTER_SCHEME)
    _check_database_number(url, invalid_code)
    try:
        if cluster:
            # The cluster client retries moved slots itself; a timeout still is not retried.
            client = redis.RedisCluster.from_url(
                "redis://" + url.removeprefix(CLUSTER_SCHEME),
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
                **options,
            )
        else:
            # URL query parameters (socket_timeout=…) override these defaults.
            client = redis.Redis.from_url(
                url,
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
                **options,
            )
    except ValueError as exc:
        raise InvalidInput(f"not a Redis URL ({redact(url)}): {exc}", code=invalid_code) from exc
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # RedisClusterException ("cannot be connected", "cluster mode is not enabled")
        # is no RedisError: without it here an unreachable cluster was a traceback.
        raise StoreUnavailable(f"{needed_by}: the Redis {redact(url)} cannot be reached ({exc})",
                               code=unavailable_code) from exc
    return RedisClient(client, cluster, redact(url))


def _check_database_number(url: str, invalid_code: str) -> None:
    """Refuse ``redis://host/x``: redis-py silently reads a path it cannot parse as database 0."""
    scheme, _, rest = url.partition("://")
    if scheme == "unix":  # the path is the socket's; the database is ?db=N
        return
    path = rest.partition("?")[0].partition("#")[0].partition("/")[2]
    if path and not path.isdigit():
        raise InvalidInput(
            f"not a Redis URL ({redact(url)}): the database after the host must be a number, "
            f"as in redis://HOST:PORT/0, got {path!r}", code=invalid_code)
