"""The dashboard's views (quotagate.store.dashboard) and the read deadline, on every backend."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.domain.model import RequestState
from quotagate.errors import NotFound, RateLimited, StoreUnavailable
from quotagate.observability.metrics import Metrics
from quotagate.store import schema
from quotagate.store.dialect import reading
from quotagate.store.engine import create_engine
from support.holds import contested_hold
from support.streams import shared_redis_url, stream_gate, tenant_with_quota
from support.waiting import wait_for


def _busy_ledger(gate: Quotagate, clock: ManualClock) -> None:
    """Two tenants: three of team-a's and one of team-b's admitted, one waiting, one rejected."""
    gate.set_pool("main", {"gpu": 8})
    gate.set_tenant("team-a", {"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 2})
    gate.set_rate("team-b", "capacity=1,refill=0")
    gate.submit("a-1", "team-a", {"gpu": 1})
    gate.submit("a-2", "team-a", {"gpu": 1})
    gate.submit("a-3", "team-a", {"gpu": 1}, priority=5)
    gate.submit("b-1", "team-b", {"gpu": 1})
    with pytest.raises(RateLimited):
        gate.submit("b-2", "team-b", {"gpu": 1})
    clock.advance(60)
    admitted = gate.admit(10)
    assert sorted(placement.id for placement in admitted) == ["a-1", "a-3", "b-1"]


def test_the_snapshot_shows_usage_queue_reasons_decisions_backlog_and_buckets(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    snapshot = gate.dashboard()
    assert snapshot.tenant is None
    assert {(row.name, row.resource, row.used, row.cap) for row in snapshot.tenants} == {
        ("team-a", "gpu", 2, 2), ("team-b", "gpu", 1, 2)}
    assert [(row.name, row.used, row.cap) for row in snapshot.pools] == [("main", 3, 8)]
    assert snapshot.waiting == 1
    [waiting] = snapshot.queue
    assert (waiting.position, waiting.id, waiting.tenant) == (1, "a-2", "team-a")
    # The same reason `explain` gives for the same request.
    assert waiting.reason == gate.explain("a-2")["reason"]
    assert waiting.reason.startswith("tenant quota: gpu needs 1, 0 of 2 left")
    assert waiting.waited_seconds == 60
    assert snapshot.backlog == 3
    assert sorted(entry.request_id for entry in snapshot.deliveries) == ["a-1", "a-3", "b-1"]
    operations = [(entry.operation, entry.outcome, entry.target) for entry in snapshot.decisions]
    assert ("submit", "rejected", "b-2") in operations
    assert operations.index(("admit", "reserved", "a-1")) < operations.index(
        ("submit", "accepted", "a-1")), "newest first"
    rejected = next(entry for entry in snapshot.decisions if entry.outcome == "rejected")
    assert "rate quota" in (rejected.reason or "")
    [bucket] = snapshot.buckets
    assert (bucket.tenant, bucket.capacity, bucket.tokens) == ("team-b", 1.0, 0.0)


def test_the_last_hour_counts_admissions_and_rejections_and_replays_the_queue_depth(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    history = gate.dashboard().history
    assert len(history) == 60
    now, before, earlier = history[-1], history[-2], history[-3]
    assert now.minute == clock.now() // 60 * 60
    assert (now.admitted, now.rejected, now.queue_depth) == (3, 0, 1)
    # At the end of the minute before, all four accepted requests were waiting.
    assert (before.admitted, before.rejected, before.queue_depth) == (0, 1, 4)
    assert earlier.queue_depth == 0
    # Three minutes on, one more admission: the minutes read by earlier polls keep their
    # counts (they are not read again) and the new one joins them.
    clock.advance(180)
    gate.set_tenant("team-a", {"gpu": 3})
    assert [placement.id for placement in gate.admit(10)] == ["a-2"]
    later = gate.dashboard().history
    assert [(m.admitted, m.rejected, m.queue_depth) for m in later[-6:]] == [
        (0, 0, 0), (0, 1, 4), (3, 0, 1), (0, 0, 1), (0, 0, 1), (1, 0, 0)]
    assert later[-4].minute == now.minute


def test_a_tenant_scope_narrows_every_view_to_that_tenant(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    snapshot = gate.dashboard("team-b")
    assert {row.name for row in snapshot.tenants} == {"team-b"}
    assert snapshot.queue == [] and snapshot.waiting == 0
    assert {entry.tenant for entry in snapshot.decisions} == {"team-b"}
    assert [entry.request_id for entry in snapshot.deliveries] == ["b-1"]
    assert [bucket.tenant for bucket in snapshot.buckets] == ["team-b"]
    assert all(minute.admitted <= 1 for minute in snapshot.history)
    assert sum(minute.admitted for minute in snapshot.history) == 1


def test_a_request_story_has_its_audit_entries_and_delivery_and_hides_from_other_tenants(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    story = gate.request_story("a-1", tenant="team-a")
    assert story["request"]["state"] == "reserved"
    assert [(entry["operation"], entry["outcome"]) for entry in story["history"]] == [
        ("submit", "accepted"), ("admit", "reserved")]
    assert story["delivery"]["delivered"] is False
    assert story["delivery"]["fencing_token"] == 0
    assert story["binding"] is None
    waiting = gate.request_story("a-2")
    assert waiting["queue"]["reason"] == gate.explain("a-2")["reason"]
    with pytest.raises(NotFound):
        gate.request_story("a-1", tenant="team-b")
    with pytest.raises(NotFound):
        gate.request_story("no-such-request")


def test_stops_not_confirmed_are_listed_and_exported_by_state_name(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    # The delivery engine moves a stopped request to `cancelling` until its executor
    # confirms; that state is counted by name, whichever code writes it.
    with gate.engine.begin() as connection:
        connection.execute(schema.request.update().where(schema.request.c.id == "b-1")
                           .values(state="cancelling", updated=clock.now()))
    clock.advance(7)
    [stop] = gate.dashboard().stops
    assert (stop.id, stop.tenant, stop.state, stop.cost, stop.since_seconds) == (
        "b-1", "team-b", "cancelling", {"gpu": 1}, 7)
    assert gate.dashboard("team-a").stops == []
    value = Metrics(gate.engine, clock=clock).registry.get_sample_value
    assert value("quotagate_unconfirmed_stops", {"tenant": "team-b", "state": "cancelling"}) == 1
    assert value("quotagate_oldest_unconfirmed_stop_seconds",
                 {"tenant": "team-b", "state": "cancelling"}) == 7


def test_a_targets_error_text_is_shown_to_operators_and_only_its_failure_to_a_tenant(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    detail = "webhook answered 500 at http://receiver.internal:9000/jobs"
    with gate.engine.begin() as connection:
        connection.execute(schema.outbox.update().where(schema.outbox.c.request_id == "b-1")
                           .values(attempts=2, last_error=detail))
        # A stop the target did not confirm keeps its answer on the outbox row too.
        connection.execute(schema.request.update().where(schema.request.c.id == "a-1")
                           .values(state="cancelling", updated=clock.now()))
        connection.execute(schema.outbox.update().where(schema.outbox.c.request_id == "a-1")
                           .values(stopping=True, attempts=3, last_error=detail))
    operator = gate.dashboard()
    failing = {entry.request_id: entry for entry in operator.deliveries}["b-1"]
    assert (failing.attempts, failing.last_error, failing.failing) == (2, detail, True)
    [stop] = operator.stops
    assert (stop.id, stop.attempts, stop.last_error, stop.failing) == ("a-1", 3, detail, True)
    assert gate.request_story("b-1")["delivery"]["last_error"] == detail
    tenant_b = gate.dashboard("team-b")
    [hidden] = tenant_b.deliveries
    assert (hidden.request_id, hidden.last_error, hidden.failing) == ("b-1", None, True)
    [stop] = gate.dashboard("team-a").stops
    assert (stop.attempts, stop.last_error, stop.failing) == (3, None, True)
    story = gate.request_story("b-1", tenant="team-b")["delivery"]
    assert (story["last_error"], story["failing"]) == (None, True)
    # An admin looking at one tenant is still an operator.
    [shown] = gate.dashboard("team-b", operator=True).deliveries
    assert shown.last_error == detail


def _statements(gate: Quotagate, read: Callable[[], object]) -> list[str]:
    """The SQL statements ``read`` sends to the database."""
    sent: list[str] = []

    def record(_connection: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    sa.event.listen(gate.engine, "before_cursor_execute", record)
    try:
        read()
    finally:
        sa.event.remove(gate.engine, "before_cursor_execute", record)
    return sent


def test_a_poll_costs_the_same_statements_on_a_ledger_with_many_more_rows(
    gate: Quotagate, clock: ManualClock
) -> None:
    _busy_ledger(gate, clock)
    gate.set_tenant("team-a", {}, budget={"gpu": "100h/30d"})
    gate.dashboard()  # the first poll reads the whole last hour; later ones two minutes
    small = _statements(gate, gate.dashboard)
    # Every view grows: more tenants, waiting and admitted requests, decisions, buckets, stops,
    # budgets and their usage.
    for index in range(12):
        tenant = f"grown-{index}"
        gate.set_tenant(tenant, {"gpu": 1}, cohort=None, budget={"gpu": "10h/1d"})
        gate.set_rate(tenant, "capacity=5,refill=0")
        for number in range(3):
            gate.submit(f"{tenant}-{number}", tenant, {"gpu": 1})
    admitted = gate.admit(50)
    assert len(admitted) == 5  # the pool is full
    clock.advance(60)
    gate.complete(admitted[-1].id)  # usage in a budget's buckets
    with gate.engine.begin() as connection:
        connection.execute(schema.request.update().where(schema.request.c.id == admitted[0].id)
                           .values(state="cancelling", updated=clock.now()))
    grown = _statements(gate, gate.dashboard)
    snapshot = gate.dashboard()
    assert snapshot.waiting == 32 and len(snapshot.queue) == 32 and len(snapshot.buckets) == 13
    assert len(snapshot.deliveries) == 7 and len(snapshot.stops) == 1  # one completed
    assert len(snapshot.tenants) == 14 and len(snapshot.decisions) == 50
    assert sum(row.budget_left_hours is not None for row in snapshot.tenants) == 13
    # One statement per view, whatever the number of rows in it.
    assert len(grown) == len(small), (small, grown)
    story = _statements(gate, lambda: gate.request_story("grown-0-1"))
    assert len(_statements(gate, lambda: gate.request_story("a-2"))) == len(story)


def test_a_budget_shows_its_hours_and_a_request_it_blocks_waits_for_the_reason_explain_gives(
    gate: Quotagate, clock: ManualClock
) -> None:
    gate.set_pool("main", {"gpu": 16})
    gate.set_tenant("team-a", {"gpu": 16}, budget={"gpu": "10h/1d"})
    gate.set_tenant("team-b", {"gpu": 2})
    gate.submit("spent", "team-a", {"gpu": 4}, max_runtime="2h")
    gate.admit()
    clock.advance(3600)
    gate.complete("spent")  # 4 gpu-hours spent
    gate.submit("running", "team-a", {"gpu": 1}, max_runtime="2h")  # reserves 2
    gate.admit()
    gate.submit("next", "team-a", {"gpu": 3}, max_runtime="2h")  # needs 6 of the 4 left
    gate.set_tenant("team-b", {"gpu": 3})
    gate.submit("b-1", "team-b", {"gpu": 3})
    gate.set_tenant("team-b", {"gpu": 2})  # now over team-b's quota: no budget involved
    assert gate.admit() == []
    snapshot = gate.dashboard()
    shown = {(row.name, row.resource): (row.budget_spent_hours, row.budget_reserved_hours,
                                        row.budget_left_hours, row.budget_limit)
             for row in snapshot.tenants}
    assert shown == {("team-a", "gpu"): (4.0, 2.0, 4.0, "10h/1d"),
                     ("team-b", "gpu"): (None, None, None, None)}
    # What `tenant show` says is left (running work holds what it will still accrue).
    assert gate.tenant("team-a")["budget"]["gpu"]["left_hours"] == 4.0
    reasons = {entry.id: entry.reason for entry in snapshot.queue}
    assert reasons["next"].startswith("budget_exhausted: gpu needs 6h, 4h available")
    for request_id, reason in reasons.items():
        assert reason == gate.explain(request_id)["reason"]
    assert reasons["b-1"].startswith("tenant quota: gpu needs 3")
    # A tenant's own scope: its budget and the same reason; another tenant sees neither.
    mine = gate.dashboard("team-a")
    assert [(row.name, row.budget_left_hours) for row in mine.tenants] == [("team-a", 4.0)]
    assert [(entry.id, entry.reason) for entry in mine.queue] == [("next", reasons["next"])]
    theirs = gate.dashboard("team-b")
    assert [row.budget_left_hours for row in theirs.tenants] == [None]
    # Released after 10 minutes: its reservation comes back, what it held is spent.
    clock.advance(600)
    gate.complete("running")
    after = gate.dashboard()
    [row] = [row for row in after.tenants if row.name == "team-a"]
    assert (row.budget_spent_hours, row.budget_reserved_hours, row.budget_left_hours) == (
        4.167, 0.0, 5.833)
    [reason] = [entry.reason for entry in after.queue if entry.id == "next"]
    assert reason == gate.explain("next")["reason"]
    assert reason.startswith("budget_exhausted: gpu needs 6h, 5.833h available")


def _shared_ledger(gate: Quotagate, clock: ManualClock) -> None:
    """team-b borrows 3 of team-a's lendable gpu (its borrowing limit); b-5 and a-1 wait."""
    gate.set_pool("main", {"gpu": 16})
    gate.set_cohort("org")
    gate.set_cohort("research", parent="org")
    gate.set_tenant("team-a", {"gpu": 4}, cohort="org", lending_limit={"gpu": 3})
    gate.set_tenant("team-b", {"gpu": 2}, cohort="research", borrowing_limit={"gpu": 3})
    gate.set_tenant("plain", {"gpu": 1})
    for index in range(6):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1})
        clock.advance(1)
    gate.admit_until_idle()
    gate.submit("a-0", "team-a", {"gpu": 1})
    gate.submit("a-1", "team-a", {"gpu": 2})
    gate.admit_until_idle()


