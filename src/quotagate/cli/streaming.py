"""Streaming commands: ``lab`` (the measured scenarios) and ``diagnose`` (one request, layer by layer)."""

from __future__ import annotations

import sys

import click

from quotagate.cli.api_tokens import audit_table
from quotagate.cli.common import EXIT_ERROR, LazyChoice, db_option, echo_json, open_gate, reports_errors

# quotagate.streaming is imported inside the commands: its package loads the sinks (and with
# them SQLAlchemy's PostgreSQL dialect), which no other command needs at startup.


def _lab_choices() -> list[str]:
    from quotagate.streaming.lab.runner import SCENARIOS

    return [*SCENARIOS, "all"]


@click.command()
@click.argument("scenarios", nargs=-1, type=LazyChoice(_lab_choices))
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
    from quotagate.streaming.lab.runner import run_lab, scenario_names

    names = list(dict.fromkeys(name for choice in scenarios or ("all",) for name in scenario_names(choice)))
    report = run_lab(names, db_url, keep_workdir=keep,
                     on_observation=None if as_json else lambda observation: click.echo(observation.line()),
                     on_start=None if as_json else _say_what_is_slow)
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
                           + (f"; dropping it failed: {cleanup.error}" if cleanup.error else ""), err=True)
    if not report.ok:
        sys.exit(EXIT_ERROR)


def _say_what_is_slow(scenario: str) -> None:
    # The other scenarios take seconds; without a word the Spark runs look like a hang.
    if scenario == "checkpoint":
        click.echo("lab: checkpoint runs four Spark drivers, each its own JVM (a minute or two)...", err=True)


@click.command("diagnose")
@click.argument("request_id")
@click.option("--checkpoint", default=None, help="The streaming query's checkpoint directory.")
@click.option("--sink-db", "sink_url", envvar="QUOTAGATE_SINK_DB", default=None,
              help="The business database the sink writes (its batch markers and fence). Also $QUOTAGATE_SINK_DB.")
@click.option("--query", default=None, help="The sink's query name (default: every query in the sink database).")
@click.option("--json", "as_json", is_flag=True, help="Print the layers as JSON.")
@db_option
@reports_errors
def diagnose_command(request_id: str, checkpoint: str | None, sink_url: str | None, query: str | None,
                     as_json: bool, db_url: str | None) -> None:
    """Walk one request through the quota, lease, checkpoint and idempotency layers.

    A rejected request stops at the quota layer: it never ran. See docs/streaming.md.
    """
    from quotagate.streaming.diagnose import StreamingLocation, diagnose

    with open_gate(db_url) as gate:
        layers = diagnose(gate, request_id, StreamingLocation(checkpoint, sink_url, query))
        trail = gate.audit_trail(request_id)
    if as_json:
        echo_json({"request": request_id, "layers": [layer.to_dict() for layer in layers],
                   "audit": trail.entries, "audit_earlier": trail.earlier})
        return
    width = max(len(layer.name) for layer in layers)
    for layer in layers:
        click.echo(f"{layer.name.ljust(width)}  {layer.verdict}")
    # Who did what when, after the verdicts: the layers say what went wrong, this when and by whom.
    earlier = ", the newest shown" if trail.earlier else ""
    noun = "entry" if len(trail.entries) == 1 else "entries"
    click.echo(f"\naudit trail ({len(trail.entries)} {noun}{earlier}, oldest first):")
    click.echo(audit_table(trail.entries, one_request=True) if trail.entries else "  none")


COMMANDS = [diagnose_command, lab]
