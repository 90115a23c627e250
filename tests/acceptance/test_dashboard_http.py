"""The dashboard's endpoints and files, the Grafana board's metrics, and 503 on a slow store.

Through a real `quotagate serve` per backend, as the page and `quotagate top` reach it.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.http.routers.dashboard import UI_DIRECTORY
from quotagate.store.engine import create_engine
from support.databases import BACKENDS, fresh_database
from support.http_servers import Server, bearer, make_token, running_server
from support.streams import shared_redis_url, stream_gate, tenant_with_quota
from support.waiting import wait_for

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "quotagate.json"


@dataclass
class Ledger:
    server: Server
    db_url: str
    admin: dict[str, str]
    team_a: str
    team_b: str

    def get(self, path: str, headers: dict[str, str] | None = None,
            **params: str) -> httpx.Response:
        return httpx.get(f"{self.server.url}{path}", headers=headers, params=params or None,
                         timeout=30)

    def tenant_token(self, tenant: str) -> dict[str, str]:
        return bearer(make_token(self.db_url, tenant=tenant))


@pytest.fixture(scope="module", params=BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """Two tenants of quota 1 with two requests each: one admitted, one waiting."""
    tmp_path = tmp_path_factory.mktemp(f"dashboard-{request.param}")
    with fresh_database(str(request.param), tmp_path) as db_url:
        suffix = uuid.uuid4().hex[:6]
        team_a, team_b = f"a-{suffix}", f"b-{suffix}"
        with Quotagate.connect(db_url) as gate:
            _two_tenants(gate, team_a, team_b)
        with running_server(db_url, tmp_path) as server:
            ledger = Ledger(server, db_url, bearer(make_token(db_url)), team_a, team_b)
            wait_for(lambda: ledger.get("/v1/dashboard", ledger.admin).json()["waiting"] == 2,
                     "the admission loop to admit one request per tenant")
            yield ledger


def _two_tenants(gate: Quotagate, team_a: str, team_b: str) -> None:
    gate.set_pool("main", {"gpu": 4})
    for tenant in (team_a, team_b):
        gate.set_tenant(tenant, {"gpu": 1})
        gate.submit(f"{tenant}-1", tenant, {"gpu": 1})
        gate.submit(f"{tenant}-2", tenant, {"gpu": 1})


def test_an_admin_sees_every_tenant_and_a_tenant_only_its_own(ledger: Ledger) -> None:
    a, b = ledger.team_a, ledger.team_b
    everything = ledger.get("/v1/dashboard", ledger.admin).json()
    assert everything["admin"] is True and everything["tenant"] is None
    assert {row["name"] for row in everything["tenants"]} == {a, b}
    assert {entry["id"] for entry in everything["queue"]} == {f"{a}-2", f"{b}-2"}
    own = ledger.get("/v1/dashboard", ledger.tenant_token(a)).json()
    assert own["admin"] is False and own["tenant"] == a
    assert {row["name"] for row in own["tenants"]} == {a}
    assert [entry["id"] for entry in own["queue"]] == [f"{a}-2"]
    assert {entry["tenant"] for entry in own["decisions"]} == {a}
    assert {entry["tenant"] for entry in own["deliveries"]} == {a}
    narrowed = ledger.get("/v1/dashboard", ledger.admin, tenant=b).json()
    assert [entry["id"] for entry in narrowed["queue"]] == [f"{b}-2"]


def test_a_tenant_cannot_reach_another_tenants_view_or_request(ledger: Ledger) -> None:
    a, b = ledger.team_a, ledger.team_b
    headers = ledger.tenant_token(a)
    other = ledger.get("/v1/dashboard", headers, tenant=b)
    assert other.status_code == 403
    assert other.json()["code"] == "forbidden"
    story = ledger.get(f"/v1/dashboard/requests/{b}/{b}-1", headers)
    assert story.status_code == 404
    assert story.json() == {"code": "unknown_request",
                            "message": f"request '{b}-1' does not exist"}
    # Another tenant's id under one's own tenant is no way round it.
    sideways = ledger.get(f"/v1/dashboard/requests/{a}/{b}-1", headers)
    assert sideways.status_code == 404
    mine = ledger.get(f"/v1/dashboard/requests/{a}/{a}-1", headers)
    assert mine.status_code == 200
    assert [entry["operation"] for entry in mine.json()["history"]] == ["submit", "admit"]
    assert mine.json()["delivery"]["fencing_token"] >= 0


def test_a_tenant_named_that_does_not_exist_is_404_not_empty_views(ledger: Ledger) -> None:
    # A typo used to answer 200 with empty tenant views, as if the tenant had nothing.
    misspelt = ledger.get("/v1/dashboard", ledger.admin, tenant=f"{ledger.team_a}x")
    assert misspelt.status_code == 404, misspelt.text
    assert misspelt.json()["code"] == "unknown_tenant"
    # A token may be made before its tenant: its own scope still answers, empty.
    early = ledger.get("/v1/dashboard", ledger.tenant_token(f"later-{ledger.team_a}"))
    assert early.status_code == 200 and early.json()["tenants"] == [], early.text


def test_a_wrong_token_is_refused_with_the_apis_message(ledger: Ledger) -> None:
    response = ledger.get("/v1/dashboard", bearer("qg_nope_nope"))
    assert response.status_code == 401
    body = response.json()
    assert body["code"] and body["message"]
    assert ledger.get("/v1/dashboard").status_code == 401


def test_the_page_is_served_from_the_package_with_a_strict_content_policy(
    ledger: Ledger,
) -> None:
    page = ledger.get("/ui/")
    assert page.status_code == 200
    assert 'name="token"' in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    # Everything the page loads is one of its own files: no CDN.
    assets = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
    assert {"app.js", "style.css"} <= set(assets)
    for asset in assets:
        assert "//" not in asset, asset
        assert ledger.get(f"/ui/{asset}").status_code == 200, asset
    assert {path.name for path in UI_DIRECTORY.iterdir()} >= {"index.html", "app.js", "style.css"}


def _queried_metrics(dashboard: dict[str, object]) -> set[str]:
    expressions: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "definition", "query") and isinstance(value, str):
                    expressions.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return {name for text in expressions for name in re.findall(r"\bquotagate_[a-z0-9_]+", text)}


def _exported(exposition: str) -> set[str]:
    """Every series name /metrics can carry, from its `# TYPE` lines."""
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE):
        names.add(name)
        if kind == "counter":
            names |= {f"{name}_total", f"{name}_created"}
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    return names


def test_every_metric_the_grafana_board_queries_is_exported_by_metrics(ledger: Ledger) -> None:
    dashboard = json.loads(GRAFANA.read_text())
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert "tenant" in variables
    queried = _queried_metrics(dashboard)
    assert len(queried) >= 20, queried
    exported = _exported(ledger.get("/metrics").text)
    assert queried - exported == set()
    # What production must record is on the board, preemptions by reason among it.
    assert {"quotagate_admission_reruns_total", "quotagate_admission_lock_wait_seconds_bucket",
            "quotagate_oldest_waiting_seconds", "quotagate_unconfirmed_stops",
            "quotagate_preempted_requests_total", "quotagate_outbox_backlog"} <= queried
    expressions = [target["expr"] for panel in dashboard["panels"]
                   for target in panel.get("targets", [])]
    assert any("quotagate_preempted_requests_total" in expression
               and "by (tenant, reason)" in expression for expression in expressions)
    # Every selector naming a tenant label filters by the tenant variable.
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for selector in re.findall(r"\{[^}]*\}", target["expr"]):
                assert "tenant" not in selector or 'tenant=~"$tenant"' in selector, target


@pytest.mark.postgresql
def test_a_view_or_scrape_blocked_by_the_database_answers_503_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL only: an ACCESS EXCLUSIVE lock blocks even plain reads, a stand-in
    # for a database too busy to answer.
    monkeypatch.setenv("QUOTAGATE_READ_TIMEOUT", "0.5")
    with fresh_database("postgresql", tmp_path) as db_url, running_server(
        db_url, tmp_path, args=["--no-workers"]
    ) as server:
        headers = bearer(make_token(db_url))
        url = f"{server.url}/v1/dashboard"
        assert httpx.get(url, headers=headers, timeout=30).status_code == 200
        locker = create_engine(db_url)
        locked, release = threading.Event(), threading.Event()

        def hold_lock() -> None:
            with locker.begin() as connection:
                connection.execute(sa.text("LOCK TABLE qg_request IN ACCESS EXCLUSIVE MODE"))
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        try:
            assert locked.wait(10)
            view = httpx.get(url, headers=headers, timeout=30)
            assert view.status_code == 503, view.text
            assert view.json()["code"] == "store_timeout"
            scrape = httpx.get(f"{server.url}/metrics", timeout=30)
            assert scrape.status_code == 503, scrape.text
            assert scrape.json()["code"] == "store_timeout"
        finally:
            release.set()
            holder.join(30)
            locker.dispose()
        assert httpx.get(url, headers=headers, timeout=30).status_code == 200


def test_the_streams_view_lists_every_topic_to_an_admin_and_its_own_to_a_tenant(
    ledger: Ledger,
) -> None:
    with stream_gate(ledger.db_url, shared_redis_url()) as gate:
        own, other = (tenant_with_quota(gate, prefix="dash") for _ in range(2))
        for tenant in (own, other):
            gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
        gate.streams.producer(own, "orders").send_many([("a", None), ("b", None)])
    everything = ledger.get("/v1/dashboard", ledger.admin).json()["streams"]
    assert everything["error"] is None
    assert {(row["tenant"], row["topic"]) for row in everything["topics"]} >= {
        (own, "orders"), (other, "orders")}
    mine = ledger.get("/v1/dashboard", ledger.tenant_token(own)).json()["streams"]
    assert mine["total"] == 1
    [row] = mine["topics"]
    assert (row["tenant"], row["topic"], row["length"], row["dlq"], row["groups"]) == (
        own, "orders", 2, 0, [])
    refused = ledger.get("/v1/dashboard", ledger.tenant_token(own), tenant=other)
    assert refused.status_code == 403