def test_cohort_members_show_nominal_borrowed_and_lent_and_wait_for_the_reason_explain_gives(
    gate: Quotagate, clock: ManualClock
) -> None:
    _shared_ledger(gate, clock)
    snapshot = gate.dashboard()
    shown = {(row.name, row.resource): (row.used, row.cap, row.nominal, row.cohort, row.borrowed,
                                        row.lent) for row in snapshot.tenants}
    # The same numbers as GET /v1/usage (quotagate inspect).
    usage = gate.usage()
    assert shown == {(row["tenant"], row["resource"]): (
        row["used"], row["cap"], row["nominal"], row["cohort"], row["borrowed"], row["lent"])
        for row in usage["tenants"]}
    assert shown[("team-b", "gpu")] == (5, 2, 2, "research", 3, 0)
    assert shown[("team-a", "gpu")] == (1, 4, 4, "org", 0, 3)
    assert shown[("plain", "gpu")] == (0, 1, 1, None, 0, 0)
    ceilings = {row.name: row.ceiling for row in snapshot.tenants}
    assert ceilings == {"team-a": None, "team-b": 5, "plain": 1}
    assert [(row.name, row.resource, row.used, row.cap) for row in snapshot.cohorts] == [
        (room["cohort"], room["resource"], room["used"], room["cap"]) for room in usage["cohorts"]]
    # Each member's reason is the sentence `explain` gives (the dry run's verdict), not
    # the plain quota's: b-5 is at its borrowing limit, a-1 finds the room lent out.
    reasons = {entry.id: entry.reason for entry in snapshot.queue}
    assert set(reasons) == {"b-5", "a-1"}
    for request_id, reason in reasons.items():
        assert reason == gate.explain(request_id)["reason"]
    assert reasons["b-5"].startswith("borrowing_limit: gpu needs 1")
    assert reasons["a-1"].startswith("cohort_capacity: gpu needs 2")
    # A tenant's own scope: its rows with what it lends, no cohort rooms, and the same reason.
    mine = gate.dashboard("team-a")
    assert [(row.name, row.lent) for row in mine.tenants] == [("team-a", 3)]
    assert mine.cohorts == []
    assert [(entry.id, entry.reason) for entry in mine.queue] == [("a-1", reasons["a-1"])]


