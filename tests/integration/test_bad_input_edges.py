"""Hostile inputs at the ledger: each is a clear error that writes nothing, on every backend.

The HTTP side of the same inputs is in tests/acceptance/test_http_edges.py.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate import InvalidInput, NotFound, Quotagate, RequestState
from quotagate.store import schema
from quotagate.store.listing import encode_cursor, list_audit, list_requests
from support.cli import run
from support.ledger_state import count, snapshot


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_tenant("team-b", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 8})
    return gate


@pytest.mark.parametrize(
    ("request_id", "tenant", "code"),
    [
        ("job-1\n", "team-a", "invalid_request_id"),
        ("job-1", "team-a\n", "invalid_tenant_name"),
        ("job-1\r\n", "team-a", "invalid_request_id"),
    ],
)
def test_a_name_ending_in_a_newline_is_refused(
    ledger: Quotagate, request_id: str, tenant: str, code: str
) -> None:
    before = snapshot(ledger)
    with pytest.raises(InvalidInput) as error:
        ledger.submit(request_id, tenant, {"gpu": 1})
    assert error.value.code == code
    assert snapshot(ledger) == before


def test_a_tenant_or_pool_name_ending_in_a_newline_is_refused(ledger: Quotagate) -> None:
    before = snapshot(ledger)
    with pytest.raises(InvalidInput) as tenant_error:
        ledger.set_tenant("team-c\n", {"gpu": 1})
    with pytest.raises(InvalidInput) as pool_error:
        ledger.set_pool("pool-2\n", {"gpu": 1})
    with pytest.raises(InvalidInput) as resource_error:
        ledger.set_tenant("team-c", {"gpu\n": 1})
    assert tenant_error.value.code == "invalid_tenant_name"
    assert pool_error.value.code == "invalid_pool_name"
    assert resource_error.value.code == "invalid_resource"
    assert snapshot(ledger) == before


@pytest.mark.parametrize("payload", ["\ud800", {"text": "a\udfffb"}, {"\udc00": 1}, ["\ud83d"]])
def test_a_payload_with_a_lone_surrogate_is_refused(ledger: Quotagate, payload: object) -> None:
    before = snapshot(ledger)
    with pytest.raises(InvalidInput) as error:
        ledger.submit("job-1", "team-a", {"gpu": 1}, payload=payload)
    assert error.value.code == "invalid_payload"
    assert "surrogate" in error.value.message
    assert snapshot(ledger) == before


def test_a_payload_with_a_surrogate_pair_character_is_kept(ledger: Quotagate) -> None:
    # The same code points as a pair are one astral character: valid text.
    ledger.submit("job-1", "team-a", {"gpu": 1}, payload={"emoji": "\U0001f600"})
    assert ledger.show("job-1").payload == {"emoji": "\U0001f600"}


def test_ids_and_names_compare_case_sensitively(ledger: Quotagate) -> None:
    """MariaDB's default collation would find ``job-1`` under ``JOB-1``."""
    ledger.submit("JOB-1", "team-a", {"gpu": 1})
    with pytest.raises(NotFound):
        ledger.show("job-1")
    # Another tenant's differently cased id is another request, not "taken".
    created = ledger.submit("Job-1", "team-b", {"gpu": 1})
    assert created.created
    assert ledger.show("Job-1").tenant == "team-b"
    assert ledger.show("JOB-1").tenant == "team-a"
    assert count(ledger, schema.request) == 2


def test_lease_names_compare_case_sensitively(ledger: Quotagate) -> None:
    now = 1.0
    with ledger.engine.begin() as connection:
        connection.execute(sa.insert(schema.lease).values(name="Worker-A", expires_at=now))
        connection.execute(sa.insert(schema.lease).values(name="worker-a", expires_at=now))
        found = connection.execute(
            sa.select(schema.lease.c.name).where(schema.lease.c.name == "WORKER-A")
        ).all()
    assert found == []


