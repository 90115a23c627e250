"""The admission snapshot reads a sliced pool as the sums of its slices, on every backend.

The snapshot query returns one row per capacity slice and
``quotagate.store.cohorts.snapshot_from_rows`` adds them up (SQLite's GROUP BY
was a fifth of the read, docs/performance.md); planning must see the same pool
use and cap as before, and the slice count.
"""

from __future__ import annotations

from quotagate import Quotagate
from quotagate.store import cohorts, statements


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
