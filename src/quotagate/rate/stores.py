"""The registry of rate stores, by URL scheme (the stores implement ``rate.backend.RateStore``).

``sqlite:///…``, ``postgresql://…``, ``mysql://…`` keep buckets in that SQL
database (the ledger's own, when it is the same URL, so a take commits with
the submission); ``redis://…``, ``rediss://…``, ``unix://…`` keep them in Redis.
redis itself is imported only when a redis URL is used.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import ArgumentError

from quotagate.domain import help_defaults
from quotagate.errors import InvalidInput, quoted
from quotagate.plugins import Plugins
from quotagate.rate.backend import RateStore

__all__ = ["ENVIRONMENT_VARIABLE", "RATE_STORES", "StoreFactory", "rate_store_from_url", "register"]

ENVIRONMENT_VARIABLE = help_defaults.RATE_STORE_VARIABLE  # kept in domain.help_defaults: the CLI's help shows it


# ``factory(url, ledger_engine)``: the store at ``url``.
StoreFactory = Callable[[str, Engine | None], RateStore]

_REDIS = "quotagate.rate.redis:open_redis_store"
_SQL = "quotagate.rate.sql:open_sql_store"
RATE_STORES: Plugins[StoreFactory] = Plugins({
    "redis": _REDIS, "rediss": _REDIS, "unix": _REDIS, "redis+cluster": _REDIS,
    "sqlite": _SQL, "postgresql": _SQL, "postgres": _SQL, "mysql": _SQL, "mariadb": _SQL,
})


def register(*schemes: str) -> Callable[[StoreFactory], StoreFactory]:
    """Map URL schemes to a store factory (``factory(url, ledger_engine)``)."""

    def decorator(factory: StoreFactory) -> StoreFactory:
        for scheme in schemes:
            RATE_STORES.register(scheme, factory)
        return factory

    return decorator


def rate_store_from_url(url: str | None, ledger_engine: Engine | None = None) -> RateStore:
    """The store named by ``url``; without one, the ledger database itself."""
    if not url:
        if ledger_engine is None:
            raise InvalidInput("a rate store URL is needed without a ledger database",
                               code="invalid_rate_store_url")
        url = ledger_engine.url.render_as_string(hide_password=False)
    try:
        scheme = make_url(url).drivername.partition("+")[0]
    except ArgumentError:
        scheme = url.partition("://")[0] if "://" in url else ""
    factory = RATE_STORES.get(scheme)
    if factory is None:
        raise InvalidInput(
            f"rate store URL scheme {quoted(scheme or url)} is not supported; use one of "
            f"{', '.join(RATE_STORES.names())}",
            code="invalid_rate_store_url",
        )
    return factory(url, ledger_engine)
