"""Property-based: whatever the OpenAPI schema allows, the server never answers 5xx.

Bounded (a few dozen examples per operation) and on SQLite only: the point is
the HTTP layer's handling of odd input, which does not depend on the backend.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from support.databases import fresh_database
from support.http_servers import bearer, make_token, running_server

schemathesis = pytest.importorskip("schemathesis")

EXAMPLES_PER_OPERATION = 25


def test_no_generated_request_gets_a_server_error(tmp_path: Path) -> None:
    with fresh_database("sqlite", tmp_path) as db_url:
        admin = make_token(db_url)
        tenant = make_token(db_url, tenant="team-a")
        with running_server(db_url, tmp_path) as server:
            headers = bearer(admin)
            httpx.put(f"{server.url}/v1/pools/main", json={"capacity": {"gpu": 8}},
                      headers=headers).raise_for_status()
            httpx.put(f"{server.url}/v1/tenants/team-a", json={"quota": {"gpu": 2}},
                      headers=headers).raise_for_status()
            schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
            operations = [result.ok() for result in schema.get_all_operations()]
            assert len(operations) >= 12
            statuses: list[int] = []
            for operation in operations:
                _exercise(operation, [admin, tenant], statuses)
    # The test ran requests, and they reached past the validation layer.
    assert len(statuses) >= 5 * len(operations)
    assert {200, 400, 404, 422} <= set(statuses), sorted(set(statuses))


def _exercise(operation: object, tokens: list[str], statuses: list[int]) -> None:
    # Schema-conforming requests and, where the schema constrains anything,
    # requests that break it on purpose.
    modes = [schemathesis.GenerationMode.POSITIVE]
    if operation.path_parameters or operation.query or operation.body:  # type: ignore[attr-defined]
        modes.append(schemathesis.GenerationMode.NEGATIVE)
    cases = st.one_of(*(operation.as_strategy(mode) for mode in modes))  # type: ignore[attr-defined]

    @given(case=cases, token=st.sampled_from(tokens))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
    )
    def never_a_server_error(case: object, token: str) -> None:
        response = case.call(headers=bearer(token), timeout=30)  # type: ignore[attr-defined]
        statuses.append(response.status_code)
        label = f"{case.method} {case.formatted_path}"  # type: ignore[attr-defined]
        assert response.status_code < 500, f"{label}: {response.status_code} {response.text}"
        if response.status_code >= 400:
            body = response.json()
            assert set(body) >= {"code", "message"}, f"{label}: {body}"

    never_a_server_error()
