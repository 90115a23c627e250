"""The admission-wait metric's read of submission times, on every backend.

``serve``'s wait observer reads the submission time of every admitted request
after the admission passes (quotagate.http.service._WaitObserver): one
primary-key read that takes no lock, sent as one statement with no read
deadline or transaction of its own around it (docs/decisions/056).
"""

from __future__ import annotations

import sqlalchemy as sa

from quotagate import Quotagate


def test_submission_times_are_read_in_one_statement(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 4})
    for request_id in ("job-1", "job-2"):
        gate.submit(request_id, "team-a", {"gpu": 1})
    admitted = gate.admit(10)
    assert sorted(placement.id for placement in admitted) == ["job-1", "job-2"]
    statements: list[str] = []

    def note(_connection: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    sa.event.listen(gate.engine, "before_cursor_execute", note)
    try:
        created = gate.submitted_at(["job-1", "job-2", "never-submitted"])
    finally:
        sa.event.remove(gate.engine, "before_cursor_execute", note)
    assert created == {request_id: gate.show(request_id).created
                       for request_id in ("job-1", "job-2")}
    # SQLite keeps its transaction (its BEGIN is sent through the cursor, by
    # quotagate.store.engine); nothing else is sent but the read itself.
    assert [statement for statement in statements if statement != "BEGIN"] == statements[-1:]
    assert len(statements) == (2 if gate.engine.dialect.name == "sqlite" else 1), statements
    assert gate.submitted_at([]) == {}
