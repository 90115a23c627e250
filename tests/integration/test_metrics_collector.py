"""Metrics read from the ledger at scrape time, on every backend."""

from __future__ import annotations

from pathlib import Path

from quotagate import ManualClock, Quotagate
from quotagate.observability.metrics import Metrics
from quotagate.store import schema
from quotagate.store.counters import delivery_counters
from quotagate.store.engine import create_engine


def test_usage_queue_outbox_and_lease_gauges_come_from_the_tables(
    gate: Quotagate, clock: ManualClock
) -> None:
    gate.set_pool("main", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 1})
    gate.submit("one", "team-a", {"gpu": 1})
    clock.advance(10)
    gate.submit("two", "team-a", {"gpu": 1})
    clock.advance(5)
    admitted = gate.admit(4)
    assert [placement.id for placement in admitted] == ["one"]
    with gate.engine.begin() as connection:
        connection.execute(schema.outbox.update().values(attempts=3, last_error="refused"))
        connection.execute(schema.lease.insert().values(name="dispatcher", owner="w1",
                                                        generation=7, expires_at=0.0))
    metrics = Metrics(gate.engine, clock=clock)
    value = metrics.registry.get_sample_value
    assert value("quotagate_store_up") == 1
    assert value("quotagate_tenant_used", {"tenant": "team-a", "resource": "gpu"}) == 1
    assert value("quotagate_tenant_cap", {"tenant": "team-a", "resource": "gpu"}) == 1
    assert value("quotagate_pool_used", {"pool": "main", "resource": "gpu"}) == 1
    assert value("quotagate_pool_cap", {"pool": "main", "resource": "gpu"}) == 4
    assert value("quotagate_waiting_requests", {"tenant": "team-a"}) == 1
    assert value("quotagate_oldest_waiting_seconds", {"tenant": "team-a"}) == 5
    assert value("quotagate_outbox_backlog", {"tenant": "team-a"}) == 1
    assert value("quotagate_outbox_delivery_attempts", {"tenant": "team-a"}) == 3
    assert value("quotagate_outbox_delivery_failing", {"tenant": "team-a"}) == 1
    assert value("quotagate_lease_generation", {"lease": "dispatcher"}) == 7
    clock.advance(7200)
    gate.expire()
    assert value("quotagate_expired_requests_total", {"tenant": "team-a"}) == 1
    assert value("quotagate_waiting_requests", {"tenant": "team-a"}) is None


def test_in_process_counters_and_the_admission_wait(gate: Quotagate, clock: ManualClock) -> None:
    metrics = Metrics(gate.engine, clock=clock)
    gate.set_pool("main", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 4})
    gate.submit("one", "team-a", {"gpu": 1})
    clock.advance(2.5)
    admitted = gate.admit(1)
    metrics.record_admissions(admitted, {"one": clock.now() - 2.5}, clock.now())
    value = metrics.registry.get_sample_value
    assert value("quotagate_admissions_total", {"tenant": "team-a", "pool": "main"}) == 1
    assert value("quotagate_admission_wait_seconds_sum", {"tenant": "team-a"}) == 2.5
    # Two apps in one process keep separate registries.
    assert Metrics(gate.engine).registry.get_sample_value(
        "quotagate_admissions_total", {"tenant": "team-a", "pool": "main"}
    ) is None


def test_a_scrape_says_the_store_is_down_instead_of_failing() -> None:
    # Nothing listens on port 1: every connection attempt is refused at once.
    engine = create_engine("postgresql://nobody@127.0.0.1:1/none",
                           connect_args={"connect_timeout": 2})
    try:
        metrics = Metrics(engine)
        text = metrics.exposition().decode()
    finally:
        engine.dispose()
    assert "quotagate_store_up 0.0" in text
    assert "quotagate_tenant_used" not in text


def test_the_apps_delivery_counters_are_exported_and_only_its_own(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    counters, other = delivery_counters(), delivery_counters()
    metrics = Metrics(engine, delivery_counters=counters)
    value = metrics.registry.get_sample_value
    assert value("quotagate_stale_generation_rejections_total") == 0
    counters.increment("stale_writes")
    counters.increment("delivery_errors", 2)
    other.increment("stale_writes", 5)  # another app in this process: not ours to export
    assert value("quotagate_stale_generation_rejections_total") == 1
    assert value("quotagate_delivery_failures_total") == 2
    engine.dispose()
