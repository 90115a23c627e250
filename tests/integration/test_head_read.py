"""Admission's head read: each tenant's first waiting requests, merged into queue order.

MariaDB reads the tenants as the UNION's own members, without a derived table
each (docs/decisions/054-flat-head-read-on-mariadb.md); every form must return
exactly what sorting the per-tenant reads would.
"""

from __future__ import annotations

import json

import pytest

from quotagate import Quotagate
from quotagate.store import schema, statements
from quotagate.store.dialect import code_point_collation, materializes_derived_tables
from quotagate.store.head_rows import QUEUE_ORDER

TENANTS = ["team-a", "team-b", "team-c"]


def _fill(gate: Quotagate) -> None:
    """Ties on queue key and created time, broken by id (upper case sorts first by code
    point), and requests that are not waiting."""
    rows = [
        {"id": f"{'R' if index % 2 else 'r'}{index:03d}", "tenant": TENANTS[index % 3],
         "state": "waiting" if index % 7 else "reserved", "cost": json.dumps({"gpu": 1}),
         "priority": 0, "payload": "null", "target": None, "pool": None,
         "queue_key": float(index % 4), "created": float(index % 3), "updated": 0.0,
         "reason": None}
        for index in range(60)
    ]
    with gate.engine.begin() as connection:
        connection.execute(schema.request.insert(), rows)


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("tenants", [TENANTS, ["team-b"]])
def test_the_ordered_head_read_is_the_tenants_heads_in_queue_order(
    gate: Quotagate, tenants: list[str], flat: bool,
) -> None:
    name = gate.engine.dialect.name
    if flat and not materializes_derived_tables(gate.engine) and name != "postgresql":
        pytest.skip("SQLite parses no parenthesized UNION member")
    _fill(gate)
    parameters = statements.head_parameters(tenants)
    with gate.engine.connect() as connection:
        unordered = connection.execute(statements.head_query(len(tenants), 4), parameters).all()
        ordered = connection.execute(statements.ordered_head_query(
            len(tenants), 4, code_point_collation(gate.engine), flat=flat), parameters).all()
    expected = [(row.id, row.tenant, row.cost, row.target, row.reserved_runtime,
                 row.token_floor) for row in sorted(unordered, key=QUEUE_ORDER)]
    assert len(expected) == 4 * len(tenants)
    assert [tuple(row) for row in ordered] == expected


@pytest.mark.parametrize("tenants", [TENANTS, ["team-b"]])
def test_mariadb_reads_each_tenant_through_the_index_with_no_derived_table_per_tenant(
    gate: Quotagate, tenants: list[str],
) -> None:
    if not materializes_derived_tables(gate.engine):
        pytest.skip("the flat head read is MySQL's and MariaDB's")
    _fill(gate)
    query = statements.ordered_head_query(len(tenants), 4, None, flat=True).params(
        statements.head_parameters(tenants))
    compiled = query.compile(gate.engine, compile_kwargs={"literal_binds": True})
    with gate.engine.connect() as connection:
        rows = connection.exec_driver_sql(f"EXPLAIN {compiled}").mappings().all()
    reads = [row for row in rows if row["table"] == "qg_request"]
    assert len(reads) == len(tenants), rows
    assert all(row["key"] == "ix_qg_request_tenant_state_queue_key_created_id"
               for row in reads), rows
    # One derived table (the UNION's result, to sort it) at most; none for one tenant.
    derived = [row for row in rows if row["select_type"] == "DERIVED"]
    assert len(derived) == (0 if len(tenants) == 1 else 1), rows
