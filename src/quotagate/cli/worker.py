"""Delivery commands: ``worker``, ``target set/list``, ``lease show``."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from quotagate.cli.common import (
    db_option,
    echo_json,
    hold_seconds_option,
    open_gate,
    render_table,
    reports_errors,
)
from quotagate.cli.stop_signals import GRACE_EXPIRED_EXIT, stop_on_signals
from quotagate.delivery.targets import KINDS
from quotagate.delivery.worker_defaults import (
    DEFAULT_BATCH,
    DEFAULT_CONCURRENCY,
    DEFAULT_EXIT_GRACE,
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_ATTEMPTS,
)
from quotagate.errors import InvalidInput, quoted

if TYPE_CHECKING:
    from quotagate.app import Quotagate
    from quotagate.delivery.dispatcher import Dispatcher


@click.command()
@click.option("--name", "worker_name", default=None,
              help="Worker name, also its lease's name (default: this host's name). "
              "A restarted worker of the same name takes over once the lease expires.")
@click.option("--lease-ttl", type=float, default=DEFAULT_LEASE_TTL, show_default=True,
              help="Seconds the lease lasts without renewal; this worker's claims die "
              "with it, so another worker takes them over that long after a crash.")
@click.option("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True,
              help="Failed deliveries before the request ends failed and its cost is released.")
@click.option("--retry-base", type=float, default=1.0, show_default=True,
              help="First retry delay in seconds; doubles per failure.")
@click.option("--batch", type=int, default=DEFAULT_BATCH, show_default=True,
              help="Outbox rows claimed per pass; their bindings and marks are written in "
              "one transaction.")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=DEFAULT_CONCURRENCY,
              show_default=True, help="Deliveries kept in flight at once.")
@click.option("--poll", "poll_interval", type=float, default=0.5, show_default=True,
              help="Seconds to wait when a pass found nothing to do.")
@click.option("--admit/--no-admit", default=False, show_default=True,
              help="Also run admission in each pass (one process for the whole pipeline).")
@click.option("--once", is_flag=True, help="Run one pass and exit.")
@click.option("--until-idle", is_flag=True,
              help="Run passes until nothing is pending or running, then exit.")
@click.option("--exit-grace", type=click.FloatRange(min=0.0, min_open=True),
              default=DEFAULT_EXIT_GRACE, show_default=True,
              help="Seconds a stop (SIGTERM/SIGINT) may take; a worker still busy then (a "
              f"database call in a lock wait, a slow target) exits {GRACE_EXPIRED_EXIT} "
              "without its cleanup, its work left to its lease's expiry. Keep it below the "
              "supervisor's own grace (systemd TimeoutStopSec, Kubernetes "
              "terminationGracePeriodSeconds).")
@click.option("-v", "--verbose", is_flag=True, help="Log each delivery.")
@hold_seconds_option
@db_option
@reports_errors
def worker(
    worker_name: str | None, lease_ttl: float, max_attempts: int,
    retry_base: float, batch: int, concurrency: int, poll_interval: float, admit: bool, once: bool,
    until_idle: bool, exit_grace: float, verbose: bool, hold_seconds: float, db_url: str | None,
) -> None:
    """Deliver admitted requests to their targets until stopped (SIGTERM/SIGINT)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")
    from quotagate.delivery.dispatcher import Dispatcher

    # The hold matters with --admit only: admission is where preemptions are decided.
    with open_gate(db_url, hold_seconds=hold_seconds) as gate:
        dispatcher = Dispatcher(
            gate, worker_name=worker_name or socket.gethostname().split(".")[0],
            lease_ttl=lease_ttl, max_attempts=max_attempts, retry_base=retry_base,
            batch=batch, concurrency=concurrency, poll_interval=poll_interval, admit=admit,
        )
        if once:
            try:
                dispatcher.run_once()
                # What moved, by kind: "delivered 3 requests, 0 failed, 1 stop confirmed".
                if dispatcher.last_pass is not None:
                    click.echo(dispatcher.last_pass.sentence())
            finally:
                dispatcher.release()
            return
        stop = threading.Event()
        stop_on_signals(stop, grace=exit_grace, what=f"worker {dispatcher.worker_name}")
        if until_idle:
            _run_until_idle(dispatcher, gate, stop, poll_interval)
        else:
            dispatcher.run(stop)


def _run_until_idle(dispatcher: Dispatcher, gate: Quotagate, stop: threading.Event,
                    poll_interval: float) -> None:
    try:
        while not stop.is_set():
            moved = dispatcher.run_once()
            if moved == 0 and _idle(gate):
                return
            if moved == 0:
                time.sleep(poll_interval)
    finally:
        dispatcher.release()


def _idle(gate: Quotagate) -> bool:
    counts = gate.state_counts()
    from quotagate.domain.model import CHARGED_STATES

    # Stopping work too: its stop is this worker's to carry out (it is charged).
    return not any(counts.get(state.value) for state in CHARGED_STATES)


@click.group()
def target() -> None:
    """Delivery targets, by name."""


@target.command("set")
@click.argument("name")
@click.option("--kind", type=click.Choice(KINDS), required=True)
@click.option("--command", "command", help="process: the command line run per request, in its run "
              "directory (a program given as ./PATH is made absolute, "
              "docs/decisions/040); "
              "spark: the job's entry point, e.g. 'spark-submit job.py'.")
@click.option("--module", help="spark: a Python module run as the job (python -m MODULE).")
@click.option("--checkpoint-root", help="spark: where checkpoints go, ROOT/LEDGER/TENANT/NAME "
              "(default ./quotagate-checkpoints).")
