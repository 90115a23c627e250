"""Entry point: the ``quotagate`` command group and where subcommands are registered."""

from __future__ import annotations

import click

from quotagate.cli import (
    admin,
    api_tokens,
    cohorts,
    demo,
    fair_share,
    ledger,
    rate,
    retention,
    server,
    simulate,
    streaming,
    streams,
    top,
    worker,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="quotagate")
def cli() -> None:
    """quotagate: multi-tenant admission controller and quota ledger."""


# Each module exposes a list COMMANDS of click commands/groups to register.
for module in (admin, cohorts, fair_share, ledger, demo, rate, retention, server, simulate, streaming, streams,
               api_tokens, worker, top):
    for command in module.COMMANDS:
        cli.add_command(command)


def main() -> None:
    cli(prog_name="quotagate")
