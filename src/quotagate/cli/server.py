"""``quotagate serve``: the HTTP API plus admission (and delivery) workers."""

from __future__ import annotations

import logging
import sys
import threading

import click

from quotagate.cli.common import db_option, ensure_schema, hold_seconds_option, open_gate, reports_errors
from quotagate.cli.rate import rate_store_option
from quotagate.cli.retention import parse_duration
from quotagate.cli.stop_signals import GRACE_EXPIRED_EXIT, stop_on_signals
from quotagate.cli.streams import redis_option
from quotagate.delivery.worker_defaults import DEFAULT_EXIT_GRACE


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; loopback unless you mean to expose it.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--admit-interval", default=0.2, show_default=True, type=click.FloatRange(0.01),
              help="Seconds between admission polls when nothing fits.")
@click.option("--admit-batch", default=16, show_default=True, type=click.IntRange(1, 1000),
              help="Requests admitted per transaction; while passes come back full, each "
              "next one asks for twice as many, up to 256 (or this, if larger).")
@click.option("--no-workers", is_flag=True,
              help="Serve the API only; run admission and delivery elsewhere.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--access-log", is_flag=True, help="Log every HTTP request.")
@click.option("--worker-name", default=None,
              help="Name of the delivery worker and its lease (default HOST-PID). A stable "
              "name lets a restarted serve take its unfinished deliveries back at once.")
@click.option("--concurrency", default=32, show_default=True, type=click.IntRange(1, 1024),
              help="Deliveries the worker keeps in flight at once (docs/delivery.md).")
@click.option("--tour", is_flag=True,
              help="Once up, walk through a short guided tour against this server "
              "(creates an admin token, tenants, pools, a process target and requests).")
@click.option("--prune-older-than", "prune_older_than", default=None, metavar="DURATION",
              envvar="QUOTAGATE_PRUNE_OLDER_THAN",
              help="Delete finished requests and audit entries older than this (30d, 12h, …) "
              "in the background, as `quotagate prune` does. Off unless given. "
              "Also $QUOTAGATE_PRUNE_OLDER_THAN.")
@click.option("--token-cache-ttl", default=0.0, show_default=True, type=click.FloatRange(0, 60),
              help="Seconds a verified API token is believed without reading its row again; "
              "a revocation made elsewhere then counts within that time (0: on the next "
              "request; docs/decisions/237).")
# The default is connections.DEFAULT_CONNECTIONS, written out like --hold-seconds's: the
# module is imported only once serve runs; a unit test keeps them equal.
@click.option("--db-connections", "db_connections", default=20, show_default=True,
              envvar="QUOTAGATE_DB_CONNECTIONS", type=click.IntRange(2, 1000),
              help="Database connections serve opens at most, kept open once opened; HTTP "
              "calls run as many at once as its own threads leave free (they hold up "
              "to 7 with workers), the rest wait their turn. "
              "Also $QUOTAGATE_DB_CONNECTIONS (docs/decisions/314).")
@click.option("--exit-grace", type=click.FloatRange(min=0.0, min_open=True),
              default=DEFAULT_EXIT_GRACE,
              show_default=True,
              help="Seconds a stop (SIGTERM/SIGINT) may take: HTTP calls in flight finish, "
              "then admission and delivery stop. Still busy then (a database call in a "
              f"lock wait, a slow target), serve exits {GRACE_EXPIRED_EXIT} without its "
              "cleanup, its deliveries left to its lease's expiry. Keep it below the "
              "supervisor's own grace (systemd TimeoutStopSec, Kubernetes "
              "terminationGracePeriodSeconds).")
@hold_seconds_option
@db_option
@redis_option
@rate_store_option
@reports_errors
def serve(
    host: str, port: int, admit_interval: float, admit_batch: int, no_workers: bool,
    log_level: str, access_log: bool, worker_name: str | None, concurrency: int, tour: bool,
    prune_older_than: str | None, token_cache_ttl: float, db_connections: int,
    exit_grace: float, hold_seconds: float, db_url: str | None, redis_url: str | None,
    rate_store: str | None,
) -> None:
    """Run the HTTP API, admission and delivery until SIGTERM."""
    from quotagate.http import service
    from quotagate.http.connections import http_threads

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    # Alembic's "Context impl…" lines say nothing to someone starting a server; in
    # the tour, httpx's line per tour call would bury the tour's own lines.
    quiet = ("alembic", "httpx", "httpcore") if tour else ("alembic",)
    for name in quiet:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    retention = None if prune_older_than is None else parse_duration(prune_older_than)
    # Refused before anything opens: a pool too small for serve's own threads.
    http_threads(db_connections, workers=not no_workers, retention=retention is not None)
    gate = open_gate(db_url, redis=redis_url, rate_store=rate_store, connections=db_connections,
                     token_cache_ttl=token_cache_ttl, hold_seconds=hold_seconds)
    ensure_schema(gate)
    from quotagate.store.engine import database_url, redact  # loaded already, with the gate

    click.echo(f"quotagate serving http://{host}:{port} on {redact(database_url(db_url))}",
               err=True)
    on_started = None
    if tour:
        from quotagate.tour import run_tour

        local = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        base_url = f"http://[{local}]:{port}" if ":" in local else f"http://{local}:{port}"

        def on_started() -> None:
            try:
                run_tour(base_url, gate, lambda line: click.echo(line, err=True))
            except Exception as error:
                click.echo(f"tour stopped: {error}", err=True)

    stop = threading.Event()
    stop_on_signals(stop, grace=exit_grace, what="serve")
    sys.exit(service.run(
        gate, host=host, port=port, admit_interval=admit_interval, admit_batch=admit_batch,
        workers=not no_workers, log_level=log_level, access_log=access_log,
        on_started=on_started, worker_name=worker_name, concurrency=concurrency,
        prune_older_than=retention, connections=db_connections, stop=stop,
        graceful_seconds=exit_grace,
    ))


COMMANDS = [serve]
