"""The admission hot query reads the queue through its index on every engine.

If the index stops being used, admission cost grows with the waiting queue:
that must be a failing test, not a slow night.
"""

from __future__ import annotations

import json
import re

import pytest

from quotagate import Quotagate
from quotagate.domain.ordering import queue_key
from quotagate.domain.placement import Placement
from quotagate.store import schema, statements

QUEUE_INDEX = "ix_qg_request_tenant_state_queue_key_created_id"


def _fill_queue(gate: Quotagate, count: int) -> None:
    rows = [
        {
            "id": f"r{index}", "tenant": f"team-{index % 3}", "state": "waiting" if index % 5 else
            "completed", "cost": json.dumps({"gpu": 1}), "priority": index % 4, "payload": "null",
            "target": None, "pool": None, "queue_key": queue_key(index % 4, 1000.0 + index, 30.0),
            "created": 1000.0 + index, "updated": 1000.0 + index, "reason": None,
        }
        for index in range(count)
    ]
    with gate.engine.begin() as connection:
        connection.execute(schema.request.insert(), rows)
        name = gate.engine.dialect.name
        if name == "postgresql":
            connection.exec_driver_sql("ANALYZE qg_request")
        elif name == "mysql":
            connection.exec_driver_sql("ANALYZE TABLE qg_request")
        else:
            connection.exec_driver_sql("ANALYZE")


def test_admission_reads_each_tenant_queue_through_the_index(gate: Quotagate) -> None:
    _fill_queue(gate, 6000)
    tenants = ["team-0", "team-1", "team-2"]
    query = statements.head_query(len(tenants), 32).params(statements.head_parameters(tenants))
    compiled = query.compile(gate.engine, compile_kwargs={"literal_binds": True})
    name = gate.engine.dialect.name
    with gate.engine.connect() as connection:
        if name == "postgresql":
            plan = "\n".join(row[0] for row in connection.exec_driver_sql(f"EXPLAIN {compiled}"))
            assert QUEUE_INDEX in plan, plan
            assert "Seq Scan" not in plan and "Sort" not in plan, plan
        elif name == "mysql":
            rows = connection.exec_driver_sql(f"EXPLAIN {compiled}").mappings().all()
            tables = [row for row in rows if row["table"] == "qg_request"]
            assert tables and all(row["key"] == QUEUE_INDEX for row in tables), rows
            assert not any("filesort" in (row["Extra"] or "") for row in tables), rows
        else:
            plan = "\n".join(
                str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")
            )
            assert f"USING INDEX {QUEUE_INDEX}" in plan, plan
            assert "TEMP B-TREE FOR ORDER BY" not in plan.split("COMPOUND")[0], plan


@pytest.mark.parametrize("plan_mode", ["custom", "generic"])
def test_reserving_finds_each_chosen_row_by_its_key_before_any_analyze(
    gate: Quotagate, plan_mode: str,
) -> None:
    """PostgreSQL, a burst of 2,000 waiting requests that its statistics do not know yet
    (never analyzed): the reserve statement reads no row of the queue but the chosen
    ones, each once through the primary key, in the plan for the values and in the
    prepared statement's generic plan alike. It filtered the whole waiting queue
    through the state index once per chosen row before (docs/decisions/250)."""
    if gate.engine.dialect.name != "postgresql":
        pytest.skip("the locking reserve statement is PostgreSQL's (reserves_with_lock)")
    _submit_burst(gate, 2000)
    plan_of = [Placement(f"b-{index:04}", "team-a", "main", {"gpu": 1}) for index in range(16)]
    compiled = statements.reserve_and_record_statement().compile(gate.engine)
    parameters = compiled.construct_params(statements.reserve_arrays(plan_of, 1.0, "test"))
    # PREPARE and EXECUTE, as psycopg runs a statement from its fifth time on.
    plan = _prepared_plan(gate, str(compiled), parameters, plan_mode)
    reserved = re.search(r"CTE Scan on reserved .*rows=(\d+)", plan)
    assert reserved and int(reserved.group(1)) == len(plan_of), plan
    assert "Seq Scan" not in plan and "ix_qg_request_state" not in plan, plan
    scans = re.findall(r"Index Scan using pk_qg_request .*rows=(\d+) loops=(\d+)", plan)
    assert scans and all(int(rows) <= 1 for rows, _loops in scans), plan
    assert sum(int(loops) for _rows, loops in scans) <= 2 * len(plan_of), plan


def _number(names: list[str], name: str) -> int:
    """``name``'s placeholder number, numbered in order of first use."""
    if name not in names:
        names.append(name)
    return names.index(name) + 1