def test_a_preemption_shows_in_decisions_and_stops_and_is_exported_by_reason(
    gate: Quotagate, clock: ManualClock
) -> None:
    gate.set_pool("main", {"gpu": 8})
    gate.set_cohort("org")
    gate.set_tenant("team-a", {"gpu": 2}, cohort="org", reclaim="any")
    gate.set_tenant("team-b", {"gpu": 2}, cohort="org")
    for index in range(4):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1})
        clock.advance(1)
    gate.admit_until_idle()
    gate.submit("a-0", "team-a", {"gpu": 1})
    assert gate.admit() == []
    snapshot = gate.dashboard()
    [victim] = [entry for entry in snapshot.decisions if entry.operation == "preempt"]
    assert (victim.tenant, victim.outcome, victim.reason) == ("team-b", "stopping",
                                                              "reclaim for a-0")
    [stop] = snapshot.stops
    assert (stop.id, stop.state, stop.reason) == (victim.target, "preempting",
                                                  "preempted (reclaim) by a-0")
    value = Metrics(gate.engine, clock=clock).registry.get_sample_value
    assert value("quotagate_unconfirmed_stops", {"tenant": "team-b", "state": "preempting"}) == 1
    assert value("quotagate_preempted_requests_total",
                 {"tenant": "team-b", "reason": "reclaim"}) is None
    # The executor confirms the stop: the victim ends preempted and is counted by its reason.
    assert victim.target is not None
    gate.ledger.release(victim.target, RequestState.CANCELLED, stopped=True)
    assert gate.dashboard().stops == []
    value = Metrics(gate.engine, clock=clock).registry.get_sample_value
    assert value("quotagate_preempted_requests_total",
                 {"tenant": "team-b", "reason": "reclaim"}) == 1
    assert value("quotagate_unconfirmed_stops", {"tenant": "team-b", "state": "preempting"}) is None