@click.option("--run-dir", help="process, spark: where run directories go (default ./quotagate-runs).")
@click.option("--environment", help="process, spark: names of worker environment variables "
              "the command or job may inherit, comma-separated (beyond PATH, HOME, LANG).")
@click.option("--stop-grace", type=float,
              help="process, spark: seconds between SIGTERM and SIGKILL on a stop (default 10).")
@click.option("--url", help="webhook: the URL requests are POSTed to.")
@click.option("--timeout", type=float, help="webhook: seconds per HTTP call (default 10).")
@click.option("--poll-every", type=float, help="webhook: read each running object's outcome "
              "at most once per this many seconds (default 0: every outcome pass); for a "
              "receiver that calls back, e.g. 30.")
@click.option("--batch-read/--no-batch-read", "batch_read", default=None,
              help="webhook: read outcomes with POST <url>/_read, many names per call, "
              "instead of one GET per object (docs/delivery.md).")
@click.option("--batch-deliver", "batch_deliver", type=int, metavar="N",
              help="webhook: send up to N deliveries in one POST <url>/_batch, each answered "
              "on its own (default 1: one POST per delivery; docs/delivery.md).")
@click.option("--namespace", help="kubernetes: namespace (default 'default').")
@click.option("--group", "api_group", help="kubernetes: API group (default quotagate.io).")
@click.option("--version", "api_version", help="kubernetes: API version (default v1alpha1).")
@click.option("--plural", help="kubernetes: resource plural (default modelservices).")
@click.option("--resource-kind", help="kubernetes: object kind (default ModelService).")
@click.option("--host", help="kubernetes: API server URL, e.g. kubectl proxy's.")
@click.option("--kubeconfig", help="kubernetes: kubeconfig file.")
@click.option("--context", help="kubernetes: kubeconfig context.")
@click.option("--stop", "stop", type=click.Choice(["delete", "suspend"]),
              help="kubernetes: how a cancel stops the object: delete it (default), or set "
                   "spec.suspend and wait for status.phase Suspended.")
@click.option("--default", "is_default", is_flag=True,
              help="Deliver requests that name no target here.")
@click.option("--tenants", "tenant_list", default=None, metavar="T1,T2",
              help="Only these tenants may use the target (others get 'unknown target'); "
                   "without it a replaced target keeps its tenants (docs/delivery.md).")
@click.option("--all-tenants", is_flag=True, help="Let every tenant use the target again.")
@db_option
@reports_errors
def target_set(name: str, kind: str, is_default: bool, tenant_list: str | None,
               all_tenants: bool, db_url: str | None, **options: Any) -> None:
    """Create or replace a delivery target."""
    if all_tenants and tenant_list is not None:
        raise InvalidInput("give --tenants or --all-tenants, not both", code="invalid_tenants")
    tenants: list[str] | None = [] if all_tenants else None
    if tenant_list is not None:
        tenants = [tenant.strip() for tenant in tenant_list.split(",") if tenant.strip()]
        if not tenants:
            raise InvalidInput("--tenants needs at least one tenant name (or use --all-tenants)",
                               code="invalid_tenants")
    keys = {"api_group": "group", "api_version": "version"}
    config = {keys.get(key, key): value for key, value in options.items() if value is not None}
    with open_gate(db_url) as gate:
        stored = gate.set_target(
            name, kind, config, default=is_default, tenants=tenants, actor="cli"
        )
    suffix = " (default)" if stored.is_default else ""
    if stored.tenants:
        suffix += f" for tenants {', '.join(stored.tenants)}"
    click.echo(f"target {stored.name}: {stored.kind}{suffix}")


@target.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def target_list(as_json: bool, db_url: str | None) -> None:
    """List delivery targets."""
    with open_gate(db_url) as gate:
        targets = gate.list_targets()
    if as_json:
        from quotagate.delivery.targets.webhook import redact

        echo_json([
            {**stored.to_dict(), "config": {
                key: redact(value) if key == "url" else value
                for key, value in stored.config.items()
            }}
            for stored in targets
        ])
        return
    click.echo(render_table(
        ["name", "kind", "default", "tenants", "config"],
        [[t.name, t.kind, "yes" if t.is_default else "", ",".join(t.tenants) or "all",
          _summary(t.config)] for t in targets],
    ))


def _summary(config: dict[str, Any]) -> str:
    from quotagate.delivery.targets.webhook import redact

    def shown(key: str, value: Any) -> str:
        if isinstance(value, list):
            return " ".join(value)
        return redact(value) if key == "url" else str(value)

    return " ".join(f"{key}={shown(key, value)}" for key, value in sorted(config.items()))


@click.group()
def lease() -> None:
    """Generational leases held by workers."""


@lease.command("show")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def lease_show(name: str | None, as_json: bool, db_url: str | None) -> None:
    """Show leases: owner, generation and time left by the database's clock."""
    with open_gate(db_url) as gate:
        now, leases = gate.list_leases()
    if name is not None:
        leases = [held for held in leases if held.name == name]
        if not leases:
            from quotagate.errors import NotFound

            raise NotFound(f"lease {quoted(name)} does not exist", code="unknown_lease")
    rows = [
        {**held.to_dict(), "expires_in": round(held.expires_at - now, 3),
         "held": held.owner is not None and held.expires_at >= now}
        for held in leases
    ]
    if as_json:
        echo_json(rows)
        return
    click.echo(render_table(
        ["name", "owner", "generation", "held", "expires_in"],
        [[row["name"], row["owner"] or "-", row["generation"], "yes" if row["held"] else "no",
          f"{row['expires_in']:.1f}s" if row["held"] else "-"] for row in rows],
    ))


COMMANDS = [worker, target, lease]
