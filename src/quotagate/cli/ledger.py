"""Request commands: submit, admit, release, expire and the views."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from quotagate.cli.common import (
    db_option,
    echo_json,
    hold_seconds_option,
    open_gate,
    parse_assignments,
    render_table,
    reports_errors,
    utc_time,
)
from quotagate.cli.rate import rate_store_option
from quotagate.domain.budget import format_duration
from quotagate.domain.model import STOPPING_STATES, RequestState, parse_payload_text

if TYPE_CHECKING:
    from quotagate.store.release import ReleaseResult


@click.command()
@click.option("--id", "request_id", required=True, help="Stable request id (idempotency key).")
@click.option("--tenant", required=True)
@click.option("--cost", "costs", multiple=True, required=True, metavar="RESOURCE=AMOUNT",
              help="Cost in one resource; repeat for several.")
@click.option("--priority", default=0, show_default=True, type=int)
@click.option("--payload", default=None, help="JSON payload handed to the executor.")
@click.option("--target", default=None, help="Delivery target name (default: the default target).")
@click.option("--max-runtime", default=None, metavar="DURATION",
              help="How long it is expected to run (90s, 30m, 2h): what its tenant's budget "
              "reserves for it (default: the tenant's --default-max-runtime). Not a time "
              "limit: work past it keeps running and accruing.")
@click.option("--json", "as_json", is_flag=True, help="Print the request as JSON.")
@db_option
@rate_store_option
@reports_errors
def submit(
    request_id: str, tenant: str, costs: tuple[str, ...], priority: int, payload: str | None,
    target: str | None, max_runtime: str | None, as_json: bool, db_url: str | None,
    rate_store: str | None,
) -> None:
    """Record a request as waiting (idempotent by id); a tenant's rate quota may refuse it."""
    parsed_payload = None if payload is None else parse_payload_text(payload)
    with open_gate(db_url, rate_store=rate_store) as gate:
        result = gate.submit(
            request_id, tenant, parse_assignments(costs, "cost"), priority=priority,
            payload=parsed_payload, target=target, actor="cli", max_runtime=max_runtime,
        )
    if as_json:
        echo_json({**result.request.to_dict(), "created": result.created})
    else:
        verb = "submitted" if result.created else "already submitted"
        click.echo(f"{verb}: {result.request.id} ({result.request.state.value})")


@click.command()
@click.option("--once", "mode", flag_value="once", default=True, help="Run one admission (default).")
@click.option("--until-idle", "mode", flag_value="until-idle",
              help="Admit until nothing waiting fits, then exit.")
@click.option("--loop", "mode", flag_value="loop", help="Keep polling for work.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Requests admitted per transaction.")
@click.option("--interval", default=0.5, show_default=True, type=click.FloatRange(0.01),
              help="Seconds between polls with --loop when idle.")
@click.option("--ttl", default=3600.0, show_default=True, type=click.FloatRange(1),
              help="Seconds a request may wait before it expires.")
@hold_seconds_option
@db_option
@reports_errors
def admit(mode: str, batch: int, interval: float, ttl: float, hold_seconds: float,
          db_url: str | None) -> None:
    """Promise capacity to waiting requests that fit."""
    with open_gate(db_url, ttl=ttl, hold_seconds=hold_seconds) as gate:
        if mode == "once":
            admitted = gate.admit(batch)
            for placement in admitted:
                click.echo(f"admitted {placement.id} ({placement.tenant}) on {placement.pool}")
            if not admitted:
                click.echo("nothing to admit")
            return
        if mode == "until-idle":
            click.echo(f"admitted {gate.admit_until_idle(batch)}")
            return
        total = 0
        try:
            while True:
                admitted = gate.admit(batch)
                total += len(admitted)
                for placement in admitted:
                    click.echo(f"admitted {placement.id} ({placement.tenant}) on {placement.pool}")
                if not admitted:
                    time.sleep(interval)
        except KeyboardInterrupt:
            click.echo(f"stopped after admitting {total}")


