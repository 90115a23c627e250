"""Cohort commands: the tree of tenants that lend each other unused quota (docs/fair-sharing.md)."""

from __future__ import annotations

from typing import Any

import click

from quotagate.cli.common import db_option, echo_json, open_gate, render_table, reports_errors
from quotagate.domain.sharing import KEEP, Keep


@click.group()
def cohort() -> None:
    """Cohorts: tenants that borrow each other's unused nominal quota."""


@cohort.command("set")
@click.argument("name")
@click.option("--parent", default=None, metavar="COHORT",
              help="Put the cohort under another one ('none': make it a root). "
              "Without it, a new cohort is a root and an existing one stays where it is.")
@db_option
@reports_errors
def cohort_set(name: str, parent: str | None, db_url: str | None) -> None:
    """Create a cohort or move it in the tree."""
    chosen: str | Keep | None = KEEP if parent is None else (None if parent == "none" else parent)
    with open_gate(db_url) as gate:
        described = gate.set_cohort(name, parent=chosen, actor="cli")
    _print_cohort(described)


@cohort.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def cohort_show(name: str, as_json: bool, db_url: str | None) -> None:
    """Show a cohort: parent, children, tenants and (for a root) its shared room."""
    with open_gate(db_url) as gate:
        described = gate.config.get_cohort(name)
    if as_json:
        echo_json(described)
    else:
        _print_cohort(described)


@cohort.command("list")
@db_option
@reports_errors
def cohort_list(db_url: str | None) -> None:
    """List cohorts with their parents."""
    with open_gate(db_url) as gate:
        cohorts = gate.config.list_cohorts()
    click.echo(render_table(["cohort", "parent"], [[name, parent] for name, parent in cohorts]))


def _print_cohort(described: dict[str, Any]) -> None:
    click.echo(f"cohort {described['name']} (parent: {described['parent'] or 'none'}, "
               f"root: {described['root']})")
    if described["children"]:
        click.echo(f"  children: {', '.join(described['children'])}")
    if described["tenants"]:
        click.echo(f"  tenants: {', '.join(described['tenants'])}")
    if described["room"]:
        click.echo(render_table(
            ["resource", "shared used", "shared cap"],
            [[resource, room["used"], room["cap"]] for resource, room in described["room"].items()],
        ))


COMMANDS = [cohort]
