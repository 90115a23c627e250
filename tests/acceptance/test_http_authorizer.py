"""A deployment replaces the authorizer hook: every decision goes through it.

The app is built with ``create_app(gate, authorizer=...)`` and served by a real
uvicorn server (in a thread, so the test can hold the hook), over HTTP.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from quotagate import Quotagate
from quotagate.auth.authorizer import Actor
from quotagate.http import create_app
from support.databases import fresh_database
from support.http_servers import bearer, make_token, serving


def test_a_replaced_authorizer_decides_every_operation(tmp_path: Path) -> None:
    decisions: list[tuple[str | None, str, str]] = []

    def read_only_tenants(tenant: str | None, actor: Actor, operation: str) -> bool:
        decisions.append((tenant, actor.name, operation))
        if actor.admin:
            return True
        return actor.tenant == tenant and operation in ("request.read", "request.list")

    with fresh_database("sqlite", tmp_path) as db_url, Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 2})
        gate.set_tenant("team-a", {"gpu": 1})  # the app alone runs no admission: all wait
        gate.submit("job-1", "team-a", {"gpu": 1})
        admin, tenant = make_token(db_url), make_token(db_url, tenant="team-a")
        tenant_actor = f"token:{tenant.split('_')[1]}"
        with serving(create_app(gate, authorizer=read_only_tenants)) as url:
            requests = f"{url}/v1/tenants/team-a/requests"
            assert httpx.get(f"{requests}/job-1", headers=bearer(tenant)).status_code == 200
            refused = httpx.post(requests, json={"id": "job-2", "cost": {"gpu": 1}},
                                 headers=bearer(tenant))
            assert refused.status_code == 403
            hidden = httpx.post(f"{requests}/job-1/cancel", headers=bearer(tenant))
            assert hidden.status_code == 404
            allowed = httpx.post(requests, json={"id": "job-2", "cost": {"gpu": 1}},
                                 headers=bearer(admin))
            assert allowed.status_code == 202
    assert decisions[:3] == [
        ("team-a", tenant_actor, "request.read"),
        ("team-a", tenant_actor, "request.submit"),
        ("team-a", tenant_actor, "request.cancel"),
    ]
    assert decisions[3][2] == "request.submit"