def test_the_prepared_head_read_keeps_its_plan_however_long_the_queue(gate: Quotagate) -> None:
    """PostgreSQL: psycopg prepares a statement from its fifth run, and the server keeps
    one generic plan only if it is estimated no dearer than planning each run afresh.

    With the window bound as a parameter, the generic plan assumed a tenth of each
    tenant's queue would be read: once queues were long, every head read was planned
    again, one index scan per tenant each time (with 20 tenants, 0.5 ms of planning in
    every admission from about 10,000 waiting on: docs/performance.md, "A million waiting
    with cohorts and budgets"). The window is a literal, so the generic plan is kept.
    Counted from pg_prepared_statements, not timed.
    """
    if gate.engine.dialect.name != "postgresql":
        pytest.skip("only psycopg prepares statements on the server (pymysql interpolates; "
                    "SQLite's plan does not depend on the values)")
    _fill_queue(gate, 6000)
    tenants = ["team-0", "team-1", "team-2"]
    compiled = statements.head_query(len(tenants), 4).compile(gate.engine)
    parameters = compiled.construct_params(statements.head_parameters(tenants))
    raw = gate.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for _ in range(10):
            cursor.execute(str(compiled), parameters, prepare=True)
            assert len(cursor.fetchall()) == 4 * len(tenants)
        cursor.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                       " WHERE statement LIKE '%head_0%'")
        ((generic, custom),) = cursor.fetchall()
    finally:
        raw.rollback()
        raw.close()
    assert generic > 0, f"planned afresh at every run: {custom} custom plans, no generic one"


@pytest.mark.parametrize("opted_in", [False, True], ids=["none-opted-in", "one-with-grace"])
def test_the_workers_look_for_overruns_reads_requests_through_an_index(
    gate: Quotagate, opted_in: bool
) -> None:
    """Every worker pass may run it (docs/decisions/714): with many requests and no tenant
    opted in — or one, with a grace (715) — it must not read the request table whole."""
    from quotagate.store import overruns

    _fill_queue(gate, 6000)
    with gate.engine.begin() as connection:
        connection.execute(schema.tenant.insert(), [
            {"name": f"team-{index}", "created": 1.0,
             "stop_at_max_runtime": opted_in and index == 1,
             "max_runtime_grace": 300 if opted_in and index == 1 else 0}
            for index in range(200)])
    query = overruns.overruns_query().params(now=5000.0, limit=256)
    compiled = query.compile(gate.engine, compile_kwargs={"literal_binds": True})
    name = gate.engine.dialect.name
    with gate.engine.connect() as connection:
        if name == "postgresql":
            connection.exec_driver_sql("ANALYZE qg_tenant")
            plan = "\n".join(row[0] for row in connection.exec_driver_sql(f"EXPLAIN {compiled}"))
            assert "Seq Scan on qg_request" not in plan, plan
        elif name == "mysql":
            rows = connection.exec_driver_sql(f"EXPLAIN {compiled}").mappings().all()
            requests = [row for row in rows if row["table"] == "qg_request"]
            assert requests and all(row["key"] for row in requests), rows
        else:
            plan = "\n".join(
                str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
            assert "SCAN qg_request" not in plan.replace("SEARCH qg_request", ""), plan
            assert "qg_request USING INDEX" in plan or "qg_request USING COVERING" in plan, plan


@pytest.mark.parametrize("plan_mode", ["custom", "generic"])
def test_ends_and_delivery_marks_find_their_rows_by_key_before_any_analyze(
    gate: Quotagate, plan_mode: str,
) -> None:
    """PostgreSQL, 2,000 running requests and 2,000 reserved ones its statistics do not know
    yet: a batch of ends (the release's state move) and a delivery batch's ``delivered``
    mark read only their own rows, through the primary key, with the plan for the values
    and with a prepared statement's generic plan. Each filtered every row in its state
    through the state index before (docs/decisions/256)."""
    if gate.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's planner is the one that took the state index")
    from quotagate.store import outbox_statements, release_statements

    _submit_burst(gate, 4000)
    with gate.engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE qg_request SET state = CASE WHEN id < 'b-2000' THEN 'delivered'"
            " ELSE 'reserved' END")
    ends = [f"b-{index:04}" for index in range(16)]
    marks = [f"b-{index:04}" for index in range(2000, 2016)]
    move = release_statements.move_statement(len(ends), False).compile(gate.engine)
    move_parameters = move.construct_params({
        **{f"id_{index}": name for index, name in enumerate(ends)},
        "current": "delivered", "to_state": "completed", "now": 1.0, "reason": None})
    mark = outbox_statements.mark_delivered_statement(len(marks)).compile(gate.engine)
    mark_parameters = mark.construct_params(
        {"now": 1.0, **outbox_statements.id_parameters(marks)})
    for compiled, parameters in ((move, move_parameters), (mark, mark_parameters)):
        plan = _prepared_plan(gate, str(compiled), parameters, plan_mode)
        assert "Seq Scan" not in plan and "ix_qg_request_state" not in plan, plan
        # An index scan or a bitmap scan of the primary key (the bulk UPDATE above left
        # old row versions that a bitmap scan also visits).
        assert re.search(r"Index Scan (using|on) pk_qg_request", plan), plan


