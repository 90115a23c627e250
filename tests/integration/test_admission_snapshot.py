"""The admission snapshot reads a sliced pool as the sums of its slices, on every backend.

The snapshot query returns one row per capacity slice and
``quotagate.store.cohorts.snapshot_from_rows`` adds them up (SQLite's GROUP BY
was a fifth of the read, docs/performance.md); planning must see the same pool
use and cap as before, and the slice count.
"""

from __future__ import annotations

import pytest

from quotagate import Quotagate
from quotagate.store import cohorts, schema, statements
from quotagate.store.dialect import types_union_columns_from_all_parts


def _snapshot(gate: Quotagate) -> cohorts.Snapshot:
    with gate.engine.connect() as connection:
        return cohorts.snapshot_from_rows(
            connection.execute(statements.admission_snapshot_query()))


def test_a_sliced_pool_is_planned_on_the_sums_of_its_slices(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 20, "cpu": 40})
    gate.set_pool("sliced", {"gpu": 10, "cpu": 20}, slices=4)
    gate.set_pool("whole", {"gpu": 3})  # no cpu: every job below goes to "sliced"
    for index in range(3):
        gate.submit(f"job-{index}", "team-a", {"gpu": 2, "cpu": 3})
    assert len(gate.admit(3)) == 3

    snapshot = _snapshot(gate)
    assert snapshot.pools["sliced"] == {"gpu": (6, 10), "cpu": (9, 20)}
    assert snapshot.pools["whole"] == {"gpu": (0, 3)}
    assert snapshot.slices == {"sliced": 4}
    assert snapshot.tenants["team-a"] == {"gpu": (6, 20), "cpu": (9, 40)}


def test_the_snapshot_without_typed_nulls_reads_every_part_as_the_typed_one(gate: Quotagate) -> None:
    """Where the server types a UNION column from all its parts (MariaDB, MySQL), admission
    reads the snapshot with bare NULLs: the same rows, every part filled."""
    if not types_union_columns_from_all_parts(gate.engine):
        pytest.skip("the typed snapshot is the only one read here")
    gate.set_cohort("research")
    gate.set_tenant("team-a", {"gpu": 8}, cohort="research", borrowing_limit={"gpu": 2},
                    weight=3, reclaim="any", budget={"gpu": "10h/1d"})
    gate.set_tenant("team-b", {"gpu": 4})
    gate.set_pool("sliced", {"gpu": 10}, slices=2)
    gate.set_fair_share(half_life="1h")
    with gate.engine.begin() as connection:
        connection.execute(schema.hold.insert().values(
            request_id="held-1", tenant="team-a", created=1.0, expires=2.0))
    with gate.engine.connect() as connection:
        typed = connection.execute(statements.admission_snapshot_query()).all()
        bare = connection.execute(statements.admission_snapshot_query(typed_nulls=False)).all()
    kinds = {row[0] for row in typed}
    assert kinds == {"t", "p", "c", "w", "x", "g", "h", "i"}
    assert sorted(map(tuple, bare), key=repr) == sorted(map(tuple, typed), key=repr)
