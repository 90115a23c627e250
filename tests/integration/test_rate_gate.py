"""The rate gate on the real submit path, on every ledger database, with both rate stores.

``ledger``: buckets in the ledger database (the default; the take commits with
the request row). ``redis``: buckets in a throwaway Redis of these tests' own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from quotagate import (
    InvalidInput,
    ManualClock,
    NotFound,
    Quotagate,
    RateLimited,
    RequestState,
)
from quotagate.cli.main import cli
from quotagate.errors import Conflict
from quotagate.rate.redis import RedisRateStore
from quotagate.store import schema
from support.redis_servers import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(params=["ledger", "redis"])
def rate_store_url(request: pytest.FixtureRequest) -> str | None:
    if request.param != "redis":
        return None
    # Only the Redis cases need redis-server: without it they skip (fail with
    # CI=true), and the ledger cases still run.
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def rated(db_url: str, clock: ManualClock, rate_store_url: str | None) -> Iterator[Quotagate]:
    with Quotagate.connect(db_url, clock=clock, rate_store=rate_store_url) as gate:
        if isinstance(gate.rate_store, RedisRateStore):
            gate.rate_store.client.flushall()
        gate.set_pool("pool-1", {"gpu": 100})
        for tenant in ("tenant-a", "tenant-b"):
            gate.set_tenant(tenant, {"gpu": 100})
        yield gate


def tokens(gate: Quotagate, tenant: str) -> float:
    status = gate.rate_status(tenant)
    assert status is not None
    return float(status["tokens"])


def audit_outcomes(gate: Quotagate, request_id: str) -> list[tuple[str, str, str | None]]:
    audit = schema.audit
    with gate.engine.connect() as connection:
        rows = connection.execute(
            sa.select(audit.c.operation, audit.c.outcome, audit.c.reason)
            .where(audit.c.target == request_id).order_by(audit.c.id)
        ).all()
    return [(row.operation, row.outcome, row.reason) for row in rows]


def outbox_rows(gate: Quotagate, request_id: str) -> int:
    with gate.engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(schema.outbox)
            .where(schema.outbox.c.request_id == request_id)
        ).scalar_one())


def test_a_rejected_request_is_recovered_after_a_top_up(rated: Quotagate) -> None:
    rated.set_rate("tenant-a", {"capacity": 5, "refill_per_second": 0})
    for index in range(5):
        assert rated.submit(f"job-{index}", "tenant-a", {"gpu": 1}).created
    with pytest.raises(RateLimited) as refused:
        rated.submit("job-blocked", "tenant-a", {"gpu": 1})
    assert refused.value.code == "rate_quota_exhausted"
    assert refused.value.retry_after > 0
    assert refused.value.fields["tokens_left"] == 0
    blocked = rated.show("job-blocked")
    assert blocked.state == RequestState.REJECTED
    assert blocked.reason == "rate quota exhausted: 0 tokens left"
    # Recorded, with an audit entry, and no business effect: never admitted, no outbox row.
    assert audit_outcomes(rated, "job-blocked") == [
        ("submit", "rejected", "rate quota exhausted: 0 tokens left")]
    assert rated.admit_until_idle() == 5
    assert rated.show("job-blocked").state == RequestState.REJECTED
    assert outbox_rows(rated, "job-blocked") == 0
    assert tokens(rated, "tenant-a") == 0  # the refusal took no token

    rated.add_tokens("tenant-a", 3)
    recovered = rated.submit("job-blocked", "tenant-a", {"gpu": 1})
    assert recovered.created
    assert recovered.request.state == RequestState.WAITING
    assert recovered.request.reason is None
    assert tokens(rated, "tenant-a") == 2  # 3 added, 1 taken by the recovered submit
    assert rated.show("job-blocked").state == RequestState.WAITING
    assert audit_outcomes(rated, "job-blocked")[-1] == ("submit", "accepted", None)
    assert rated.admit_until_idle() == 1  # the recovered request, like any other
    assert rated.check_invariants() == []


@pytest.mark.parametrize(("capacity", "accepted_each"), [(5, 3), (2, 2)])
def test_six_threads_through_the_submit_path(
    rated: Quotagate, capacity: int, accepted_each: int
) -> None:
    """6 threads, 2 tenants x 3 requests: grants per tenant = min(3, capacity), no interference."""
    for tenant in ("tenant-a", "tenant-b"):
        rated.set_rate(tenant, {"capacity": capacity, "refill_per_second": 0})
    barrier = threading.Barrier(6)
    outcomes: dict[str, list[str]] = {"tenant-a": [], "tenant-b": []}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def submit(tenant: str, index: int) -> None:
        try:
            barrier.wait(timeout=30)
            try:
                state = rated.submit(f"{tenant}-{index}", tenant, {"gpu": 1}).request.state.value
            except RateLimited:
                state = "rate-limited"
            with lock:
                outcomes[tenant].append(state)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=submit, args=(tenant, index))
               for tenant in ("tenant-a", "tenant-b") for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    for tenant in ("tenant-a", "tenant-b"):
        assert sorted(outcomes[tenant]) == sorted(
            ["waiting"] * accepted_each + ["rate-limited"] * (3 - accepted_each))
        assert tokens(rated, tenant) == capacity - accepted_each
        states = [rated.show(f"{tenant}-{index}").state for index in range(3)]
        assert states.count(RequestState.REJECTED) == 3 - accepted_each


def test_identical_replay_of_an_accepted_request_takes_no_token(rated: Quotagate) -> None:
    rated.set_rate("tenant-a", "capacity=2,refill=0")
    first = rated.submit("job-1", "tenant-a", {"gpu": 1}, payload={"x": 1})
    for _ in range(3):
        again = rated.submit("job-1", "tenant-a", {"gpu": 1}, payload={"x": 1})
        assert not again.created
        assert again.request == first.request
    assert tokens(rated, "tenant-a") == 1
    with pytest.raises(Conflict):
        rated.submit("job-1", "tenant-a", {"gpu": 2}, payload={"x": 1})
    assert tokens(rated, "tenant-a") == 1


def test_everything_is_validated_before_a_token_is_taken(rated: Quotagate) -> None:
    rated.set_rate("tenant-a", "capacity=1,refill=0")
    with pytest.raises(InvalidInput):
        rated.submit("job-1", "tenant-a", {"tpu": 1})  # no pool offers it
    with pytest.raises(NotFound):
        rated.submit("job-1", "tenant-a", {"gpu": 1}, target="nowhere")
    with pytest.raises(NotFound):
        rated.submit("job-1", "tenant-zzz", {"gpu": 1})
    assert tokens(rated, "tenant-a") == 1
    with pytest.raises(NotFound):
        rated.show("job-1")
    assert rated.submit("job-1", "tenant-a", {"gpu": 1}).created


def test_a_rejected_request_submitted_with_changes_is_a_conflict(rated: Quotagate) -> None:
    rated.set_rate("tenant-a", "capacity=1,refill=0")
    rated.submit("job-1", "tenant-a", {"gpu": 1})
    with pytest.raises(RateLimited):
        rated.submit("job-2", "tenant-a", {"gpu": 1}, priority=3)
    rated.add_tokens("tenant-a", 1)
    with pytest.raises(Conflict):
        rated.submit("job-2", "tenant-a", {"gpu": 1}, priority=4)
    assert rated.show("job-2").state == RequestState.REJECTED
    assert tokens(rated, "tenant-a") == 1
    # Refused again while empty: still rejected, still recoverable.
    rated.submit("job-2", "tenant-a", {"gpu": 1}, priority=3)
    with pytest.raises(RateLimited):
        rated.submit("job-3", "tenant-a", {"gpu": 1})
    with pytest.raises(RateLimited):
        rated.submit("job-3", "tenant-a", {"gpu": 1})
    assert rated.show("job-3").state == RequestState.REJECTED


def test_tenants_without_a_bucket_are_not_rate_limited(rated: Quotagate) -> None:
    rated.set_rate("tenant-a", "capacity=1,refill=0")
    for index in range(5):
        assert rated.submit(f"b-{index}", "tenant-b", {"gpu": 1}).created
    assert rated.rate_status("tenant-b") is None
    assert rated.set_rate("tenant-a", None) is None
    for index in range(3):
        assert rated.submit(f"a-{index}", "tenant-a", {"gpu": 1}).created
    with pytest.raises(NotFound):
        rated.add_tokens("tenant-a", 1)


def test_a_submission_that_fails_after_its_take_gives_the_token_back(
    rated: Quotagate, monkeypatch: pytest.MonkeyPatch
) -> None:
    rated.set_rate("tenant-a", "capacity=3,refill=0")
    import quotagate.store.ledger as ledger_module

    real_record = ledger_module.record

    def failing_record(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(ledger_module, "record", failing_record)
    with pytest.raises(RuntimeError):
        rated.submit("job-1", "tenant-a", {"gpu": 1})
    monkeypatch.setattr(ledger_module, "record", real_record)
    assert tokens(rated, "tenant-a") == 3
    with pytest.raises(NotFound):
        rated.show("job-1")
    assert rated.submit("job-1", "tenant-a", {"gpu": 1}).created
    assert tokens(rated, "tenant-a") == 2


def test_bad_rate_configurations_change_nothing(rated: Quotagate) -> None:
    rated.set_rate("tenant-a", "capacity=4,refill=1")
    for bad in ({"capacity": -1}, {"capacity": 5, "refill_per_second": -2}, "capacity=x",
                {"capacity": 5, "burst": 1}, "junk"):
        with pytest.raises(InvalidInput):
            rated.set_rate("tenant-a", bad)  # type: ignore[arg-type]
    status = rated.rate_status("tenant-a")
    assert status is not None
    assert (status["capacity"], status["refill_per_second"]) == (4, 1)
    with pytest.raises(NotFound):
        rated.set_rate("no-such-tenant", "capacity=1")
    with pytest.raises(InvalidInput):
        rated.add_tokens("tenant-a", 0)


def test_cli_rate_commands_and_exit_code(
    rated: Quotagate, db_url: str, rate_store_url: str | None
) -> None:
    runner = CliRunner()
    env = {"QUOTAGATE_DB": db_url, "QUOTAGATE_RATE_STORE": rate_store_url or ""}

    def run(*args: str) -> Any:
        return runner.invoke(cli, list(args), env=env, catch_exceptions=False)

    result = run("tenant", "set", "team-c", "--quota", "gpu=2", "--rate", "capacity=-1")
    assert result.exit_code == 2
    assert "rate capacity must be" in result.output
    assert "team-c" not in run("tenant", "list").output  # nothing was created

    result = run("tenant", "set", "team-c", "--quota", "gpu=10", "--rate", "capacity=1,refill=0")
    assert result.exit_code == 0, result.output
    assert "1 of 1 tokens left" in result.output
    assert run("submit", "--id", "c-1", "--tenant", "team-c", "--cost", "gpu=1").exit_code == 0
    refused = run("submit", "--id", "c-2", "--tenant", "team-c", "--cost", "gpu=1")
    assert refused.exit_code == 5
    assert "rate_quota_exhausted" in refused.output
    assert "retry after" in refused.output
    assert "rejected" in run("show", "c-2").output
    result = run("rate", "add", "team-c", "3")
    assert result.exit_code == 0, result.output
    assert "1 of 1 tokens left" in result.output  # capped at capacity
    assert "added up to 3; the bucket is full (its capacity is 1)" in result.output
    assert run("submit", "--id", "c-2", "--tenant", "team-c", "--cost", "gpu=1").exit_code == 0
    shown = run("tenant", "show", "team-c")
    assert "rate: 0 of 1 tokens left" in shown.output
    assert '"tokens": 0' in run("tenant", "show", "team-c", "--json").output
    assert run("rate", "add", "team-c", "-1").exit_code == 2

    # `rate set` reshapes the bucket like `tenant set --rate`; a bad spec changes nothing.
    result = run("rate", "set", "team-c", "capacity=4,refill=0")
    assert result.exit_code == 0, result.output
    assert "of 4 tokens left" in result.output
    assert run("rate", "set", "team-c", "capacity=-3").exit_code == 2
    assert '"capacity": 4' in run("rate", "show", "team-c", "--json").output
    assert "no rate quota" in run("rate", "set", "team-c", "none").output
    assert "no rate quota" in run("rate", "show", "team-c").output
    # A topic's bucket is named as one: its line read like the tenant's own bucket's.
    topic_line = run("rate", "set", "team-c", "capacity=7,refill=0", "--topic", "orders").output
    assert topic_line.startswith("rate of topic orders: 7 of 7 tokens left")
    assert run("rate", "show", "team-c", "--topic", "orders").output.startswith(
        "rate of topic orders: 7 of 7 tokens left")
    assert run("rate", "show", "team-c").output.startswith("rate: no rate quota")
    # The old names are gone: `tokens` was the rate bucket, `token` an API credential.
    assert run("tokens", "add", "team-c", "1").exit_code == 2
    assert run("token", "list").exit_code == 2