@pytest.mark.parametrize("reason", ["stopped\x00here", "bad \ud800 text", "x" * 1025])
def test_a_reason_with_a_nul_a_surrogate_or_too_long_is_refused(
    ledger: Quotagate, reason: str
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit_until_idle()
    before = snapshot(ledger)
    with pytest.raises(InvalidInput) as error:
        ledger.fail("job-1", reason)
    assert error.value.code == "invalid_input"
    assert snapshot(ledger) == before
    assert ledger.show("job-1").state == RequestState.RESERVED


def _forged(text: bytes) -> str:
    return base64.urlsafe_b64encode(text).decode()


FORGED_REQUEST_CURSORS = [
    _forged(b"[1e30,\"job-1\"]"),
    _forged(b"[NaN,\"job-1\"]"),
    _forged(b"[1e999,\"job-1\"]"),
    _forged(b"[-Infinity,\"job-1\"]"),
    _forged(b"[1800000000.0,\"job\\u0000-1\"]"),
    _forged(b"[1800000000.0,\"job-1\\n\"]"),
    _forged(b"[1800000000.0,\"" + b"j" * 200 + b"\"]"),
    _forged(b"[1800000000.0,\"\\ud800\"]"),
    _forged(b"[-5.0,\"job-1\"]"),
    "not base64 at all \x00",
]


@pytest.mark.parametrize("cursor", FORGED_REQUEST_CURSORS)
def test_a_forged_request_cursor_is_invalid_cursor(ledger: Quotagate, cursor: str) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 1})
    with pytest.raises(InvalidInput) as error:
        list_requests(ledger.engine, "team-a", cursor=cursor)
    assert error.value.code == "invalid_cursor"


@pytest.mark.parametrize(
    "cursor",
    [_forged(b"[1e30]"), _forged(b"[NaN]"), _forged(b"[1e999]"),
     _forged(b"[" + str(2**70).encode() + b"]"), _forged(b"[-1]"), _forged(b"[\"\\u0000\"]")],
)
def test_a_forged_audit_cursor_is_invalid_cursor(ledger: Quotagate, cursor: str) -> None:
    with pytest.raises(InvalidInput) as error:
        list_audit(ledger.engine, cursor=cursor)
    assert error.value.code == "invalid_cursor"


def test_a_cursor_this_api_returned_still_pages(ledger: Quotagate) -> None:
    for number in range(3):
        ledger.submit(f"job-{number}", "team-a", {"gpu": 1})
    first = list_requests(ledger.engine, "team-a", limit=2)
    assert first.next_cursor is not None
    rest = list_requests(ledger.engine, "team-a", cursor=first.next_cursor, limit=2)
    seen = [item.id for item in first.items + rest.items]
    assert sorted(seen) == ["job-0", "job-1", "job-2"]
    assert rest.next_cursor is None
    # The encoder's own shape round-trips through the stricter decoder.
    assert list_requests(ledger.engine, "team-a",
                         cursor=encode_cursor([1_900_000_000.0, "job-9"])).items


def test_sql_parameters_never_reach_a_database_error(
    ledger: Quotagate, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "payload-secret-7f3a"
    statement = sa.insert(schema.audit).values(
        id=1, at=1.0, actor=secret, operation="probe", outcome="ok")
    caplog.set_level(logging.DEBUG, logger="sqlalchemy")
    with pytest.raises(sa.exc.IntegrityError) as error, ledger.engine.begin() as connection:
        connection.execute(statement)
        connection.execute(statement)  # the same primary key twice
    assert secret not in str(error.value)
    assert "hidden due to hide_parameters" in str(error.value)
    assert secret not in caplog.text


def test_check_reports_a_lowered_cap_as_over_cap_not_a_violation(
    ledger: Quotagate, db_url: str, tmp_path: Path
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 3})
    assert ledger.admit_until_idle() == 1
    ledger.set_tenant("team-a", {"gpu": 1})  # lowering below use is allowed
    result = ledger.check_ledger()
    assert result.violations == []
    assert result.over_cap == ["tenant team-a gpu: used 3 > cap 1"]
    answer = run("check", db=db_url, cwd=tmp_path)
    assert "over cap" in answer.stdout and "tenant team-a gpu: used 3 > cap 1" in answer.stdout
    assert "violation" not in answer.stderr
    # A real break of the accounting still fails the check.
    with ledger.engine.begin() as connection:
        connection.execute(sa.update(schema.tenant_quota).values(used=2)
                           .where(schema.tenant_quota.c.tenant == "team-a"))
    broken = run("check", db=db_url, cwd=tmp_path, expect=1)
    assert "violation: tenant team-a gpu: used 2 but reserved requests cost 3" in broken.stderr
