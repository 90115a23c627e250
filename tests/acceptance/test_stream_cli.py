"""The stream commands as a user runs them: one subprocess per command (SQLite ledger)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import redis

from quotagate.streams.keys import StreamKeys
from support.cli import QUOTAGATE, run
from support.http_servers import free_port
from support.redis_servers import RedisServer
from support.streams import new_tenant
from support.waiting import wait_for


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    run("init", db=url, cwd=tmp_path)
    return url


def one_partition_tenant(db: str, cwd: Path) -> str:
    """A new tenant with room for one partition read by one consumer; its name."""
    tenant = new_tenant()
    run("tenant", "set", tenant, "--quota", "partitions=1", "--quota", "parallelism=1",
        db=db, cwd=cwd)
    return tenant


def create_one_partition_topic(tenant: str, topic: str, *options: str, db: str, cwd: Path,
                               env: dict[str, str] | None = None) -> None:
    run("topic", "create", topic, "--tenant", tenant, "--partitions", "1", "--parallelism",
        "1", *options, db=db, cwd=cwd, env=env)


def test_topic_produce_consume_status_and_delete(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis = new_tenant(), ["--redis", private_redis.url]
    run("tenant", "set", tenant, "--quota", "partitions=4", "--quota", "parallelism=2",
        "--stream-max-len", "1000", db=db, cwd=tmp_path)
    created = run("topic", "create", "orders", "--tenant", tenant, "--partitions", "2",
                  "--parallelism", "1", *redis, db=db, cwd=tmp_path)
    assert "max length 1000" in created.stdout
    refused = run("topic", "create", "more", "--tenant", tenant, "--partitions", "3",
                  "--parallelism", "1", *redis, db=db, cwd=tmp_path, expect=3)
    assert "error: topic_quota_exceeded:" in refused.stderr
    run("stream", "produce", "--tenant", tenant, "--topic", "orders", "one", "two", *redis,
        db=db, cwd=tmp_path)
    consumed = run("stream", "consume", "--tenant", tenant, "--topic", "orders", "--group", "g",
                   "--name", "c1", "--print", "--until-idle", *redis, db=db, cwd=tmp_path)
    assert sorted(consumed.stdout.split()) == ["one", "two"]
    assert "acked 2" in consumed.stderr
    status = json.loads(run("stream", "status", "--tenant", tenant, "--topic", "orders",
                            "--json", *redis, db=db, cwd=tmp_path).stdout)
    assert sum(p["length"] for p in status["partitions"]) == 2
    # The consumer released its leases on exit: no owner, the generation stays.
    assert all(g["pending"] == 0 and g["generation"] == 1 and g["owner"] is None
               for p in status["partitions"] for g in p["groups"])
    table = run("stream", "status", "--tenant", tenant, "--topic", "orders", *redis, db=db,
                cwd=tmp_path).stdout
    assert "frontier" in table and "dlq: 0" in table
    listed = run("topic", "list", "--json", db=db, cwd=tmp_path).stdout
    assert [t["topic"] for t in json.loads(listed) if t["tenant"] == tenant] == ["orders"]
    run("topic", "delete", "orders", "--tenant", tenant, *redis, db=db, cwd=tmp_path)
    run("topic", "show", "orders", "--tenant", tenant, db=db, cwd=tmp_path, expect=4)
    assert run("check", db=db, cwd=tmp_path).returncode == 0


def test_produce_from_stdin_and_a_rate_refusal_exits_5(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis = one_partition_tenant(db, tmp_path), ["--redis", private_redis.url]
    create_one_partition_topic(tenant, "orders", "--rate", "capacity=3,refill=0", *redis,
                               db=db, cwd=tmp_path)
    result = subprocess.run(
        [*QUOTAGATE, "stream", "produce", "--tenant", tenant, "--topic", "orders", "--db", db,
         *redis, "-"], input="a\nb\n", capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    refused = run("stream", "produce", "--tenant", tenant, "--topic", "orders", "c", "d",
                  *redis, db=db, cwd=tmp_path, expect=5)
    assert "error: rate_quota_exhausted:" in refused.stderr and "produced 0" in refused.stderr


def test_messages_that_are_not_utf8_go_through_as_bytes(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis_option = one_partition_tenant(db, tmp_path), ["--redis", private_redis.url]
    create_one_partition_topic(tenant, "raw", *redis_option, db=db, cwd=tmp_path)
    produce = [*QUOTAGATE, "stream", "produce", "--tenant", tenant, "--topic", "raw", "--db", db,
               *redis_option]
    piped = subprocess.run([*produce, "-"], input=b"ok\n\xff\xfe\n", capture_output=True,
                           cwd=tmp_path, timeout=60)
    assert piped.returncode == 0, piped.stderr
    argument = subprocess.run([*produce, os.fsdecode(b"a\xffb"), "h\u00e9llo"],
                              capture_output=True, cwd=tmp_path, timeout=60)
    assert argument.returncode == 0, argument.stderr
    consumed = subprocess.run(
        [*QUOTAGATE, "stream", "consume", "--tenant", tenant, "--topic", "raw", "--group", "g",
         "--name", "c1", "--print", "--until-idle", "--db", db, *redis_option],
        capture_output=True, cwd=tmp_path, timeout=120)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == b"ok\n\xff\xfe\na\xffb\nh\xc3\xa9llo\n"


def test_a_failing_command_sends_the_entry_to_the_dlq(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis = one_partition_tenant(db, tmp_path), ["--redis", private_redis.url]
    create_one_partition_topic(tenant, "orders", *redis, db=db, cwd=tmp_path)
    run("stream", "produce", "--tenant", tenant, "--topic", "orders", "good", "bad", *redis,
        db=db, cwd=tmp_path)
    script = "read line; [ \"$line\" = good ] || { echo \"no: $line\" >&2; exit 3; }"
    run("stream", "consume", "--tenant", tenant, "--topic", "orders", "--group", "g", "--name",
        "c1", "--command", script, "--until-idle", "--visibility-timeout", "0.1",
        "--max-deliveries", "2", *redis, db=db, cwd=tmp_path)
    status = json.loads(run("stream", "status", "--tenant", tenant, "--topic", "orders",
                            "--json", *redis, db=db, cwd=tmp_path).stdout)
    assert status["dlq_length"] == 1
    assert status["partitions"][0]["groups"][0]["pending"] == 0


def test_bad_input_is_refused_with_a_code(db: str, tmp_path: Path) -> None:
    tenant = new_tenant()
    run("tenant", "set", tenant, "--stream-max-len", "lots", db=db, cwd=tmp_path, expect=2)
    run("tenant", "set", tenant, "--quota", "partitions=1", db=db, cwd=tmp_path)
    bad = run("topic", "create", "a:b", "--tenant", tenant, "--partitions", "1",
              "--parallelism", "1", db=db, cwd=tmp_path, expect=2)
    assert "error: invalid_topic:" in bad.stderr


def test_the_stream_redis_comes_from_quotagate_redis(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, env = one_partition_tenant(db, tmp_path), {"QUOTAGATE_REDIS": private_redis.url}
    create_one_partition_topic(tenant, "orders", db=db, cwd=tmp_path, env=env)
    run("stream", "produce", "--tenant", tenant, "--topic", "orders", "hello", db=db,
        cwd=tmp_path, env=env)
    client = redis.Redis.from_url(private_redis.url)
    assert client.xlen(StreamKeys(tenant).partition("orders", 0)) == 1
    client.close()
    status = json.loads(run("stream", "status", "--tenant", tenant, "--topic", "orders",
                            "--json", db=db, cwd=tmp_path, env=env).stdout)
    assert status["partitions"][0]["length"] == 1


def test_tenant_stream_settings_refused_change_nothing(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis_option = one_partition_tenant(db, tmp_path), ["--redis", private_redis.url]

    def state() -> tuple[object, object, int]:
        shown = json.loads(run("tenant", "show", tenant, "--json", db=db, cwd=tmp_path).stdout)
        audit = json.loads(run("audit", "--tenant", tenant, "--json", db=db, cwd=tmp_path).stdout)
        return shown["quota"], shown["streams"], len(audit)

    before = state()
    bad = run("tenant", "set", tenant, "--quota", "partitions=9", "--redis", "http://x",
              db=db, cwd=tmp_path, expect=2)
    assert "error: invalid_redis_url:" in bad.stderr
    run("tenant", "set", tenant, "--quota", "partitions=9", "--stream-max-len", "0", db=db,
        cwd=tmp_path, expect=2)
    assert state() == before
    # A quota change refused after the stream settings were judged fine: neither lands.
    unknown = run("tenant", "set", tenant, "--stream-max-len", "50", "--cohort", "no-such",
                  db=db, cwd=tmp_path, expect=4)
    assert "no-such" in unknown.stderr
    assert state() == before
    create_one_partition_topic(tenant, "orders", *redis_option, db=db, cwd=tmp_path)
    before = state()
    moved = run("tenant", "set", tenant, "--quota", "partitions=9", "--redis",
                "redis://127.0.0.1:6390/0", db=db, cwd=tmp_path, expect=3)
    assert "error: tenant_has_topics:" in moved.stderr
    assert state() == before


def test_a_consumer_process_serves_its_stream_counters(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis_option = one_partition_tenant(db, tmp_path), ["--redis", private_redis.url]
    create_one_partition_topic(tenant, "orders", *redis_option, db=db, cwd=tmp_path)
    port = free_port()
    consumer = subprocess.Popen(
        [*QUOTAGATE, "stream", "consume", "--tenant", tenant, "--topic", "orders", "--group",
         "g", "--name", "c1", "--print", "--metrics-port", str(port), "--db", db,
         *redis_option], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        run("stream", "produce", "--tenant", tenant, "--topic", "orders", "a", "b", "c",
            *redis_option, db=db, cwd=tmp_path)
        acked = f'quotagate_stream_acked_total{{tenant="{tenant}",topic="orders"}} 3.0'

        def counted() -> bool:
            try:
                return acked in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.TransportError:
                return False  # not listening yet

        wait_for(counted, "the consumer's /metrics to count 3 acks", timeout=60)
    finally:
        consumer.send_signal(signal.SIGTERM)
        out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert out.split() == ["a", "b", "c"] and "acked 3" in err
    taken = run("stream", "consume", "--tenant", tenant, "--topic", "orders", "--group", "g",
                "--name", "c2", "--print", "--until-idle", "--metrics-port", str(port),
                *redis_option, db=db, cwd=tmp_path)  # the port is free again after SIGTERM
    assert "acked 0" in taken.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        refused = run("stream", "consume", "--tenant", tenant, "--topic", "orders", "--group",
                      "g", "--name", "c3", "--print", "--until-idle", "--metrics-port",
                      str(busy.getsockname()[1]), *redis_option, db=db, cwd=tmp_path, expect=2)
    assert "error: metrics_port_unavailable:" in refused.stderr


def test_consume_says_how_many_failed_and_went_to_the_dlq(
    db: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant, redis = one_partition_tenant(db, tmp_path), ["--redis", private_redis.url]
    create_one_partition_topic(tenant, "orders", *redis, db=db, cwd=tmp_path)
    run("stream", "produce", "--tenant", tenant, "--topic", "orders", "bad", *redis,
        db=db, cwd=tmp_path)
    consumed = run("stream", "consume", "--tenant", tenant, "--topic", "orders", "--group", "g",
                   "--name", "c1", "--command", "exit 1", "--max-deliveries", "2",
                   "--visibility-timeout", "0.1", "--until-idle", *redis, db=db, cwd=tmp_path)
    # It used to say only "acked 0": a handler failing every entry looked like an idle topic.
    assert consumed.stderr.strip().endswith("acked 0, failed 2, dead-lettered 1"), consumed.stderr
    status = json.loads(run("stream", "status", "--tenant", tenant, "--topic", "orders",
                            "--json", *redis, db=db, cwd=tmp_path).stdout)
    assert status["dlq_length"] == 1
