"""The page at /ui/ in headless Chromium against a real `quotagate serve`, on every backend.

Each test signs in as a person would (typing a token into the form), changes
the ledger through the HTTP API like any client, and waits for the page to
show it by itself. Screenshots of every view, at 1280x800 and phone width, are
saved under the pytest tmp dir (the path is printed).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from quotagate import Quotagate
from quotagate.delivery.registry import TargetStore
from quotagate.domain.model import RequestState
from support.browser import DESKTOP, PHONE, chromium, collect_page_errors
from support.databases import BACKENDS, fresh_database
from support.executor import running_executor
from support.holds import contested_hold
from support.http_servers import Server, bearer, make_token, running_server
from support.streams import shared_redis_url
from support.waiting import wait_for

# The page polls once a second; this leaves room for a loaded test machine.
LIVE_TIMEOUT_MS = 5000
VIEWS = ("overview", "queue", "decisions", "delivery", "rates", "streams")


@dataclass
class Site:
    server: Server
    db_url: str
    admin_token: str
    admin: httpx.Client
    screenshots: Path

    @property
    def page_url(self) -> str:
        return f"{self.server.url}/ui/"

    def tenant(self, quota: dict[str, int], rate: str | None = None) -> tuple[str, str]:
        """A new tenant (and optionally a rate quota); its name and a token scoped to it."""
        name = f"t-{uuid.uuid4().hex[:8]}"
        response = self.admin.put(f"/v1/tenants/{name}", json={"quota": quota})
        assert response.status_code == 200, response.text
        if rate is not None:
            capacity, refill = rate.split(",")
            response = self.admin.put(f"/v1/tenants/{name}/rate", json={
                "capacity": int(capacity), "refill_per_second": float(refill)})
            assert response.status_code == 200, response.text
        return name, make_token(self.db_url, tenant=name)

    def submit(self, tenant: str, request_id: str, gpu: int = 1) -> httpx.Response:
        return self.admin.post(f"/v1/tenants/{tenant}/requests",
                               json={"id": request_id, "cost": {"gpu": gpu}})


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module", params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp_path = tmp_path_factory.mktemp(f"ui-{request.param}")
    screenshots = tmp_path_factory.mktemp(f"screenshots-{request.param}")
    with fresh_database(str(request.param), tmp_path) as db_url, running_executor() as executor:
        admin_token = make_token(db_url, label="dashboard test")
        with Quotagate.connect(db_url) as gate:
            # Delivered work keeps running at this executor while the tests look at it.
            TargetStore(gate.engine).set("executor", "webhook", {"url": executor}, default=True,
                                         actor="test")
        with running_server(db_url, tmp_path) as server, httpx.Client(
            base_url=server.url, headers=bearer(admin_token), timeout=30
        ) as admin:
            response = admin.put("/v1/pools/gpu-east", json={"capacity": {"gpu": 16}})
            assert response.status_code == 200, response.text
            print(f"\nscreenshots of the {request.param} run: {screenshots}")
            yield Site(server, db_url, admin_token, admin, screenshots)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=DESKTOP)
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    try:
        yield opened
    finally:
        context.close()


def sign_in(page: Any, site: Site, token: str) -> None:
    """Open the page and sign in with the keyboard: type the token, press Enter."""
    page.goto(site.page_url)
    token_input = page.locator("input[name=token]")
    token_input.wait_for()
    assert page.evaluate("document.activeElement.name") == "token"
    page.keyboard.type(token)
    page.keyboard.press("Enter")
    page.locator("#session").wait_for(state="visible")
    page.wait_for_function("() => document.getElementById('scope').textContent.length > 0")


def requests_href(tenant: str, request_id: str) -> str:
    return f"#/requests/{tenant}/{request_id}"


def row(page: Any, table: str, key: str) -> Any:
    return page.locator(f'#{table} tbody tr[data-key="{key}"]')


def test_an_admin_sees_every_view_and_each_is_photographed(page: Any, site: Site) -> None:
    errors = collect_page_errors(page)
    busy, _ = site.tenant({"gpu": 2})
    quiet, _ = site.tenant({"gpu": 4}, rate="2,0")
    for number in range(4):
        assert site.submit(busy, f"{busy}-job-{number}").status_code == 202
    assert site.submit(quiet, f"{quiet}-job-0", gpu=3).status_code == 202
    assert site.submit(quiet, f"{quiet}-job-1", gpu=3).status_code == 202
    assert site.submit(quiet, f"{quiet}-job-2").status_code == 429
    sign_in(page, site, site.admin_token)
    assert page.locator("#scope").inner_text() == "admin · all tenants"
    # The token is kept in this tab's sessionStorage only: no cookie, no localStorage, no URL.
    assert page.evaluate("sessionStorage.getItem('quotagate.token')") == site.admin_token
    assert page.evaluate("localStorage.length") == 0
    assert page.context.cookies() == [] and page.evaluate("document.cookie") == ""
    assert site.admin_token not in page.url
    # Both tenants' usage rows, each with a bar.
    row(page, "tenants", f"{busy}/gpu").wait_for()
    row(page, "tenants", f"{quiet}/gpu").wait_for()
    assert "2 / 2" in row(page, "tenants", f"{busy}/gpu").inner_text()
    assert row(page, "pools", "gpu-east/gpu").locator("[role=meter]").count() == 1
    for viewport, label in ((DESKTOP, "desktop"), (PHONE, "phone")):
        page.set_viewport_size(viewport)
        for view in VIEWS:
            page.goto(f"{site.page_url}#/{view}")
            page.locator(f"#view-{view}").wait_for(state="visible")
            page.wait_for_function(
                "() => document.getElementById('live').textContent.startsWith('updated')")
            page.screenshot(path=str(site.screenshots / f"{view}-{label}.png"))
            # Readable without scrolling sideways, at 1280x800 and at phone width.
            assert page.evaluate(
                "document.documentElement.scrollWidth <= window.innerWidth"), (view, label)
        page.goto(f"{site.page_url}#/requests/{busy}/{busy}-job-3")
        page.locator("#request-title").filter(has_text=f"{busy}-job-3").wait_for()
        page.screenshot(path=str(site.screenshots / f"request-waiting-{label}.png"),
                        full_page=True)
        # A delivered request's story: its binding and the fencing token it was delivered with.
        page.goto(f"{site.page_url}#/requests/{busy}/{busy}-job-0")
        page.locator("#request-binding").filter(has_text="Fencing token").wait_for(
            timeout=LIVE_TIMEOUT_MS)
        page.screenshot(path=str(site.screenshots / f"request-delivered-{label}.png"),
                        full_page=True)
    binding = site.admin.get(f"/v1/tenants/{busy}/requests/{busy}-job-0").json()["binding"]
    shown = page.locator("#request-binding").inner_text()
    assert binding["external_name"] in shown
    assert f"Fencing token\n{binding['fencing_token']}" in shown.replace("\t", "\n")
    # The waiting request's page says why it waits, as `explain` does.
    explained = site.admin.get(f"/v1/tenants/{busy}/requests/{busy}-job-3").json()["queue"]
    assert page.locator("#request-queue").inner_text().count(explained["reason"]) == 1
    assert errors == []
    # Semantic tables: every column has a header cell; the views are links a keyboard reaches.
    assert page.evaluate("""() => Array.from(document.querySelectorAll('table')).every(table =>
        table.tHead && table.tHead.rows[0].cells.length > 0 &&
        Array.from(table.tHead.rows[0].cells).every(cell => cell.tagName === 'TH'
                                                   && cell.scope === 'col'))""")
    page.goto(f"{site.page_url}#/overview")
    page.locator("#view-overview").wait_for(state="visible")
    page.focus('nav a[data-view="queue"]')
    page.keyboard.press("Enter")
    page.locator("#view-queue").wait_for(state="visible")
    # Signing out forgets the token.
    page.locator("#sign-out").click()
    page.locator("#sign-in").wait_for(state="visible")
    assert page.evaluate("sessionStorage.length") == 0
    assert page.context.cookies() == []


def test_a_tenant_sees_only_its_own_rows_and_cannot_open_another_tenants_request(
    page: Any, site: Site
) -> None:
    own, own_token = site.tenant({"gpu": 1})
    other, _ = site.tenant({"gpu": 1})
    for tenant in (own, other):
        assert site.submit(tenant, f"{tenant}-a").status_code == 202
        assert site.submit(tenant, f"{tenant}-b").status_code == 202
    sign_in(page, site, own_token)
    assert page.locator("#scope").inner_text() == f"tenant {own}"
    row(page, "tenants", f"{own}/gpu").wait_for()
    tenants_shown = page.locator("#tenants tbody tr").evaluate_all(
        "rows => rows.map(row => row.dataset.key)")
    assert tenants_shown == [f"{own}/gpu"]
    page.goto(f"{site.page_url}#/queue")
    row(page, "queue", f"{own}-b").wait_for()
    assert page.locator("#queue tbody tr").evaluate_all(
        "rows => rows.map(row => row.dataset.key)") == [f"{own}-b"]
    page.goto(f"{site.page_url}#/decisions")
    page.locator("#decisions tbody tr").first.wait_for()
    assert other not in page.locator("#decisions").inner_text()
    # Another tenant's request, even by its exact address, shows the API's refusal.
    page.goto(f"{site.page_url}#/requests/{other}/{other}-a")
    banner = page.locator("#error")
    banner.wait_for(state="visible")
    assert banner.inner_text() == f"request '{other}-a' does not exist"
    assert page.locator("#view-request").is_hidden()


def test_a_submit_appears_in_the_queue_and_moves_to_admitted_without_a_reload(
    page: Any, site: Site
) -> None:
    tenant, token = site.tenant({"gpu": 1})
    assert site.submit(tenant, f"{tenant}-first").status_code == 202
    sign_in(page, site, token)
    page.goto(f"{site.page_url}#/queue")
    page.locator("#view-queue").wait_for(state="visible")
    page.evaluate("window.notReloaded = true")
    request_id = f"{tenant}-second"
    assert site.submit(tenant, request_id).status_code == 202
    waiting = row(page, "queue", request_id)
    waiting.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert "tenant quota: gpu needs 1, 0 of 1 left" in waiting.inner_text()
    # Polls update rows in place: after two more polls the row is still the same element
    # (no flicker, no table rebuilt).
    element = waiting.element_handle()
    for _ in range(2):
        shown = page.locator("#live").inner_text()
        page.wait_for_function(f"() => document.getElementById('live').textContent !== {shown!r}",
                               timeout=LIVE_TIMEOUT_MS)
    assert element.evaluate("node => node.isConnected") is True
    # Make room: the admission loop admits it, and the page follows by itself.
    response = site.admin.put(f"/v1/tenants/{tenant}", json={"quota": {"gpu": 2}})
    assert response.status_code == 200, response.text
    waiting.wait_for(state="detached", timeout=LIVE_TIMEOUT_MS)
    page.goto(f"{site.page_url}#/requests/{tenant}/{request_id}")
    state = page.locator("#request-facts .badge").first
    state.wait_for()
    page.wait_for_function(
        "() => ['reserved', 'delivered'].includes("
        "document.querySelector('#request-facts .badge').textContent)", timeout=LIVE_TIMEOUT_MS)
    assert "pool=gpu-east" in page.locator("#story").inner_text()
    assert page.evaluate("window.notReloaded") is True


def test_moving_between_views_keeps_one_polling_loop(page: Any, site: Site) -> None:
    _, token = site.tenant({"gpu": 1})
    sign_in(page, site, token)
    for view in (*VIEWS, *VIEWS):
        page.goto(f"{site.page_url}#/{view}")
        page.locator(f"#view-{view}").wait_for(state="visible")
    polls: list[float] = []
    page.on("request", lambda request: polls.append(time.monotonic())
            if request.url.endswith("/v1/dashboard") else None)
    started = time.monotonic()
    page.wait_for_timeout(3000)
    elapsed = time.monotonic() - started
    # One loop polls once a second; ten navigations must not have left ten loops behind.
    assert 1 <= len(polls) <= elapsed + 1, polls


def test_a_refused_submit_appears_with_its_reason(page: Any, site: Site) -> None:
    tenant, token = site.tenant({"gpu": 4}, rate="1,0")
    sign_in(page, site, token)
    page.goto(f"{site.page_url}#/decisions")
    page.locator("#view-decisions").wait_for(state="visible")
    assert site.submit(tenant, f"{tenant}-ok").status_code == 202
    refused = site.submit(tenant, f"{tenant}-refused")
    assert refused.status_code == 429
    entry = page.locator("#decisions tbody tr").filter(has_text=f"{tenant}-refused")
    entry.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert entry.locator(".badge").inner_text() == "rejected"
    assert "rate quota exhausted" in entry.inner_text()


def test_a_wrong_token_shows_the_apis_message(page: Any, site: Site) -> None:
    expected = httpx.get(f"{site.server.url}/v1/dashboard", headers=bearer("qg_wrong_token"),
                         timeout=30).json()["message"]
    page.goto(site.page_url)
    page.locator("input[name=token]").fill("qg_wrong_token")
    page.locator("#sign-in-form button").click()
    message = page.locator("#sign-in-error")
    page.wait_for_function(
        "() => document.getElementById('sign-in-error').textContent.length > 0")
    assert message.inner_text() == expected
    assert page.locator("#sign-in").is_visible()
    # Nothing of the refused token is kept in the tab.
    assert page.evaluate("sessionStorage.length") == 0
    assert page.evaluate("document.cookie") == ""
    assert "qg_wrong_token" not in page.url


def test_a_tenant_sees_its_stream_topics_and_the_lag_falls_as_a_consumer_reads(
    page: Any, site: Site
) -> None:
    redis_url = shared_redis_url()
    tenant, token = site.tenant({"partitions": 2, "parallelism": 1})
    other, _ = site.tenant({"partitions": 2, "parallelism": 1})
    for name in (tenant, other):
        response = site.admin.put(f"/v1/tenants/{name}/topics/orders",
                                  json={"partitions": 1, "parallelism": 1, "max_len": 500})
        assert response.status_code == 200, response.text
    response = site.admin.post(f"/v1/tenants/{tenant}/topics/orders/messages",
                               json={"messages": [{"data": f"m{i}"} for i in range(3)]})
    assert response.status_code == 200, response.text
    sign_in(page, site, token)
    page.goto(f"{site.page_url}#/streams")
    topic = row(page, "topics", f"{tenant}/orders")
    topic.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert page.locator("#topics tbody tr").evaluate_all(
        "rows => rows.map(row => row.dataset.key)") == [f"{tenant}/orders"]
    assert topic.locator('td[data-label="Max length"]').inner_text() == "500"
    assert topic.locator('td[data-label="Length"]').inner_text() == "3"
    assert topic.locator('td[data-label="Lag"]').inner_text() == "\u2013"  # no group yet: a dash
    page.evaluate("window.notReloaded = true")
    lag = 'td[data-label="Lag"]'
    with Quotagate.connect(site.db_url, redis=redis_url) as gate, gate.streams.consumer(
            tenant, "orders", "billing", "c1", batch=1) as consumer:
        taken = wait_for(consumer.poll, "the consumer's first entry")
        topic.locator(lag).filter(has_text="2").wait_for(timeout=LIVE_TIMEOUT_MS)
        group = row(page, "stream-groups", f"{tenant}/orders/billing")
        assert "0: c1 (1)" in group.inner_text()
        consumer.settle(taken)
        wait_for(lambda: taken.extend(consumer.poll()) or len(taken) >= 3,
                 "the consumer's other two entries")
        topic.locator(lag).filter(has_text="0").wait_for(timeout=LIVE_TIMEOUT_MS)
        topic.locator('td[data-label="Pending"]').filter(has_text="2").wait_for(
            timeout=LIVE_TIMEOUT_MS)
    assert page.evaluate("window.notReloaded") is True
    assert other not in page.locator("#view-streams").inner_text()


def test_members_show_what_they_borrow_and_lend_and_a_reclaim_shows_its_reason(
    page: Any, site: Site
) -> None:
    cohort = f"c-{uuid.uuid4().hex[:8]}"
    response = site.admin.put(f"/v1/cohorts/{cohort}", json={})
    assert response.status_code == 200, response.text
    response = site.admin.put(f"/v1/pools/p-{cohort}", json={"capacity": {"gpu": 8}})
    assert response.status_code == 200, response.text
    lender, _ = site.tenant({"gpu": 2})
    borrower, borrower_token = site.tenant({"gpu": 1})
    for name, extra in ((lender, {"reclaim": "any"}), (borrower, {})):
        response = site.admin.put(f"/v1/tenants/{name}", json={"cohort": cohort, **extra})
        assert response.status_code == 200, response.text
    for number in range(3):
        assert site.submit(borrower, f"{borrower}-{number}").status_code == 202
    # Delivered, so running at the executor: a stop of work not yet delivered needs no
    # executor and is confirmed at once, and the stuck stops below would not be listed.
    wait_for(lambda: all(site.admin.get(f"/v1/tenants/{borrower}/requests/{borrower}-{n}")
                         .json()["state"] == "delivered" for n in range(3)),
             "the borrower's three requests delivered")
    sign_in(page, site, site.admin_token)
    shown = row(page, "tenants", f"{borrower}/gpu")
    shown.locator('td[data-label="Borrowed"]').filter(has_text="2").wait_for(
        timeout=LIVE_TIMEOUT_MS)
    assert shown.locator('td[data-label="Cohort"]').inner_text() == cohort
    assert shown.locator(".bar.borrowing").count() == 1
    lending = row(page, "tenants", f"{lender}/gpu")
    assert lending.locator('td[data-label="Lent"]').inner_text() == "2"
    assert page.locator("#tenants thead").inner_text().lower().count("used / nominal") == 1
    row(page, "cohorts", f"{cohort}/gpu").wait_for()
    page.screenshot(path=str(site.screenshots / "overview-cohorts-desktop.png"), full_page=True)
    # The lender wants its nominal back: borrowed work is preempted, and the page says why.
    page.goto(f"{site.page_url}#/decisions")
    assert site.submit(lender, f"{lender}-back", gpu=2).status_code == 202
    entry = page.locator("#decisions tbody tr").filter(has_text=f"reclaim for {lender}-back")
    entry.first.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert entry.first.locator(".badge").inner_text() == "stopping"
    assert entry.first.locator("td").nth(2).inner_text() == "preempt"
    page.screenshot(path=str(site.screenshots / "decisions-preemption-desktop.png"))
    victim = entry.first.locator("a").inner_text()
    entry.first.locator("a").click()
    page.locator("#request-title").filter(has_text=victim).wait_for()
    page.locator("#request-facts").filter(
        has_text=f"preempted (reclaim) by {lender}-back").wait_for(timeout=LIVE_TIMEOUT_MS)
    # This executor does not confirm stops: the victims are stuck, still charged, and listed.
    page.goto(f"{site.page_url}#/delivery")
    stuck = row(page, "stops", victim)
    # Listed once the worker has begun the stop (a dispatcher pass on a busy machine).
    stuck.wait_for(timeout=3 * LIVE_TIMEOUT_MS)
    assert stuck.locator(".badge").inner_text() == "preempting"
    assert f"preempted (reclaim) by {lender}-back" in stuck.inner_text()
    # An operator sees the target's answer to the stop.
    stuck.locator('td[data-label="Last answer"]').filter(has_text="DELETE answered 501").wait_for(
        timeout=3 * LIVE_TIMEOUT_MS)
    page.screenshot(path=str(site.screenshots / "delivery-stuck-preemption-desktop.png"))
    # The executor's confirmation (as the worker records it): the row leaves the list, and
    # the victim's story says it ended preempted after it had been delivered.
    with Quotagate.connect(site.db_url) as gate:
        gate.ledger.release(victim, RequestState.CANCELLED, stopped=True)
    stuck.wait_for(state="detached", timeout=LIVE_TIMEOUT_MS)
    page.goto(f"{site.page_url}{requests_href(borrower, victim)}")
    page.locator("#request-facts .badge").filter(has_text="preempted").wait_for(
        timeout=LIVE_TIMEOUT_MS)
    page.locator("#request-delivery").filter(
        has_text="its outbox row went when its stop was confirmed").wait_for(
        timeout=LIVE_TIMEOUT_MS)
    page.screenshot(path=str(site.screenshots / "request-preempted-desktop.png"), full_page=True)
    # The borrower's own token sees its rows and its victim, not the lender's.
    page.goto(f"{site.page_url}#/overview")
    page.locator("#sign-out").click()
    sign_in(page, site, borrower_token)
    row(page, "tenants", f"{borrower}/gpu").wait_for()
    assert page.locator("#cohorts-card").is_hidden()
    assert lender not in page.locator("#tenants").inner_text()
    # The other victim is still stuck; its tenant sees that asking for the stop failed
    # (DELETE answered 501), not the target's answer (docs/decisions/611, 823).
    page.goto(f"{site.page_url}#/delivery")
    [other] = [f"{borrower}-{n}" for n in range(3) if site.admin.get(
        f"/v1/tenants/{borrower}/requests/{borrower}-{n}").json()["state"] == "preempting"]
    answer = row(page, "stops", other).locator('td[data-label="Last answer"]')
    answer.wait_for(timeout=LIVE_TIMEOUT_MS)
    assert answer.inner_text() == (
        "the last stop attempt failed (the target's answer is shown to admins)")


def test_a_tenant_with_a_budget_shows_its_hours_left_and_the_request_it_keeps_waiting(
    page: Any, site: Site
) -> None:
    budgeted, budgeted_token = site.tenant({"gpu": 4})
    response = site.admin.put(f"/v1/tenants/{budgeted}", json={"budget": {"gpu": "10h/1d"}})
    assert response.status_code == 200, response.text
    plain, _ = site.tenant({"gpu": 1})
    # The first reserves 2 gpu x 3 h of the 10; the second's 1 gpu x 5 h does not fit the 4 left.
    for request_id, gpu, hours in (("holds", 2, 3), ("over", 1, 5)):
        response = site.admin.post(f"/v1/tenants/{budgeted}/requests", json={
            "id": f"{budgeted}-{request_id}", "cost": {"gpu": gpu}, "max_runtime": hours * 3600})
        assert response.status_code == 202, response.text
    wait_for(lambda: site.admin.get(f"/v1/tenants/{budgeted}/requests/{budgeted}-holds")
             .json()["state"] != "waiting", "the first request admitted")
    explained = site.admin.get(f"/v1/tenants/{budgeted}/requests/{budgeted}-over").json()
    assert explained["queue"]["reason"].startswith("budget_exhausted: gpu needs 5h, 4h available")
    sign_in(page, site, site.admin_token)
    left = row(page, "tenants", f"{budgeted}/gpu").locator('td[data-label="Budget left"]')
    left.filter(has_text="4 h of 10h/1d").wait_for(timeout=LIVE_TIMEOUT_MS)
    assert page.locator("#tenants thead").inner_text().lower().count("budget left") == 1
    # A tenant without a budget has a dash in the column, not a number.
    assert row(page, "tenants", f"{plain}/gpu").locator(
        'td[data-label="Budget left"]').inner_text() == "\N{EN DASH}"
    page.screenshot(path=str(site.screenshots / "overview-budgets-desktop.png"), full_page=True)
    page.goto(f"{site.page_url}#/queue")
    waiting = row(page, "queue", f"{budgeted}-over")
    waiting.filter(has_text=explained["queue"]["reason"]).wait_for(timeout=LIVE_TIMEOUT_MS)
    # The tenant's own token sees its budget too.
    page.goto(f"{site.page_url}#/overview")
    page.locator("#sign-out").click()
    sign_in(page, site, budgeted_token)
    row(page, "tenants", f"{budgeted}/gpu").locator('td[data-label="Budget left"]').filter(
        has_text="4 h of 10h/1d").wait_for(timeout=LIVE_TIMEOUT_MS)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(site.screenshots / "overview-budgets-phone.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("backend", BACKENDS)
def test_held_room_names_its_preemptor_and_the_requeue_steps_link_to_their_requests(
    page: Any, backend: str, tmp_path: Path
) -> None:
    errors = collect_page_errors(page)
    with fresh_database(backend, tmp_path) as db_url:
        with Quotagate.connect(db_url) as gate:
            contested_hold(gate)
            explained = gate.explain("c-wait")["reason"]
        admin_token = make_token(db_url, label="held room test")
        # The API only: an admission worker would admit the preemptor, ending the hold.
        with running_server(db_url, tmp_path, args=["--no-workers"]) as server, httpx.Client(
            base_url=server.url, headers=bearer(admin_token), timeout=30
        ) as admin:
            site = Site(server, db_url, admin_token, admin, tmp_path)
            sign_in(page, site, admin_token)
            page.goto(f"{site.page_url}#/queue")
            held = page.locator("#queue-holds")
            held.filter(has_text="Room held for high (team-a, gpu=2)").wait_for(
                timeout=LIVE_TIMEOUT_MS)
            assert held.locator("a").get_attribute("href") == requests_href("team-a", "high")
            assert explained.startswith("held_for_preemptor")
            row(page, "queue", "c-wait").filter(has_text=explained).wait_for()
            page.screenshot(path=str(tmp_path / "queue-held-room-desktop.png"), full_page=True)
            page.goto(f"{site.page_url}#/decisions")
            for operation, target in (("hold", "high"), ("preempt", "low"), ("requeue", "low"),
                                      ("waiting", "low")):
                entry = page.locator("#decisions tbody tr").filter(
                    has=page.locator(f'td[data-label="Operation"]:text-is("{operation}")'))
                entry.first.wait_for(timeout=LIVE_TIMEOUT_MS)
                assert entry.first.locator("a").get_attribute("href") == requests_href(
                    "team-a", target), operation
            # team-c's own token sees why its request waits, not whose room it is.
            page.goto(f"{site.page_url}#/overview")
            page.locator("#sign-out").click()
            sign_in(page, site, make_token(db_url, tenant="team-c"))
            page.goto(f"{site.page_url}#/queue")
            row(page, "queue", "c-wait").filter(has_text=explained).wait_for(
                timeout=LIVE_TIMEOUT_MS)
            assert page.locator("#queue-holds").is_hidden()
    assert errors == []
