"""Schema and configuration commands: init, tenant, pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from quotagate.cli.common import (
    db_option,
    echo_json,
    open_gate,
    parse_assignments,
    parse_whole,
    render_table,
    reports_errors,
    utc_time,
)
from quotagate.cli.rate import describe_rate, rate_store_option
from quotagate.cli.stream_settings import (
    describe_stream_settings,
    parse_stream_settings,
    stream_settings_options,
)
from quotagate.domain.bucket import parse_rate
from quotagate.domain.budget import format_duration
from quotagate.domain.sharing import KEEP, Keep
from quotagate.errors import InvalidInput, NotFound, QuotagateError, quoted, with_hint


@click.command()
@db_option
@reports_errors
def init(db_url: str | None) -> None:
    """Create or migrate the schema."""
    from quotagate.store.engine import database_url, redact  # the gate loaded it already

    with open_gate(db_url) as gate:
        revision = gate.init()
    click.echo(f"schema at revision {revision} in {redact(database_url(db_url))}")


@click.group()
def tenant() -> None:
    """Tenants and their quotas."""


@tenant.command("set")
@click.argument("name")
@click.option("--quota", "quotas", multiple=True, metavar="RESOURCE=CAP",
              help="Cap for one resource; repeat for several.")
@click.option("--rate", default=None, metavar="capacity=N,refill=R",
              help="Rate quota: a token bucket of N tokens gaining R per second "
              "(refill=0: only 'quotagate rate add' refills it); 'none' removes it.")
@click.option("--cohort", default=None, metavar="COHORT",
              help="The cohort it lends to and borrows from ('none': leave it).")
@click.option("--borrowing-limit", "borrowing", multiple=True, metavar="RESOURCE=N",
              help="How far above its quota it may borrow ('RESOURCE=none': as far as the "
              "cohort has room); repeat for several.")
@click.option("--lending-limit", "lending", multiple=True, metavar="RESOURCE=N",
              help="How much of its unused quota it lends ('RESOURCE=none': all of it).")
@click.option("--weight", type=int, default=None,
              help="Its weight in fair sharing between tenants (1-1000, default 1).")
@click.option("--max-priority", default=None, metavar="N",
              help="The highest priority its requests may ask for ('none': no cap).")
@click.option("--reclaim", default=None, metavar="never|lower-priority|any",
              help="Preempt other members' borrowed work to get back to its nominal share.")
@click.option("--within-tenant", default=None, metavar="never|lower-priority",
              help="Preempt its own lower-priority running work for a waiting request.")
@click.option("--budget", "budget", multiple=True, metavar="RESOURCE=AMOUNT/WINDOW",
              help="Resource-hours per rolling window, e.g. gpu=100h/30d ('RESOURCE=none' "
              "removes one, 'none' all); repeat for several.")
@click.option("--default-max-runtime", default=None, metavar="DURATION",
              help="What a budget reserves for its requests that declare no --max-runtime "
              "(e.g. 1h; 'none' removes it).")
@click.option("--on-preempt", default=None, metavar="fail|requeue",
              help="What becomes of its work when it is preempted: it ends 'preempted' "
              "(fail, the default) or waits again with its submission time (requeue).")
@click.option("--stop-at-max-runtime/--no-stop-at-max-runtime", "stop_at_max_runtime",
              default=None, help="Stop its running work once its max-runtime has passed since "
              "admission (it ends 'timed_out'); off (the default): such work keeps running "
              "and its budget accrues it.")
@click.option("--max-runtime-grace", "max_runtime_grace", default=None, metavar="SECONDS",
              help="With --stop-at-max-runtime: how long past its max-runtime work may run "
              "before its stop begins (seconds or e.g. 5m, at most a week; 0, the default: "
              "none). Not the process target's stop_grace, which comes after: SIGTERM, then "
              "SIGKILL.")
@stream_settings_options
@db_option
@rate_store_option
@reports_errors
def tenant_set(
    name: str, quotas: tuple[str, ...], rate: str | None, cohort: str | None,
    borrowing: tuple[str, ...], lending: tuple[str, ...], weight: int | None,
    max_priority: str | None, reclaim: str | None, within_tenant: str | None,
    budget: tuple[str, ...], default_max_runtime: str | None,
    on_preempt: str | None, stop_at_max_runtime: bool | None, max_runtime_grace: str | None,
    db_url: str | None, rate_store: str | None,
    **stream_options: str | None,
) -> None:
    """Create a tenant or change its quotas; its quota is its nominal share in a cohort."""
    # Parse everything before changing anything: a bad --rate leaves the tenant untouched.
    caps = parse_assignments(quotas, "quota")
    bucket = parse_rate(rate) if rate is not None else None
    stream_settings = parse_stream_settings(**stream_options)
    chosen: str | Keep | None = KEEP if cohort is None else (None if cohort == "none" else cohort)
    cap: object = KEEP if max_priority is None else (
        None if max_priority == "none" else parse_whole(max_priority, "max_priority"))
    clear_budgets = "none" in budget
    limits = parse_budgets(tuple(value for value in budget if value != "none"))
    runtime: object = KEEP if default_max_runtime is None else (
        None if default_max_runtime == "none" else default_max_runtime)
    with open_gate(db_url, rate_store=rate_store) as gate:
        if bucket is not None:
            gate.check_rate_store(name, bucket)  # a store that is down changes nothing
        if stream_settings:
            # Judged first, against the tenant as it is: a change refused for its state
            # (a Redis move while it has topics) leaves its quotas as they were. Written
            # last, so a refused quota change leaves the stream settings as they were.
            try:
                gate.streams.check_settings(name, **stream_settings)
            except NotFound as missing:
                if missing.code != "unknown_tenant":
                    raise
        try:
            gate.set_tenant(
                name, caps, actor="cli", cohort=chosen,
                borrowing_limit=parse_assignments(borrowing, "borrowing_limit", allow_none=True),
                lending_limit=parse_assignments(lending, "lending_limit", allow_none=True),
                weight=weight, max_priority=cap, reclaim=reclaim, within_tenant=within_tenant,
                budget=limits, clear_budgets=clear_budgets, default_max_runtime=runtime,
                on_preempt=on_preempt, stop_at_max_runtime=stop_at_max_runtime,
                max_runtime_grace=max_runtime_grace,
            )
        except InvalidInput as refused:
            raise with_hint(refused, _OPTIONS) from None
        # The quota rows as `tenant show` prints them, a cohort member's limits included:
        # the change's own answer has caps only, and left out the limits just set.
        result = gate.tenant(name)["quota"]
        status = gate.set_rate(name, bucket, actor="cli") if rate is not None else None
        settings = (gate.streams.set_settings(name, **stream_settings, actor="cli")
                    if stream_settings else None)
    _print_caps("tenant", name, result)
    if rate is not None:
        click.echo(describe_rate(status))
    if settings is not None:
        click.echo(describe_stream_settings(settings))


@tenant.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@rate_store_option
@reports_errors
def tenant_show(name: str, as_json: bool, db_url: str | None, rate_store: str | None) -> None:
    """Show a tenant's quotas and use, and its rate quota's tokens left."""
    from quotagate.store.engine import redact  # the gate loads it

    with open_gate(db_url, rate_store=rate_store) as gate:
        described = gate.tenant(name)
        described["rate"] = gate.rate_status(name)
        settings = gate.stream_settings(name)
    described["streams"] = {"max_len": settings.max_len, "max_in_flight": settings.max_in_flight,
                            "redis": redact(settings.redis_url) if settings.redis_url else None}
    if as_json:
        echo_json(described)
    else:
        _print_caps("tenant", name, described["quota"])
        if described["cohort"] is not None:
            click.echo(f"cohort {described['cohort']} (root {described['cohort_root']})")
        click.echo(f"weight {described['weight']}, maximum priority "
                   f"{'none' if described['max_priority'] is None else described['max_priority']}"
                   f", reclaim {described['reclaim']}, within tenant {described['within_tenant']}"
                   f", on preempt {described['on_preempt']}")
        for line in describe_budgets(described):
            click.echo(line)
        click.echo(describe_rate(described["rate"]))
        click.echo(describe_stream_settings(settings))


def parse_budgets(values: tuple[str, ...]) -> dict[str, object]:
    """``("gpu=100h/30d", "cpu=none")`` → ``{"gpu": "100h/30d", "cpu": None}``."""
    parsed: dict[str, object] = {}
    for value in values:
        name, sep, limit = value.partition("=")
        if not sep or not name:
            raise InvalidInput(f"budget must look like RESOURCE=100h/30d, got {quoted(value)}",
                               code="invalid_budget")
        parsed[name.strip()] = None if limit.strip() == "none" else limit.strip()
    return parsed


def describe_budgets(described: dict[str, Any]) -> list[str]:
    """``tenant show``'s budget lines (docs/fair-sharing.md#budgets)."""
    lines = []
    default = described.get("default_max_runtime")
    if default is not None:
        lines.append(f"default max-runtime {format_duration(default)}")
    grace = described.get("max_runtime_grace") or 0
    if described.get("stop_at_max_runtime"):
        lines.append("work is stopped at its max-runtime (timed_out)"
                     + (f", after a grace of {format_duration(grace)}" if grace else ""))
    elif grace:
        lines.append(f"max-runtime grace {format_duration(grace)} (unused: work is not "
                     "stopped at its max-runtime)")
    for resource, state in described.get("budget", {}).items():
        frees = state["frees_at"]
        lines.append(
            f"budget {resource} {state['limit']}: spent {state['spent_hours']:g}h, reserved "
            f"ahead {state['reserved_ahead_hours']:g}h, left {state['left_hours']:g}h"
            + ("" if frees is None else f", frees up from {utc_time(frees)}"))
    return lines




