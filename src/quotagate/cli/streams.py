"""Stream commands: ``quotagate topic …`` (the ledger side) and ``quotagate stream …`` (Redis).

Every command takes ``--redis URL`` (or ``$QUOTAGATE_REDIS``) for the shared
stream Redis, besides ``--db`` for the ledger; a tenant mapped to a Redis of
its own (``quotagate tenant set T --redis URL``) is found through the ledger.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from quotagate.cli.common import (
    db_option,
    echo_json,
    ensure_schema,
    open_gate,
    render_table,
    reports_errors,
)
from quotagate.cli.rate import describe_rate, rate_store_option
from quotagate.cli.stop_signals import stop_on_signals
from quotagate.domain.bucket import parse_rate
from quotagate.domain.help_defaults import DEFAULT_REDIS_URL as DEFAULT_URL
from quotagate.domain.help_defaults import REDIS_VARIABLE as ENVIRONMENT_VARIABLE

if TYPE_CHECKING:
    from quotagate.streams.consumer import Entry

redis_option = click.option(
    "--redis", "redis_url", envvar=ENVIRONMENT_VARIABLE, default=None, metavar="URL",
    help=f"The stream Redis: redis://HOST:PORT/DB or redis+cluster://HOST:PORT (default "
    f"{DEFAULT_URL}). Also ${ENVIRONMENT_VARIABLE}.",
)
tenant_option = click.option("--tenant", required=True, help="The tenant that owns the topic.")

_PRODUCE_BATCH = 500


@click.group()
def topic() -> None:
    """A tenant's topics: partitions and parallelism charged to its quota (docs/streams.md)."""


@topic.command("create")
@click.argument("name")
@tenant_option
@click.option("--partitions", type=int, required=True, help="Partitions (charged: 'partitions').")
@click.option("--parallelism", type=int, required=True,
              help="Most consumers of one group at a time (charged: 'parallelism').")
@click.option("--max-len", type=int, default=None,
              help="Trim each partition to about this many entries (at most the tenant's "
              "--stream-max-len; default that limit).")