def _release_command(name: str, state: RequestState, help_text: str, *,
                     forcible: bool = False) -> click.Command:
    @click.command(name=name, help=help_text)
    @click.argument("request_id")
    @click.option("--reason", default=None, help="Why (kept with the request).")
    @db_option
    @reports_errors
    def command(request_id: str, reason: str | None, db_url: str | None,
                force: bool = False) -> None:
        with open_gate(db_url) as gate:
            result = gate.release(request_id, state, reason=reason, actor="cli", admin=True,
                                  force=force)
        click.echo(_release_line(result))

    if forcible:
        command = click.option(
            "--force", is_flag=True,
            help="The executor is lost: end it now and return its cost now, even if the "
                 "work still runs (an oversell no counter shows; audited as forced).")(command)
    return command


def _release_line(result: ReleaseResult) -> str:
    """What a release did: the cost returned, or the stop asked and the cost held."""
    request = result.request
    if request.state in STOPPING_STATES:
        return (f"{request.id} is {request.state.value}; returned nothing yet: a stop was "
                "asked, and its cost returns once a worker sees its target confirm the stop")
    returned = ", ".join(f"{r}={a}" for r, a in result.released.items()) or "nothing"
    return f"{request.id} is {request.state.value}; returned {returned}"


_VERDICT_HELP = (
    "A waiting one cannot be; a reserved one no worker has taken up ends at once and returns "
    "its cost; a delivered one (or one being delivered) becomes {stopping}: a worker stops it, "
    "and once its target confirms the stop it ends {state} and its cost comes back, once "
    "(docs/delivery.md). --force ends it now.")
complete = _release_command(
    "complete", RequestState.COMPLETED,
    "Mark a request completed as an admin. " + _VERDICT_HELP.format(stopping="completing",
                                                                     state="completed"),
    forcible=True)
fail = _release_command(
    "fail", RequestState.FAILED,
    "Mark a request failed as an admin. " + _VERDICT_HELP.format(stopping="failing",
                                                                  state="failed"),
    forcible=True)
cancel = _release_command("cancel", RequestState.CANCELLED,
                          "Cancel a request: a waiting one at once; a reserved or delivered one "
                          "becomes cancelling and returns its cost once a worker has seen its "
                          "target confirm the stop (docs/delivery.md).")


@click.command()
@click.option("--ttl", default=3600.0, show_default=True, type=click.FloatRange(1),
              help="Seconds a request may wait; older waiting ones expire.")
@db_option
@reports_errors
def expire(ttl: float, db_url: str | None) -> None:
    """Expire waiting requests older than the TTL."""
    with open_gate(db_url, ttl=ttl) as gate:
        click.echo(f"expired {gate.expire()}")


@click.command()
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def show(request_id: str, as_json: bool, db_url: str | None) -> None:
    """Show one request."""
    with open_gate(db_url) as gate:
        request = gate.show(request_id)
    data = request.to_dict()
    if as_json:
        echo_json(data)
        return
    for key in ("id", "tenant", "state", "cost", "priority", "pool", "target", "reason"):
        value = data[key]
        if key == "cost":
            value = ", ".join(f"{r}={a}" for r, a in value.items())
        elif key == "target" and value is None:
            value = "(the default target)"  # not blank: it is delivered somewhere
        click.echo(f"{key:>9}: {'' if value is None else value}")
    # A requeued request's later attempt is a new object at its target.
    click.echo(f"{'attempt':>9}: {data['attempt']}")
    if data["max_runtime"] is not None:
        click.echo(f"{'runtime':>9}: at most {format_duration(data['max_runtime'])} "
                   "(what a budget reserves)")
    click.echo(f"{'created':>9}: {utc_time(request.created)}")
    click.echo(f"{'payload':>9}: {json.dumps(request.payload)}")