@tenant.command("list")
@db_option
@reports_errors
def tenant_list(db_url: str | None) -> None:
    """List tenants."""
    with open_gate(db_url) as gate:
        for name in gate.tenants():
            click.echo(name)


@click.group()
def pool() -> None:
    """Resource pools and their capacities."""


@pool.command("set")
@click.argument("name")
@click.option("--capacity", "capacities", multiple=True, metavar="RESOURCE=CAP",
              help="Capacity of one resource; repeat for several.")
@click.option("--slices", type=int, default=None, metavar="S",
              help="Split the capacity over S slices so S admitters charge it on different "
                   "rows (default: unchanged; a new pool has 1).")
@db_option
@reports_errors
def pool_set(name: str, capacities: tuple[str, ...], slices: int | None,
             db_url: str | None) -> None:
    """Create a pool or change its capacities."""
    with open_gate(db_url) as gate:
        result = gate.set_pool(name, parse_assignments(capacities, "capacity"), actor="cli",
                               slices=slices)
    _print_caps("pool", name, result)


@pool.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def pool_show(name: str, as_json: bool, db_url: str | None) -> None:
    """Show a pool's capacities and use."""
    with open_gate(db_url) as gate:
        described = gate.pool(name)
    if as_json:
        echo_json(described)
    else:
        _print_caps("pool", name, described["capacity"])
        if described["slices"] > 1:
            click.echo(f"  slices: {described['slices']}")


