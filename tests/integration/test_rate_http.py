"""Rate quotas over real HTTP (uvicorn on a loopback port), on every ledger database."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from quotagate import Quotagate, RateLimited
from quotagate.auth.tokens import TokenStore
from quotagate.http.app import create_app
from quotagate.http.routers.rate import rate_limit_headers


class Api:
    def __init__(self, gate: Quotagate, url: str) -> None:
        self.gate = gate
        self.url = url
        tokens = TokenStore(gate.engine, clock=gate.clock)
        self.admin = {"Authorization": "Bearer " + tokens.create(admin=True, actor="test").token}
        self.team_a = {"Authorization": "Bearer " + tokens.create(
            admin=False, tenant="team-a", actor="test").token}

    def call(self, method: str, path: str, headers: dict[str, str], body: Any = None) -> Any:
        return httpx.request(method, self.url + path, headers=headers, json=body, timeout=30)


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 10})
        gate.set_tenant("team-a", {"gpu": 10})
        server = uvicorn.Server(uvicorn.Config(create_app(gate), host="127.0.0.1", port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        try:
            yield Api(gate, f"http://127.0.0.1:{port}")
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def test_rate_quota_over_http_from_shape_to_429_to_top_up(api: Api) -> None:
    shaped = api.call("PUT", "/v1/tenants/team-a/rate", api.admin,
                      {"capacity": 1, "refill_per_second": 0})
    assert shaped.status_code == 200, shaped.text
    assert shaped.json()["rate"] == {"capacity": 1, "refill_per_second": 0.0, "tokens": 1.0}

    submit = {"id": "job-1", "cost": {"gpu": 1}}
    assert api.call("POST", "/v1/tenants/team-a/requests", api.team_a, submit).status_code == 202
    refused = api.call("POST", "/v1/tenants/team-a/requests", api.team_a,
                       {"id": "job-2", "cost": {"gpu": 1}})
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "rate_quota_exhausted"
    assert int(refused.headers["Retry-After"]) >= 1
    state = api.call("GET", "/v1/tenants/team-a/requests/job-2", api.team_a)
    assert state.json()["state"] == "rejected"

    seen = api.call("GET", "/v1/tenants/team-a/rate", api.team_a)
    assert seen.status_code == 200
    assert seen.json()["rate"]["tokens"] == 0
    # A tenant cannot refill or reshape its own bucket.
    assert api.call("POST", "/v1/tenants/team-a/tokens", api.team_a,
                    {"add": 3}).status_code == 403
    assert api.call("PUT", "/v1/tenants/team-a/rate", api.team_a,
                    {"capacity": 100}).status_code == 403

    topped = api.call("POST", "/v1/tenants/team-a/tokens", api.admin, {"add": 3})
    assert topped.status_code == 200, topped.text
    assert topped.json()["rate"]["tokens"] == 1  # capped at capacity
    again = api.call("POST", "/v1/tenants/team-a/requests", api.team_a,
                     {"id": "job-2", "cost": {"gpu": 1}})
    assert again.status_code == 202, again.text
    assert again.json()["state"] == "waiting"

    assert api.call("DELETE", "/v1/tenants/team-a/rate", api.admin).json()["rate"] is None
    assert api.call("POST", "/v1/tenants/team-a/requests", api.team_a,
                    {"id": "job-3", "cost": {"gpu": 1}}).status_code == 202


@pytest.mark.parametrize(("body", "status"), [
    ({"capacity": -1}, 400),
    ({"capacity": 5, "refill_per_second": -1}, 400),
    ({"capacity": 0}, 400),
    ({"capacity": "5"}, 422),
    ({"capacity": True}, 422),
    ({"capacity": 5, "burst": 2}, 422),
    ({}, 422),
])
def test_bad_rate_bodies_are_refused_and_change_nothing(
    api: Api, body: dict[str, Any], status: int
) -> None:
    api.call("PUT", "/v1/tenants/team-a/rate", api.admin, {"capacity": 4, "refill_per_second": 1})
    answer = api.call("PUT", "/v1/tenants/team-a/rate", api.admin, body)
    assert answer.status_code == status, answer.text
    rate = api.call("GET", "/v1/tenants/team-a/rate", api.admin).json()["rate"]
    assert (rate["capacity"], rate["refill_per_second"]) == (4, 1)
    assert api.call("POST", "/v1/tenants/team-a/tokens", api.admin,
                    {"add": 0}).status_code == 400
    assert api.call("PUT", "/v1/tenants/nobody/rate", api.admin,
                    {"capacity": 1}).status_code == 404


def test_put_tenant_takes_a_rate_and_get_tenant_shows_tokens_left(api: Api) -> None:
    put = api.call("PUT", "/v1/tenants/team-b", api.admin,
                   {"quota": {"gpu": 2}, "rate": {"capacity": 5, "refill_per_second": 0}})
    assert put.status_code == 200, put.text
    assert put.json()["rate"] == {"capacity": 5, "refill_per_second": 0.0, "tokens": 5.0}
    # Without "rate" the bucket stays; a bad one changes nothing; null removes it.
    kept = api.call("PUT", "/v1/tenants/team-b", api.admin, {"quota": {"gpu": 3}})
    assert kept.json()["rate"]["capacity"] == 5
    bad = api.call("PUT", "/v1/tenants/team-b", api.admin,
                   {"quota": {"gpu": 9}, "rate": {"capacity": -1}})
    assert bad.status_code == 400
    got = api.call("GET", "/v1/tenants/team-b", api.admin).json()
    assert got["quota"]["gpu"]["cap"] == 3
    assert got["rate"]["tokens"] == 5
    removed = api.call("PUT", "/v1/tenants/team-b", api.admin, {"rate": None})
    assert removed.json()["rate"] is None
    assert api.call("GET", "/v1/tenants/team-a", api.team_a).json()["rate"] is None


def test_rate_limit_headers_for_a_429() -> None:
    error = RateLimited("no", retry_after=2.2, capacity=5.0, tokens_left=0.4)
    assert rate_limit_headers(error) == {
        "RateLimit-Limit": "5", "RateLimit-Remaining": "0", "RateLimit-Reset": "3"}