@click.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def inspect(limit: int, as_json: bool, db_url: str | None) -> None:
    """Recent requests with outbox and binding, and every tenant's and pool's use."""
    with open_gate(db_url) as gate:
        data = gate.inspect(limit)
    if as_json:
        echo_json(data)
        return
    print_usage(data)
    click.echo("")
    click.echo(render_table(
        ["id", "tenant", "state", "cost", "pool", "outbox", "binding", "created"],
        [[r["id"], r["tenant"], r["state"], _cost_text(r["cost"]), r["pool"], r["outbox"],
          r["binding"], utc_time(r["created"])] for r in data["requests"]],
    ))
    # Too long for a column, and the first thing to read when a delivery or a stop
    # does not move on (docs/delivery.md, troubleshooting).
    # A stop under way is no failure: its answer is stop_progress (docs/decisions/823).
    stuck = [r for r in data["requests"] if r["last_error"] or r["stop_progress"]]
    if stuck:
        click.echo("")
        for r in stuck:
            answer = (f"last_error: {r['last_error']}" if r["last_error"]
                      else f"stop_progress: {r['stop_progress']}")
            click.echo(f"{r['id']}: outbox {r['outbox']} after {r['attempts']} "
                       f"attempt{'' if r['attempts'] == 1 else 's'}, {answer}")


def print_usage(data: Mapping[str, Any]) -> None:
    if data.get("cohorts"):
        # With cohorts a quota is a nominal share that may be exceeded by borrowing.
        click.echo(render_table(
            ["tenant", "cohort", "resource", "used", "nominal", "borrowed", "lent"],
            [[r["tenant"], r.get("cohort"), r["resource"], r["used"], r["nominal"],
              r["borrowed"], r["lent"]] for r in data["tenants"]],
        ))
        click.echo("")
        click.echo(render_table(
            ["cohort", "resource", "shared used", "shared cap"],
            [[r["cohort"], r["resource"], r["used"], r["cap"]] for r in data["cohorts"]],
        ))
    else:
        click.echo(render_table(
            ["tenant", "resource", "used", "cap"],
            [[r["tenant"], r["resource"], r["used"], r["cap"]] for r in data["tenants"]],
        ))
    click.echo("")
    click.echo(render_table(
        ["pool", "resource", "used", "cap"],
        [[r["pool"], r["resource"], r["used"], r["cap"]] for r in data["pools"]],
    ))


def _cost_text(cost: dict[str, int]) -> str:
    return ",".join(f"{r}={a}" for r, a in cost.items())


@click.command()
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def explain(request_id: str, as_json: bool, db_url: str | None) -> None:
    """Why a waiting request is not admitted yet."""
    with open_gate(db_url) as gate:
        data = gate.explain(request_id)
    if as_json:
        echo_json(data)
        return
    click.echo(f"{data['id']}: {data['reason']}")
    if data["waiting"]:
        click.echo(f"  queue position {data['position']} (in its tenant's queue "
                   f"{data['tenant_position']}), effective priority {data['effective_priority']}, "
                   f"waited {data['waited_seconds']}s")
        if data["fitting_pools"]:
            click.echo(f"  pools with room: {', '.join(data['fitting_pools'])}")


@click.command()
@db_option
@reports_errors
def check(db_url: str | None) -> None:
    """Verify the ledger's accounting (docs/invariants.md, 1-2) and the cohort invariants;
    exit 1 on any violation.

    Usage above a cap that was lowered below it is reported as over-cap, not as a
    violation: lowering a cap is allowed, and admission waits until usage drops.
    """
    with open_gate(db_url) as gate:
        result = gate.check_ledger()
    for violation in result.violations:
        click.echo(f"violation: {violation}", err=True)
    for note in result.over_cap:
        click.echo(f"over cap (admission waits until usage drops): {note}")
    if result.violations:
        raise SystemExit(1)
    click.echo("invariants hold")



COMMANDS = [submit, admit, complete, fail, cancel, expire, show, inspect, explain, check]
