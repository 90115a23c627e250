"""``quotagate rate show|add|set``: a tenant's rate quota (its token bucket), and what ``tenant set/show`` share."""

from __future__ import annotations

from typing import Any

import click

from quotagate.cli.common import db_option, echo_json, open_gate, reports_errors
from quotagate.domain.bucket import parse_rate
from quotagate.domain.help_defaults import RATE_STORE_VARIABLE as ENVIRONMENT_VARIABLE
from quotagate.domain.rate_refusal import format_tokens

rate_store_option = click.option(
    "--rate-store",
    "rate_store",
    envvar=ENVIRONMENT_VARIABLE,
    default=None,
    metavar="URL",
    help="Where token buckets live: redis://HOST:PORT/DB, or a database URL. "
    f"Default: the ledger database. Also ${ENVIRONMENT_VARIABLE}.",
)


def describe_rate(status: dict[str, Any] | None, topic: str | None = None) -> str:
    """One line: ``rate: 2 of 5 tokens left, refill 0/s (store …)``; a topic's bucket names it."""
    # A topic's line looked exactly like the tenant's own bucket's.
    label = "rate" if topic is None else f"rate of topic {topic}"
    if status is None:
        return f"{label}: no rate quota (submissions are not rate limited)"
    refill = status["refill_per_second"]
    refill_text = "no refill: top up with 'quotagate rate add'" if refill == 0 else (
        f"refill {refill:g}/s")
    return (f"{label}: {format_tokens(status['tokens'])} of {status['capacity']} tokens left, "
            f"{refill_text} (store {status['store']})")


@click.group()
def rate() -> None:
    """A tenant's rate quota: a token bucket each submission takes from."""


@rate.command("add")
@click.argument("tenant")
@click.argument("amount", type=int)
@click.option("--topic", default=None, help="The tenant's bucket for one topic.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@rate_store_option
@reports_errors
def rate_add(
    tenant: str, amount: int, topic: str | None, as_json: bool, db_url: str | None,
    rate_store: str | None,
) -> None:
    """Top up TENANT's bucket by AMOUNT tokens (never above its capacity)."""
    with open_gate(db_url, rate_store=rate_store) as gate:
        status = gate.add_tokens(tenant, amount, topic=topic, actor="cli")
    if as_json:
        echo_json(status)
    else:
        # A top-up stops at the capacity: "added 3" to a full bucket would be untrue.
        if status["tokens"] >= status["capacity"]:
            click.echo(f"tenant {tenant}: added up to {amount}; the bucket is full "
                       f"(its capacity is {status['capacity']})")
        else:
            click.echo(f"tenant {tenant}: added {amount}")
        click.echo(describe_rate(status, topic))


@rate.command("show")
@click.argument("tenant")
@click.option("--topic", default=None, help="The tenant's bucket for one topic.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@rate_store_option
@reports_errors
def rate_show(
    tenant: str, topic: str | None, as_json: bool, db_url: str | None, rate_store: str | None
) -> None:
    """Show TENANT's bucket: capacity, refill and tokens left."""
    with open_gate(db_url, rate_store=rate_store) as gate:
        status = gate.rate_status(tenant, topic=topic)
    if as_json:
        echo_json(status)
    else:
        click.echo(describe_rate(status, topic))


@rate.command("set")
@click.argument("tenant")
@click.argument("spec", metavar="capacity=N,refill=R|none")
@click.option("--topic", default=None, help="The tenant's bucket for one topic.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@rate_store_option
@reports_errors
def rate_set(
    tenant: str, spec: str, topic: str | None, as_json: bool, db_url: str | None,
    rate_store: str | None,
) -> None:
    """Give TENANT a bucket of N tokens gaining R per second, reshape it, or remove it ('none')."""
    bucket = parse_rate(spec)  # parsed before anything is opened: a bad spec changes nothing
    with open_gate(db_url, rate_store=rate_store) as gate:
        status = gate.set_rate(tenant, bucket, topic=topic, actor="cli")
    if as_json:
        echo_json(status)
    else:
        click.echo(describe_rate(status, topic))


COMMANDS = [rate]