def test_a_request_kept_out_by_held_room_waits_for_the_reason_explain_gives(
    gate: Quotagate, clock: ManualClock
) -> None:
    contested_hold(gate)
    snapshot = gate.dashboard()
    reasons = {entry.id: entry.reason for entry in snapshot.queue}
    assert reasons["c-wait"] == gate.explain("c-wait")["reason"]
    assert reasons["c-wait"].startswith("held_for_preemptor: fits, but only in room")
    assert reasons["high"] == gate.explain("high")["reason"] == (
        "fits now; it will be admitted by the next admission pass")
    assert [(hold.id, hold.tenant, hold.cost) for hold in snapshot.holds] == [
        ("high", "team-a", {"gpu": 2})]
    # A tenant's scope: its own request's reason is the same, another tenant's hold unnamed.
    scoped = gate.dashboard("team-c")
    assert [(entry.id, entry.reason) for entry in scoped.queue] == [("c-wait", reasons["c-wait"])]
    assert scoped.holds == []
    assert [hold.id for hold in gate.dashboard("team-a").holds] == ["high"]
    # The preemption's steps are in recent decisions, each naming its request.
    steps = [(entry.operation, entry.outcome, entry.target) for entry in snapshot.decisions]
    assert {("hold", "held", "high"), ("preempt", "stopping", "low"),
            ("requeue", "waiting", "low")} <= set(steps)
    # The requeued victim entered the queue again: the depth replayed before that
    # minute counts it once (five submits and a requeue in, three admissions out).
    clock.advance(60)
    history = gate.dashboard().history
    assert [minute.queue_depth for minute in history[-3:]] == [0, 3, 3]
    # Once the preemptor is admitted its hold is gone, and so is the reason.
    assert [placement.id for placement in gate.admit(limit=8)] == ["high"]
    after = gate.dashboard()
    assert after.holds == []
    assert [entry.reason for entry in after.queue if entry.id == "c-wait"] == [
        gate.explain("c-wait")["reason"]]
    assert not after.queue[0].reason.startswith("held_for_preemptor")


