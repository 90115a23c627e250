"""Streaming commands: ``lab`` (the measured scenarios) and ``diagnose`` (one request, layer by layer)."""

from __future__ import annotations

import sys

import click

from quotagate.cli.common import EXIT_ERROR, echo_json, reports_errors
from quotagate.streaming.lab.runner import SCENARIOS, run_lab, scenario_names


@click.command()
@click.argument("scenarios", nargs=-1, type=click.Choice([*SCENARIOS, "all"]))
@click.option("--db", "db_url", default=None,
              help="Where the throwaway databases go: a server URL (postgresql://…, mysql://…) gets a "
              "uniquely named database per scenario, dropped at the end; default a fresh SQLite file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the lines.")
@click.option("--keep", is_flag=True, help="Keep the working directory (Spark logs, checkpoint) and print it.")
@reports_errors
def lab(scenarios: tuple[str, ...], db_url: str | None, as_json: bool, keep: bool) -> None:
    """Run the quota, gate, lease and checkpoint scenarios (default all) and print what was measured.

    Each scenario runs in its own throwaway database. The checkpoint scenario
    runs real Spark (the spark extra and Java 17+). Exits 1 if a scenario fails
    or a database could not be removed. See docs/streaming.md.
    """
    names = list(dict.fromkeys(name for choice in scenarios or ("all",) for name in scenario_names(choice)))
    report = run_lab(names, db_url, keep_workdir=keep,
                     on_observation=None if as_json else lambda observation: click.echo(observation.line()))
    if keep:
        click.echo(f"working directory kept: {report.workdir}", err=True)
    if as_json:
        echo_json(report.to_dict())
    else:
        for name, failure in report.failures.items():
            click.echo(f"error: lab_scenario_failed: {name}: {failure}", err=True)
        for cleanup in report.cleanups:
            if not cleanup.removed:
                click.echo(f"error: lab_cleanup_incomplete: {cleanup.database} is still there"
                           + (f" ({cleanup.error})" if cleanup.error else ""), err=True)
    if not report.ok:
        sys.exit(EXIT_ERROR)


COMMANDS = [lab]
