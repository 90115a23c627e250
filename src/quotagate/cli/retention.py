"""``quotagate prune``: delete finished requests and old audit entries past retention."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import click

from quotagate.cli.common import db_option, open_gate, reports_errors
from quotagate.domain.help_defaults import PRUNE_BATCH as DEFAULT_BATCH
from quotagate.errors import InvalidInput, quoted

if TYPE_CHECKING:
    from quotagate.store.retention import PruneProgress

_DURATION = re.compile(r"(?P<amount>[0-9]+(?:\.[0-9]+)?)(?P<unit>[smhdw]?)")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s`` or plain seconds, as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match["amount"]) <= 0:
        raise InvalidInput(
            f"duration {quoted(text)} is not a positive number with an optional unit "
            "s, m, h, d or w (e.g. 30d)",
            code="invalid_duration",
        )
    return float(match["amount"]) * _SECONDS[match["unit"]]


def describe(progress: PruneProgress) -> str:
    return (f"pruned {progress.requests} requests ({progress.external_objects} run directories) "
            f"and {progress.audit_entries} audit entries")


@click.command()
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Retention period: delete what finished before this long ago (30d, 12h, …).")
@click.option("--batch", default=DEFAULT_BATCH, show_default=True, type=click.IntRange(1, 10_000),
              help="Rows per transaction; each batch commits on its own.")
@click.option("--quiet", is_flag=True, help="Print only the final totals.")
@db_option
@reports_errors
def prune(older_than: str, batch: int, quiet: bool, db_url: str | None) -> None:
    """Delete finished requests (their outbox rows, bindings and run directories) and
    audit entries older than --older-than. Waiting and charged requests are never touched."""
    period = parse_duration(older_than)
    with open_gate(db_url) as gate:
        def report(progress: PruneProgress) -> None:
            if not quiet and not progress.done:
                click.echo(describe(progress), err=True)

        totals = gate.prune(period, batch=batch, progress=report)
    click.echo(describe(totals))


COMMANDS = [prune]