_SLOW_READ = {
    "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
              "WHERE i < 1000000000) SELECT count(*) FROM n",
    "postgresql": "SELECT pg_sleep(30)",
    "mysql": "SELECT SLEEP(30)",
}


def test_a_read_past_its_deadline_is_stopped_and_reported_as_store_timeout(
    db_url: str, backend: str, tmp_path: Path
) -> None:
    engine = create_engine(db_url, read_timeout=0.3)
    try:
        with pytest.raises(StoreUnavailable) as raised, reading(engine) as connection:
            connection.execute(sa.text(_SLOW_READ[backend]))
        assert raised.value.code == "store_timeout"
        assert raised.value.status == 503
        # The deadline ends with the read: the same pooled connection answers the next one,
        # and a connection taken outside `reading` carries no deadline.
        with reading(engine) as connection:
            assert connection.execute(sa.text("SELECT 1")).scalar() == 1
        if backend == "mysql":
            with engine.connect() as connection:
                assert float(connection.execute(
                    sa.text("SELECT @@max_statement_time")).scalar() or 0) == 0
    finally:
        engine.dispose()



def _closed_port() -> int:
    """A port nothing listens on (bound, then released): connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_streams_view_shows_length_pending_and_lag_and_is_scoped_to_the_tenant(
    db_url: str, clock: ManualClock
) -> None:
    with stream_gate(db_url, shared_redis_url(), clock=clock) as gate:
        tenant = tenant_with_quota(gate, prefix="dash")
        other = tenant_with_quota(gate, prefix="dash")
        gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1, max_len=1000)
        gate.streams.create_topic(other, "events", partitions=2, parallelism=1)
        gate.streams.producer(tenant, "orders").send_many([(f"m{i}", None) for i in range(5)])
        with gate.streams.consumer(tenant, "orders", "billing", "c1", batch=2) as consumer:
            taken = wait_for(consumer.poll, "the consumer's first entries")
            assert len(taken) == 2
            view = gate.dashboard(tenant).streams
            assert view is not None and view.error is None and view.total == 1
            [row] = view.topics
            assert (row.tenant, row.topic, row.partitions, row.parallelism, row.max_len) == (
                tenant, "orders", 1, 1, 1000)
            assert (row.length, row.pending, row.lag, row.dlq) == (5, 2, 3, 0)
            [group] = row.groups
            assert group.group == "billing" and group.pending == 2 and group.lag == 3
            [owner] = group.partitions
            assert owner.partition == 0 and owner.owner == "c1" and owner.generation >= 1
            assert consumer.settle(taken).acked == 2
        after = gate.dashboard(tenant).streams
        assert after is not None
        [row] = after.topics
        assert (row.length, row.pending, row.lag) == (5, 0, 3)
        everyone = gate.dashboard().streams
        assert everyone is not None
        assert {(row.tenant, row.topic) for row in everyone.topics} == {
            (tenant, "orders"), (other, "events")}
        [events] = [row for row in everyone.topics if row.tenant == other]
        # Nothing produced, no group: empty, and no lag to speak of.
        assert (events.length, events.pending, events.lag, events.groups) == (0, 0, None, [])


def test_an_unreachable_stream_redis_is_reported_and_the_rest_of_the_dashboard_works(
    db_url: str, clock: ManualClock, tmp_path: Path
) -> None:
    with stream_gate(db_url, shared_redis_url(), clock=clock) as gate:
        tenant = tenant_with_quota(gate, prefix="dash")
        gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    with stream_gate(db_url, f"redis://127.0.0.1:{_closed_port()}/0", clock=clock) as gate:
        _busy_ledger(gate, clock)
        snapshot = gate.dashboard()
        assert snapshot.streams is not None and snapshot.streams.error is not None
        assert snapshot.streams.error["code"] == "stream_store_unavailable"
        [row] = snapshot.streams.topics
        assert (row.tenant, row.topic, row.partitions) == (tenant, "orders", 1)
        assert row.length is None and row.lag is None
        assert {row.name for row in snapshot.tenants} >= {"team-a", "team-b"}
        assert snapshot.waiting == 1