@pytest.mark.parametrize("plan_mode", ["custom", "generic"])
def test_delivery_batches_reach_their_outbox_rows_by_key_before_any_analyze(
    gate: Quotagate, plan_mode: str,
) -> None:
    """PostgreSQL, 3,000 outbox rows its statistics do not know yet: a delivery batch's
    record locks its 64 outbox rows through the primary key, one lookup each, and its
    writes (one statement since decision 259) take the ids as one array, with the plan
    for the values and with a prepared statement's generic plan. By ``request_id IN
    (…)`` each read the whole outbox, and the generic plan built the id list again for
    every row (docs/decisions/254; the claim, also one statement, is tested below).
    Starting a stop (one id and its state) finds its row by key."""
    if gate.engine.dialect.name != "postgresql":
        pytest.skip("only PostgreSQL takes the ids as one array (binds_id_arrays)")
    from quotagate.store import outbox_statements, release_statements

    _submit_burst(gate, 3000)
    assert gate.admit_until_idle(batch=256) == 3000
    ids = [f"b-{index:04}" for index in range(1000, 1064)]
    lock = outbox_statements.lock_claims_by_key_query().compile(gate.engine)
    plan = _prepared_plan(gate, str(lock), lock.construct_params({"ids": ids}), plan_mode)
    assert "Seq Scan" not in plan, plan
    assert re.search(r"Index Scan using pk_qg_outbox .*rows=1 loops=64", plan), plan
    # The batch's writes, one statement since decision 259: the outbox and request rows by
    # one array of ids.
    record = outbox_statements.record_by_arrays_statement().compile(gate.engine)
    plan = _prepared_plan(gate, str(record), record.construct_params({
        "now": 1.0, "actor": "w", "delivered": "delivered", "reserved": "reserved",
        "binding_ids": ids, "binding_targets": ["t"] * 64, "binding_names": ids,
        "binding_uids": [None] * 64, "binding_tokens": [1] * 64, "marked": ids,
        "audit_tenants": ["team-a"] * 64, "audit_reasons": ["fencing_token=1"] * 64,
    }), plan_mode)
    # Whatever the scan: the ids are one value, not an array built for each row.
    assert "ARRAY[" not in plan, plan
    assert re.search(r"Update on qg_outbox .*rows=0 loops=1", plan), plan
    assert re.search(r"Update on qg_request .*rows=0 loops=1", plan), plan
    assert re.search(r"Insert on qg_binding .*rows=0 loops=1", plan), plan
    begin = release_statements.begin_stop_statement().compile(gate.engine)
    plan = _prepared_plan(gate, str(begin), begin.construct_params(
        {"id": "b-1000", "current": "reserved", "to_state": "cancelling", "now": 1.0,
         "reason": "x"}), plan_mode)
    assert "Seq Scan" not in plan and "ix_qg_request_state" not in plan, plan
    assert "Index Scan using pk_qg_request" in plan, plan


CLAIMABLE_INDEX = "ix_qg_outbox_delivered_stopping_next_attempt_at_request_id"
STOPS_INDEX = "ix_qg_outbox_stopping_delivered_next_attempt_at_request_id"


