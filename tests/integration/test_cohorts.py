"""Cohorts: borrowing and lending of unused nominal quota, on every backend."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.errors import InvalidInput, NotFound
from quotagate.store import schema
from support.ledger_state import snapshot


def _row(gate: Quotagate, tenant: str, resource: str = "gpu") -> dict[str, Any]:
    return next(row for row in gate.usage()["tenants"]
                if row["tenant"] == tenant and row["resource"] == resource)


def _room(gate: Quotagate, cohort: str, resource: str = "gpu") -> tuple[int, int]:
    row = next(row for row in gate.usage()["cohorts"]
               if row["cohort"] == cohort and row["resource"] == resource)
    return row["used"], row["cap"]


def _states(gate: Quotagate, *ids: str) -> list[str]:
    return [gate.show(request_id).state.value for request_id in ids]


@pytest.fixture
def cohort(gate: Quotagate) -> Quotagate:
    """Two members of cohort "research": a (nominal 4, may borrow 2) and b (nominal 4)."""
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_cohort("research")
    gate.set_tenant("team-a", {"gpu": 4}, cohort="research", borrowing_limit={"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 4}, cohort="research")
    return gate


def test_a_member_borrows_what_the_others_leave_unused_up_to_its_borrowing_limit(
    cohort: Quotagate,
) -> None:
    gate = cohort
    for index in range(8):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 6  # nominal 4 + borrowing limit 2
    row = _row(gate, "team-a")
    assert (row["used"], row["nominal"], row["borrowed"], row["lent"]) == (6, 4, 2, 0)
    lender = _row(gate, "team-b")
    assert (lender["used"], lender["borrowed"], lender["lent"]) == (0, 0, 2)
    assert _room(gate, "research") == (6, 8)
    assert gate.check_invariants() == []


def test_the_lender_gets_only_what_is_left_and_release_returns_the_room(
    cohort: Quotagate,
) -> None:
    gate = cohort
    for index in range(6):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 6
    for index in range(4):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1})
    # b's own nominal is 4, but 2 of it are lent out: without preemption, 2 fit.
    assert gate.admit_until_idle() == 2
    assert _room(gate, "research") == (8, 8)
    assert _states(gate, "b-2", "b-3") == ["waiting", "waiting"]
    gate.complete("a-0")
    assert _room(gate, "research") == (7, 8)
    assert gate.admit_until_idle() == 1
    assert _row(gate, "team-b")["used"] == 3
    assert gate.check_invariants() == []


def test_a_lending_limit_keeps_the_rest_of_the_nominal_for_its_owner(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_cohort("research")
    gate.set_tenant("team-a", {"gpu": 4}, cohort="research")
    gate.set_tenant("team-b", {"gpu": 4}, cohort="research", lending_limit={"gpu": 1})
    for index in range(8):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 5  # its own 4 and the 1 that b lends
    for index in range(4):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1})
    assert gate.admit_until_idle() == 3  # b's 3 guaranteed; its lent 1 is in use by a
    lender = _row(gate, "team-b")
    assert (lender["used"], lender["lent"]) == (3, 1)
    assert gate.check_invariants() == []


def test_without_a_cohort_a_quota_is_a_hard_cap(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_tenant("team-a", {"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 8})
    for index in range(4):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 2
    assert _row(gate, "team-a")["borrowed"] == 0
    assert gate.usage()["cohorts"] == []


def test_a_cohort_tree_is_one_sharing_domain(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_cohort("org")
    gate.set_cohort("vision", parent="org")
    gate.set_cohort("speech", parent="org")
    gate.set_tenant("team-a", {"gpu": 2}, cohort="vision")
    gate.set_tenant("team-b", {"gpu": 3}, cohort="speech")
    for index in range(6):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 5
    assert _room(gate, "org") == (5, 5)
    described = gate.config.get_cohort("org")
    assert described["children"] == ["speech", "vision"] and described["root"] == "org"
    assert gate.config.get_tenant("team-a")["cohort_root"] == "org"
    assert gate.check_invariants() == []


def test_moving_a_cohort_moves_its_members_rooms(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_cohort("left")
    gate.set_cohort("right")
    gate.set_tenant("team-a", {"gpu": 2}, cohort="left")
    gate.set_tenant("team-b", {"gpu": 3}, cohort="right")
    for index in range(2):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 2
    gate.set_cohort("right", parent="left")
    assert _room(gate, "left") == (2, 5)
    assert [row["cohort"] for row in gate.usage()["cohorts"]] == ["left"]
    gate.submit("a-2", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 1  # now it borrows from b
    gate.set_cohort("right", parent=None)
    # a keeps what it holds (over its nominal now, like a lowered quota) and takes no more.
    assert _room(gate, "left") == (3, 2)
    assert _room(gate, "right") == (0, 3)
    gate.submit("a-3", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 0


def test_leaving_a_cohort_rebuilds_its_room_and_forgets_the_limits(cohort: Quotagate) -> None:
    gate = cohort
    gate.submit("b-0", "team-b", {"gpu": 1})
    assert gate.admit_until_idle() == 1
    gate.set_tenant("team-a", {}, cohort=None)
    assert _room(gate, "research") == (1, 4)
    described = gate.config.get_tenant("team-a")
    assert described["cohort"] is None and "borrowing_limit" not in described["quota"]["gpu"]
    assert gate.check_invariants() == []


@pytest.mark.parametrize(("change", "code"), [
    ({"cohort": "nowhere"}, "unknown_cohort"),
    ({"borrowing_limit": {"gpu": 1}, "cohort": None}, "not_in_cohort"),
    ({"lending_limit": {"gpu": 5}}, "invalid_lending_limit"),
    ({"borrowing_limit": {"cpu": 1}}, "unknown_quota_resource"),
    ({"borrowing_limit": {"gpu": -1}}, "invalid_borrowing_limit"),
    ({"weight": 0}, "invalid_weight"),
])
def test_a_bad_cohort_setting_is_refused_and_changes_nothing(
    cohort: Quotagate, change: dict[str, Any], code: str
) -> None:
    gate = cohort
    before = snapshot(gate)
    with pytest.raises((InvalidInput, NotFound)) as refused:
        gate.set_tenant("team-a", {"gpu": 3}, **change)
    assert refused.value.code == code
    assert snapshot(gate) == before


def test_a_cohort_cannot_become_its_own_ancestor(gate: Quotagate) -> None:
    gate.set_cohort("org")
    gate.set_cohort("vision", parent="org")
    with pytest.raises(InvalidInput) as refused:
        gate.set_cohort("org", parent="vision")
    assert refused.value.code == "cohort_cycle"
    with pytest.raises(NotFound):
        gate.set_cohort("speech", parent="nowhere")
    assert gate.config.get_cohort("org")["parent"] is None


def test_check_reports_a_room_that_drifted_from_its_members(cohort: Quotagate) -> None:
    gate = cohort
    gate.submit("a-0", "team-a", {"gpu": 1})
    gate.admit_until_idle()
    with gate.engine.begin() as connection:
        connection.execute(sa.update(schema.cohort_usage).values(used=0))
    violations = gate.check_invariants()
    assert any("room stored as (0, 8)" in violation for violation in violations)


def test_check_reports_a_member_over_its_borrowing_limit(cohort: Quotagate) -> None:
    gate = cohort
    for index in range(6):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    gate.admit_until_idle()
    with gate.engine.begin() as connection:
        connection.execute(sa.update(schema.tenant_quota)
                           .where(schema.tenant_quota.c.tenant == "team-a")
                           .values(borrowing_limit=1))
    assert any("used 6 > nominal 4 + borrowing limit 1" in violation
               for violation in gate.check_invariants())


def test_a_topic_of_a_member_is_held_in_its_cohort_room(gate: Quotagate) -> None:
    gate.set_cohort("research")
    gate.set_tenant("team-a", {"partitions": 4, "parallelism": 2}, cohort="research")
    gate.streams.topics.create("team-a", "events", partitions=2, parallelism=1)
    assert _room(gate, "research", "partitions") == (2, 4)
    gate.streams.topics.delete("team-a", "events")
    assert _room(gate, "research", "partitions") == (0, 4)
    assert gate.check_invariants() == []


def _set_up_contended_cohort(url: str) -> None:
    with Quotagate.connect(url) as gate:
        gate.set_pool("pool-1", {"gpu": 10, "cpu": 40})
        gate.set_pool("pool-2", {"gpu": 8, "cpu": 40})
        gate.set_cohort("org")
        gate.set_cohort("vision", parent="org")
        gate.set_tenant("team-a", {"gpu": 2, "cpu": 20}, cohort="vision",
                        borrowing_limit={"gpu": 4}, lending_limit={"cpu": 10})
        gate.set_tenant("team-b", {"gpu": 3, "cpu": 6}, cohort="org", lending_limit={"gpu": 1})
        gate.set_tenant("team-c", {"gpu": 5, "cpu": 10}, cohort="vision",
                        borrowing_limit={"gpu": 0}, lending_limit={"gpu": 2})
        gate.set_tenant("team-d", {"gpu": 2, "cpu": 4})


@pytest.mark.slow
def test_eight_admitters_keep_every_cohort_invariant(db_url: str) -> None:
    import multiprocessing

    from support import cohort_workers, workers

    _set_up_contended_cohort(db_url)
    context = multiprocessing.get_context("spawn")
    done: multiprocessing.Queue[int] = context.Queue()
    releases: multiprocessing.Queue[int] = context.Queue()
    admitted: multiprocessing.Queue[int] = context.Queue()
    finished = context.Event()
    helpers = [
        context.Process(target=cohort_workers.submit_cohort_work,
                        args=(db_url, f"s{index}", 120, index, done))
        for index in range(2)
    ] + [context.Process(target=cohort_workers.release_some, args=(db_url, 30, 7, releases))]
    admitters = [
        context.Process(target=workers.admit_until_done, args=(db_url, finished, 4, admitted))
        for _ in range(8)
    ]
    for process in helpers + admitters:
        process.start()
    for _ in range(2):
        done.get(timeout=240)
    released = releases.get(timeout=240)
    finished.set()
    total = sum(admitted.get(timeout=240) for _ in admitters)
    for process in helpers + admitters:
        process.join(timeout=60)
        assert process.exitcode == 0
    with Quotagate.connect(db_url) as gate:
        assert gate.check_invariants() == []
        # An independent recount of the cohort invariants from the usage view.
        rows = {(row["tenant"], row["resource"]): row for row in gate.usage()["tenants"]}
        limits = {"team-a": {"gpu": (4, None), "cpu": (None, 10)},
                  "team-b": {"gpu": (None, 1), "cpu": (None, None)},
                  "team-c": {"gpu": (0, 2), "cpu": (None, None)}}
        for resource in ("gpu", "cpu"):
            members = [rows[tenant, resource] for tenant in limits]
            for row in members:
                borrowing, lending = limits[row["tenant"]][resource]
                assert row["borrowed"] == max(0, row["used"] - row["nominal"])
                if borrowing is not None:
                    assert row["used"] <= row["nominal"] + borrowing
                assert row["lent"] <= (row["nominal"] if lending is None else lending)
            assert sum(row["used"] for row in members) <= sum(row["nominal"] for row in members)
            assert sum(row["borrowed"] for row in members) == sum(row["lent"] for row in members)
        assert rows["team-d", "gpu"]["used"] <= 2
        # The run did borrow: a's gpu beyond its nominal, b's cpu.
        assert rows["team-a", "gpu"]["borrowed"] > 0
        assert rows["team-b", "cpu"]["borrowed"] > 0
        assert total - released == _reserved(gate)


def _reserved(gate: Quotagate) -> int:
    with gate.engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(schema.request)
            .where(schema.request.c.state == "reserved")).scalar_one())