@click.option("--rate", default=None, metavar="capacity=N,refill=R",
              help="Producer rate quota: the token bucket TENANT:TOPIC.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@redis_option
@rate_store_option
@reports_errors
def topic_create(
    name: str, tenant: str, partitions: int, parallelism: int, max_len: int | None,
    rate: str | None, as_json: bool, db_url: str | None, redis_url: str | None,
    rate_store: str | None,
) -> None:
    """Create topic NAME for a tenant; over quota nothing is created."""
    bucket = parse_rate(rate) if rate is not None else None
    with open_gate(db_url, redis=redis_url, rate_store=rate_store) as gate:
        ensure_schema(gate)
        spec = gate.streams.create_topic(tenant, name, partitions=partitions,
                                         parallelism=parallelism, max_len=max_len, rate=bucket,
                                         actor="cli")
    if as_json:
        echo_json(spec.to_dict())
    else:
        click.echo(f"topic {tenant}/{name}: {spec.partitions} partitions, parallelism "
                   f"{spec.parallelism}, max length {spec.max_len or 'unlimited'}")


@topic.command("list")
@click.option("--tenant", default=None, help="Only this tenant's topics.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@reports_errors
def topic_list(tenant: str | None, as_json: bool, db_url: str | None) -> None:
    """List topics (of every tenant, or of one)."""
    with open_gate(db_url) as gate:
        specs = gate.streams.list_topics(tenant)
    if as_json:
        echo_json([spec.to_dict() for spec in specs])
        return
    click.echo(render_table(["tenant", "topic", "partitions", "parallelism", "max_len"], [
        [spec.tenant, spec.name, spec.partitions, spec.parallelism, spec.max_len]
        for spec in specs]))


@topic.command("show")
@click.argument("name")
@tenant_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@rate_store_option
@reports_errors
def topic_show(name: str, tenant: str, as_json: bool, db_url: str | None,
               rate_store: str | None) -> None:
    """Show a topic's spec and its producer rate quota."""
    with open_gate(db_url, rate_store=rate_store) as gate:
        spec = gate.streams.topic(tenant, name)
        rate = gate.rate_status(tenant, topic=name)
    if as_json:
        echo_json({**spec.to_dict(), "rate": rate})
        return
    click.echo(f"topic {tenant}/{name}: {spec.partitions} partitions, parallelism "
               f"{spec.parallelism}, max length {spec.max_len or 'unlimited'}")
    click.echo(describe_rate(rate))


@topic.command("delete")
@click.argument("name")
@tenant_option
@db_option
@redis_option
@rate_store_option
@reports_errors
def topic_delete(name: str, tenant: str, db_url: str | None, redis_url: str | None,
                 rate_store: str | None) -> None:
    """Delete a topic and its streams; its quota comes back once."""
    with open_gate(db_url, redis=redis_url, rate_store=rate_store) as gate:
        spec = gate.streams.delete_topic(tenant, name, actor="cli")
    click.echo(f"topic {tenant}/{name} deleted: returned partitions={spec.partitions}, "
               f"parallelism={spec.parallelism}")


@click.group()
def stream() -> None:
    """Produce to, consume from and inspect a tenant's topic (docs/streams.md)."""


def _stdin_lines() -> Iterator[bytes]:
    # Bytes as they come: a message need not be UTF-8 (Redis keeps bytes).
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\n")


@stream.command("produce")
@tenant_option
@click.option("--topic", "topic_name", required=True)
@click.option("--key", default=None, help="Partition key (default: round robin).")
@click.option("--block", is_flag=True, help="Wait for the rate quota instead of failing.")
@click.option("--timeout", type=click.FloatRange(0), default=10.0, show_default=True,
              help="With --block: the longest wait.")
@click.argument("data", nargs=-1)
@db_option
@redis_option
@rate_store_option
@reports_errors
def stream_produce(
    tenant: str, topic_name: str, key: str | None, block: bool, timeout: float,
    data: tuple[str, ...], db_url: str | None, redis_url: str | None, rate_store: str | None,
) -> None:
    """Append one message per DATA argument, or per stdin line with '-' or no DATA.
    Messages are bytes: text is sent as its UTF-8, anything else as it is.

    Refused by the rate quota: exit 5, and what was sent before stays sent.
    """
    # Arguments as the bytes the shell passed (os.fsencode undoes Python's decoding).
    messages: Any = (_stdin_lines() if not data or data == ("-",)
                     else (os.fsencode(argument) for argument in data))
    produced = 0
    with open_gate(db_url, redis=redis_url, rate_store=rate_store) as gate:
        producer = gate.streams.producer(tenant, topic_name, block=block, timeout=timeout)
        from quotagate.streams.producer import MAX_BATCH  # loaded already, with the producer

        batch_size = min(_PRODUCE_BATCH, MAX_BATCH)
        try:
            while True:
                batch = [(line, key) for _, line in zip(range(batch_size), messages,
                                                        strict=False)]
                if not batch:
                    break
                produced += len(producer.send_many(batch))
        finally:
            click.echo(f"produced {produced} to {tenant}/{topic_name}", err=True)


def _command_handler(command: str) -> Any:
    def handle(entry: Entry) -> None:
        environment = {**os.environ, "QG_STREAM_ID": entry.id,
                       "QG_STREAM_PARTITION": str(entry.partition),
                       "QG_STREAM_KEY": entry.key or ""}
        result = subprocess.run(command, shell=True, input=entry.data, env=environment,
                                capture_output=True, check=False)
        if result.returncode != 0:
            tail = result.stderr.decode(errors="replace").strip()[-300:]
            raise RuntimeError(f"exit {result.returncode}: {tail}")

    return handle


def _print_handler(entry: Entry) -> None:
    sys.stdout.buffer.write(entry.data + b"\n")  # the bytes as produced
    sys.stdout.flush()


@stream.command("consume")
@tenant_option
@click.option("--topic", "topic_name", required=True)
@click.option("--group", required=True, help="Consumer group: each entry is acked once per group.")
@click.option("--name", required=True, help="This consumer's name within the group.")
@click.option("--print", "print_data", is_flag=True, help="Write each message's data as one line.")
@click.option("--command", default=None,
              help="Run this shell command per message, data on stdin (QG_STREAM_ID, "
              "QG_STREAM_PARTITION, QG_STREAM_KEY set); exit 0 acks, anything else fails it.")
@click.option("--until-idle", is_flag=True,
              help="Exit 0 once the partitions had nothing new or pending for about a second.")
@click.option("--batch", type=click.IntRange(1, 10000), default=100, show_default=True)
@click.option("--lease-ttl", type=click.FloatRange(0.1), default=3.0, show_default=True,
              help="Seconds a dead consumer's partitions stay locked before a takeover.")
@click.option("--visibility-timeout", type=click.FloatRange(0.01), default=30.0,
              show_default=True, help="Seconds before a failed or unacked entry is redelivered.")
@click.option("--max-deliveries", type=click.IntRange(1), default=5, show_default=True,
              help="Deliveries before an entry goes to the DLQ.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve this consumer's stream counters on http://HOST:PORT/metrics.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="With --metrics-port: the address to listen on.")
@db_option
@redis_option
@reports_errors
def stream_consume(
    tenant: str, topic_name: str, group: str, name: str, print_data: bool, command: str | None,
    until_idle: bool, batch: int, lease_ttl: float, visibility_timeout: float,
    max_deliveries: int, metrics_port: int | None, metrics_host: str, db_url: str | None,
    redis_url: str | None,
) -> None:
    """Consume a topic as one member of a group, until SIGTERM (or idle)."""
    if print_data == (command is not None):
        raise click.UsageError("give exactly one of --print and --command")
    handler = _print_handler if print_data else _command_handler(command or "")
    stop = threading.Event()
    stop_on_signals(stop)
    with open_gate(db_url, redis=redis_url) as gate, gate.streams.consumer(
        tenant, topic_name, group, name, batch=batch, lease_ttl=lease_ttl,
        visibility_timeout=visibility_timeout, max_deliveries=max_deliveries,
    ) as consumer:
        stop_metrics = _serve_metrics(metrics_host, metrics_port)
        try:
            acked = consumer.run(handler, stop=stop, until_idle=1.0 if until_idle else None)
        finally:
            stop_metrics()
        for refusal in consumer.refusals:
            click.echo(f"refused: {refusal.code}: {refusal.message}", err=True)
        failures, dead_lettered = consumer.failures, consumer.dead_lettered
    # "acked 0" alone hid a handler that failed every entry into the DLQ.
    click.echo(f"acked {acked}, failed {failures}, dead-lettered {dead_lettered}", err=True)


def _serve_metrics(host: str, port: int | None) -> Callable[[], None]:
    if port is None:
        return lambda: None
    from quotagate.observability.metrics import serve_stream_metrics  # needs prometheus-client

    stop = serve_stream_metrics(host, port)
    click.echo(f"metrics on http://{host}:{port}/metrics", err=True)
    return stop


@stream.command("status")
@tenant_option
@click.option("--topic", "topic_name", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@redis_option
@reports_errors
def stream_status(tenant: str, topic_name: str, as_json: bool, db_url: str | None,
                  redis_url: str | None) -> None:
    """Per partition: length, pending, lag, frontier, owner and generation; DLQ size."""
    with open_gate(db_url, redis=redis_url) as gate:
        status = gate.streams.status(tenant, topic_name)
    if as_json:
        echo_json(status.to_dict())
        return
    rows: list[list[Any]] = []
    for partition in status.partitions:
        if not partition.groups:
            rows.append([partition.partition, partition.length, partition.trimmed, "", "", "",
                         "", "", ""])
        for group in partition.groups:
            rows.append([partition.partition, partition.length, partition.trimmed, group.group,
                         group.pending, group.lag, group.frontier, group.owner,
                         group.generation])
    click.echo(render_table(["partition", "length", "trimmed", "group", "pending", "lag",
                             "frontier", "owner", "generation"], rows))
    click.echo(f"dlq: {status.dlq_length}")


COMMANDS = [topic, stream]