def test_the_claimable_read_follows_its_index_without_a_sort_once_analyzed(
    gate: Quotagate,
) -> None:
    """The next delivery batch is the first rows of the claimable index, in its order, on
    every engine: no sort of the whole undelivered backlog (docs/decisions/257). With the
    ``(delivered, next_attempt_at)`` index PostgreSQL sorted each run of ``next_attempt_at``
    by id (an incremental sort), SQLite built a temporary B-tree for the id, and
    MariaDB walked ``(stopping, next_attempt_at)``, every delivered row included; now it
    reads in order through an index whose two first columns are both flags. Each engine
    may take either of the two such indexes: both serve the read alike."""
    from quotagate.store import outbox_statements
    from quotagate.store.dialect import supports_skip_locked

    _submit_burst(gate, 3000)
    assert gate.admit_until_idle(batch=256) == 3000
    name = gate.engine.dialect.name
    with gate.engine.begin() as connection:
        connection.exec_driver_sql({"postgresql": "ANALYZE qg_outbox",
                                    "mysql": "ANALYZE TABLE qg_outbox"}.get(name, "ANALYZE"))
    query = outbox_statements.claimable_query(name, False, 64, supports_skip_locked(gate.engine))
    compiled = query.compile(gate.engine, compile_kwargs={"literal_binds": True})
    with gate.engine.connect() as connection:
        if name == "postgresql":
            plan = "\n".join(row[0] for row in connection.exec_driver_sql(f"EXPLAIN {compiled}"))
            # Either index that leads with both flags serves the read alike.
            assert re.search(f"Index Scan using ({CLAIMABLE_INDEX}|{STOPS_INDEX})", plan), plan
            assert "Sort" not in plan and "Seq Scan" not in plan, plan
        elif name == "mysql":
            rows = connection.exec_driver_sql(f"EXPLAIN {compiled}").mappings().all()
            outbox = [row for row in rows if row["table"] == "qg_outbox"]
            # Either index that leads with both flags: never the walk of all delivered rows.
            assert outbox and all(row["key"] in (CLAIMABLE_INDEX, STOPS_INDEX)
                                  and int(row["key_len"]) == 2 for row in outbox), rows
            assert not any("filesort" in (row["Extra"] or "") for row in outbox), rows
        else:
            plan = "\n".join(str(row[-1]) for row in
                             connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
            assert re.search(f"USING INDEX ({CLAIMABLE_INDEX}|{STOPS_INDEX}) "
                             r"\((delivered=\? AND stopping=\?|stopping=\? AND delivered=\?)\)",
                             plan), plan
            assert "TEMP B-TREE" not in plan, plan


@pytest.mark.parametrize("plan_mode", ["custom", "generic"])
def test_a_claim_in_one_statement_finds_its_rows_by_one_id_array_before_any_analyze(
    gate: Quotagate, plan_mode: str,
) -> None:
    """PostgreSQL, 3,000 outbox rows its statistics do not know yet: the one-statement
    claim (docs/decisions/259) finds the rows its CTEs locked again by one array of their
    ids (an InitPlan), as decision 254's claim UPDATE did by its array parameter, never by
    joining the CTE, which read the whole outbox and the requests into hashes. The
    generic plan (which the server keeps after the first runs: it is estimated far
    cheaper than the plan for the values) walks the claimable index and stops at the
    batch; the plan for the values sorts the backlog it does not know."""
    if gate.engine.dialect.name != "postgresql":
        pytest.skip("only PostgreSQL claims in one statement (claims_in_one_statement)")
    from quotagate.store import outbox_statements

    _submit_burst(gate, 3000)
    assert gate.admit_until_idle(batch=256) == 3000
    claim = outbox_statements.claim_due_statement(64, True, True).compile(gate.engine)
    plan = _prepared_plan(gate, str(claim), claim.construct_params(
        {"owner": "w", "generation": 1, "until": 1.0}), plan_mode)
    assert re.search(r"Update on qg_outbox .*rows=64 loops=1", plan), plan
    assert "InitPlan" in plan and "Hash Join" not in plan, plan
    if plan_mode == "generic":
        assert re.search(f"Index Scan using ({CLAIMABLE_INDEX}|{STOPS_INDEX}) "
                         "on qg_outbox qg_outbox_2", plan), plan  # the deliveries' CTE
        assert "Sort Key: qg_outbox_2" not in plan, plan


def _submit_burst(gate: Quotagate, count: int) -> None:
    """``count`` waiting one-gpu requests of team-a, ``b-0000`` on, submitted 500 at a time
    (a burst the statistics do not know yet), with room for all of them."""
    gate.set_pool("main", {"gpu": 10**6})
    gate.set_tenant("team-a", {"gpu": 10**6})
    for start in range(0, count, 500):
        gate.submit_many("team-a", [{"id": f"b-{index:04}", "cost": {"gpu": 1}}
                                    for index in range(start, min(start + 500, count))])


def _prepared_plan(gate: Quotagate, sql: str, parameters: dict[str, object],
                   plan_mode: str) -> str:
    """``EXPLAIN (ANALYZE)`` of ``sql`` run as a prepared statement, rolled back."""
    from psycopg import sql as psycopg_sql

    raw = gate.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(f"SET LOCAL plan_cache_mode = force_{plan_mode}_plan")
        names: list[str] = []
        numbered = re.sub(r"%\((\w+)\)s", lambda found: f"${_number(names, found.group(1))}",
                          sql)
        cursor.execute(f"PREPARE checked AS {numbered}")
        values = ", ".join(psycopg_sql.Literal(parameters[name]).as_string(cursor)
                           for name in names)
        cursor.execute(f"EXPLAIN (ANALYZE) EXECUTE checked({values})")
        return "\n".join(row[0] for row in cursor.fetchall())
    finally:
        raw.rollback()
        # A prepared statement outlives the transaction: the pooled connection's next
        # plan prepares under the same name.
        raw.cursor().execute("DEALLOCATE ALL")
        raw.close()
