"""SQLite charges each quota and pool row with its own one-row conditional UPDATE.

A statement costs SQLite no round trip, and the one-row form runs in about half
the time of the CASE over every row that the servers get
(docs/decisions/051-sqlite-charges-row-by-row.md). The charges must stay exact:
the same usage as the batch statement would leave, and a row without room
fails the whole admission.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.domain.placement import Placement
from quotagate.store import schema
from quotagate.store.driver import run_driver_transaction
from quotagate.store.engine import create_engine
from quotagate.store.ledger import CapacityChanged, Ledger
from quotagate.store.pool_slices import charge as charge_pools
from support.databases import fresh_database

pytestmark = pytest.mark.sqlite


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Quotagate, Ledger, list[str]]]:
    with fresh_database("sqlite", tmp_path) as url:
        clock = ManualClock()
        gate = Quotagate.connect(url, clock=clock)
        gate.set_pool("pool-1", {"gpu": 8, "cpu": 8})
        gate.set_tenant("team-a", {"gpu": 4, "cpu": 8})
        gate.set_tenant("team-b", {"gpu": 4, "cpu": 8})
        engine = create_engine(url)
        statements: list[str] = []
        sa.event.listen(engine, "connect",
                        lambda dbapi, _record: dbapi.set_trace_callback(statements.append))
        ledger = Ledger(engine, clock=clock)
        yield gate, ledger, statements
        ledger.close()
        engine.dispose()
        gate.close()


def _used(engine: sa.Engine, table: sa.Table, holder: str) -> dict[tuple[str, str], int]:
    with engine.connect() as connection:
        return {(row[0], row[1]): int(row[2]) for row in connection.execute(
            sa.select(table.c[holder], table.c.resource, table.c.used))}


def _charges(statements: list[str], table: str) -> list[str]:
    return [sql for sql in statements if sql.startswith(f"UPDATE {table} ")]


def test_each_charged_row_has_its_own_update_and_usage_is_the_batchs(
    traced: tuple[Quotagate, Ledger, list[str]],
) -> None:
    gate, ledger, statements = traced
    gate.submit("a-1", "team-a", {"gpu": 1, "cpu": 2})
    gate.submit("a-2", "team-a", {"gpu": 1, "cpu": 1})
    gate.submit("b-1", "team-b", {"gpu": 2})
    assert len(ledger.admit(3)) == 3
    tenant_charges = _charges(statements, "qg_tenant_quota")
    # (team-a, cpu), (team-a, gpu), (team-b, gpu): the two requests of team-a summed per row.
    assert len(tenant_charges) == 3
    assert len(_charges(statements, "qg_pool_capacity")) == 2
    assert not any("CASE" in sql for sql in tenant_charges + _charges(statements, "qg_pool_capacity"))
    assert _used(ledger.engine, schema.tenant_quota, "tenant") == {
        ("team-a", "gpu"): 2, ("team-a", "cpu"): 3, ("team-b", "gpu"): 2, ("team-b", "cpu"): 0}
    assert _used(ledger.engine, schema.pool_capacity, "pool") == {
        ("pool-1", "gpu"): 4, ("pool-1", "cpu"): 3}
    assert gate.check_invariants() == []


def test_a_row_without_room_fails_the_charge_and_leaves_every_row_as_it_was(
    traced: tuple[Quotagate, Ledger, list[str]],
) -> None:
    _gate, ledger, _statements = traced
    # One unit of room left on each resource. Rows go in resource order (cpu, gpu): first
    # the cpu row misses before anything changed; then cpu is charged and the gpu row
    # misses after it, which must undo the cpu charge too.
    with ledger.engine.begin() as connection:
        connection.execute(schema.pool_capacity.update().values(used=7))
    for cost in ({"cpu": 2, "gpu": 1}, {"cpu": 1, "gpu": 2}):
        placement = Placement("x", "team-a", "pool-1", cost)
        with pytest.raises(CapacityChanged):
            run_driver_transaction(ledger.engine, lambda transaction, placement=placement:
                                   charge_pools(transaction, [placement], {},
                                                {"pool-1": {}}, lock_in_order=False,
                                                missed=CapacityChanged("pool")))
        assert _used(ledger.engine, schema.pool_capacity, "pool") == {
            ("pool-1", "gpu"): 7, ("pool-1", "cpu"): 7}
