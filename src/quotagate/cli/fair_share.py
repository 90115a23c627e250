"""``quotagate fair-share``: the ledger-wide fair-share settings (docs/fair-sharing.md#half-life)."""

from __future__ import annotations

import click

from quotagate.cli.common import db_option, echo_json, open_gate, reports_errors
from quotagate.domain.budget import format_duration


@click.group("fair-share")
def fair_share() -> None:
    """Fair share between tenants: blend in decayed past use."""


@fair_share.command("set")
@click.option("--half-life", required=True, metavar="DURATION",
              help="Blend each tenant's past use, halved every DURATION (e.g. 1h), into its "
              "share; 'none': current use only. Past use recorded so far is forgotten.")
@db_option
@reports_errors
def fair_share_set(half_life: str, db_url: str | None) -> None:
    """Set the fair-share half-life of the whole ledger (every admitter uses it)."""
    with open_gate(db_url) as gate:
        settings = gate.set_fair_share(half_life=None if half_life == "none" else half_life,
                                       actor="cli")
    click.echo(_describe(settings["half_life"]))


@fair_share.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def fair_share_show(as_json: bool, db_url: str | None) -> None:
    """Show the fair-share settings."""
    with open_gate(db_url) as gate:
        settings = gate.fair_share()
    if as_json:
        echo_json(settings)
    else:
        click.echo(_describe(settings["half_life"]))


def _describe(half_life: int | None) -> str:
    if half_life is None:
        return "fair share by current use (no half-life)"
    return f"fair share by current use and past use with a half-life of {format_duration(half_life)}"


COMMANDS = [fair_share]
