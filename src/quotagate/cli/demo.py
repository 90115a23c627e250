"""``quotagate demo``."""

from __future__ import annotations

import sys

import click

from quotagate.cli.common import open_gate, reports_errors
from quotagate.cli.ledger import print_usage


@click.command()
@click.option("--db", "db_url", default=None,
              help="Database URL (default: a fresh ./quotagate-demo.db).")
@click.option("--clients", default=4, show_default=True, type=click.IntRange(1, 32))
@click.option("--requests", "requests_per_client", default=50, show_default=True,
              type=click.IntRange(1, 10000), help="Requests per client.")
@click.option("--admitters", default=3, show_default=True, type=click.IntRange(1, 32))
@reports_errors
def demo(db_url: str | None, clients: int, requests_per_client: int, admitters: int) -> None:
    """Concurrent clients and admission workers on SQLite, then an invariant check."""
    # Imported here: the demo brings multiprocessing, which no other command needs at startup.
    from quotagate.demo import DemoSettings, default_demo_url, run_demo

    url = db_url or default_demo_url()
    settings = DemoSettings(url=url, clients=clients, requests_per_client=requests_per_client,
                            admitters=admitters)
    violations = run_demo(settings, click.echo)
    with open_gate(url) as gate:
        click.echo("")
        print_usage(gate.usage())
    click.echo("")
    if violations:
        for violation in violations:
            click.echo(f"INVARIANT VIOLATED: {violation}", err=True)
        sys.exit(1)
    click.echo("ledger check passed (docs/invariants.md, 1-2): used = sum of reserved costs "
               "<= cap everywhere, every reserved request has its outbox row")
    click.echo(f"look around: quotagate inspect --db {url}")


COMMANDS = [demo]
