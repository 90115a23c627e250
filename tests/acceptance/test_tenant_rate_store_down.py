"""A tenant change that also gives the tenant a rate, with the rate store down, changes nothing.

The tenant's row is written before its bucket can be shaped (the bucket needs the row):
with Redis down, ``tenant set T --quota … --rate …`` (and ``PUT /v1/tenants/T`` with a
``rate``) wrote the tenant and its quota, then said "no rate decision was made" — a
tenant meant to be limited was left unlimited. The store is now asked first.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from quotagate import NotFound, Quotagate
from support.cli import run
from support.http_servers import bearer, make_token, running_server
from support.redis_servers import RedisServer


@pytest.fixture
def dead_redis(tmp_path: Path) -> str:
    """The URL of a Redis that was there and is gone (nothing listens on its port)."""
    server = RedisServer(tmp_path / "redis")
    server.directory.mkdir()
    server.start()
    server.kill()
    return server.url


def test_tenant_set_with_a_rate_and_the_store_down_writes_no_tenant(
    db_url: str, dead_redis: str, tmp_path: Path
) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_tenant("team-a", {"gpu": 2})
        audited = gate.audit_size()
    for name in ("team-new", "team-a"):
        result = run("tenant", "set", name, "--quota", "gpu=9", "--rate", "capacity=5,refill=0",
                     "--rate-store", dead_redis, db=db_url, cwd=tmp_path, expect=6)
        assert result.stderr.startswith("error: rate_store_unavailable: "), result.stderr
        assert "Traceback" not in result.stderr
    with Quotagate.connect(db_url) as gate:
        with pytest.raises(NotFound):
            gate.tenant("team-new")
        assert gate.tenant("team-a")["quota"]["gpu"]["cap"] == 2  # the old quota, untouched
        assert gate.audit_size() == audited  # no change was recorded either

def test_put_tenant_with_a_rate_and_the_store_down_is_503_and_writes_no_tenant(
    db_url: str, dead_redis: str, tmp_path: Path
) -> None:
    headers = bearer(make_token(db_url))
    with running_server(db_url, tmp_path, args=["--rate-store", dead_redis]) as serve:
        response = httpx.put(f"{serve.url}/v1/tenants/team-new", headers=headers, timeout=30,
                             json={"quota": {"gpu": 9},
                                   "rate": {"capacity": 5, "refill_per_second": 0}})
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "rate_store_unavailable"
        missing = httpx.get(f"{serve.url}/v1/tenants/team-new", headers=headers, timeout=30)
        assert missing.status_code == 404, missing.text
        # Without a rate the store is not asked: the change goes through.
        plain = httpx.put(f"{serve.url}/v1/tenants/team-new", headers=headers, timeout=30,
                          json={"quota": {"gpu": 9}})
        assert plain.status_code == 200, plain.text