@pool.command("list")
@db_option
@reports_errors
def pool_list(db_url: str | None) -> None:
    """List pools."""
    with open_gate(db_url) as gate:
        for name in gate.pools():
            click.echo(name)


def _print_caps(kind: str, name: str, caps: dict[str, dict[str, int]]) -> None:
    click.echo(f"{kind} {name}")
    rows = [[resource, values["used"], values["cap"]] for resource, values in sorted(caps.items())]
    headers = ["resource", "used", "cap"]
    if any("borrowing_limit" in values for values in caps.values()):
        # A cohort member's quota is its nominal share, which it may use more than (up to
        # the borrowing limit): under "cap", "used 5, cap 4" read as over its cap.
        headers = ["resource", "used", "nominal", "borrowing limit", "lending limit"]
        for row, values in zip(rows, (caps[resource] for resource in sorted(caps)), strict=True):
            row += [_limit(values.get("borrowing_limit")), _limit(values.get("lending_limit"))]
    if rows:
        click.echo(render_table(headers, rows))


def _limit(amount: int | None) -> str:
    # No borrowing limit is "as far as the cohort has room", no lending limit "all of it":
    # printed "none", either read as the opposite, nothing borrowed or lent.
    return "no limit" if amount is None else str(amount)


COMMANDS = [init, tenant, pool]


# The option that sets what a cohort refusal lacks (the HTTP API names its fields).
_OPTIONS: dict[str, Callable[[QuotagateError], str]] = {
    "not_in_cohort": lambda _refused: "--cohort",
    "unknown_quota_resource": lambda refused: f"--quota {refused.fields['resource']}=N",
}
