"""A tenant's stream settings on ``quotagate tenant set/show`` (docs/streams.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from quotagate.errors import InvalidInput, quoted

if TYPE_CHECKING:
    from quotagate.store.stream_settings import StreamSettings


def stream_settings_options(function: Callable[..., Any]) -> Callable[..., Any]:
    for option in (
        click.option("--stream-max-len", default=None, metavar="N|none",
                     help="Cap on every topic's max length ('none' removes it)."),
        click.option("--stream-max-in-flight", default=None, metavar="N|none",
                     help="Cap on unacked entries across all the tenant's consumers."),
        click.option("--redis", "tenant_redis", default=None, metavar="URL|none",
                     help="A Redis of the tenant's own for its streams ('none': the shared one)."),
    ):
        function = option(function)
    return function


def _count(value: str, what: str) -> int | None:
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidInput(f"{what} must be a whole number or 'none', got {quoted(value)}",
                           code="invalid_stream_setting") from None


def parse_stream_settings(
    stream_max_len: str | None, stream_max_in_flight: str | None, tenant_redis: str | None
) -> dict[str, Any]:
    """The settings named on the command line (absent ones are left as they are)."""
    settings: dict[str, Any] = {}
    if stream_max_len is not None:
        settings["max_len"] = _count(stream_max_len, "--stream-max-len")
    if stream_max_in_flight is not None:
        settings["max_in_flight"] = _count(stream_max_in_flight, "--stream-max-in-flight")
    if tenant_redis is not None:
        settings["redis_url"] = None if tenant_redis.lower() == "none" else tenant_redis
    if not settings:
        return settings  # no stream setting named: the streams package is not imported
    # Imported here: `tenant list`/`show` and a `tenant set` of quotas only use no stream.
    from quotagate.streams.topics import stream_setting_changes

    # Checked now, before 'tenant set' changes the quotas: a bad value changes nothing.
    return stream_setting_changes(**settings)


def describe_stream_settings(settings: StreamSettings) -> str:
    from quotagate.store.engine import redact  # loaded already: the settings came from the gate

    redis = redact(settings.redis_url) if settings.redis_url else "the shared one"
    return (f"streams: max length {settings.max_len or 'unlimited'}, in flight "
            f"{settings.max_in_flight or 'unlimited'}, Redis {redis}")
