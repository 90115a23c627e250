"""Submits and callbacks answered beside FastAPI (http/hot_routes.py,
docs/decisions/319-hot-routes-beside-fastapi.md) answer exactly as FastAPI's routes do.

The same calls go to two applications over one ledger, on every backend: the one
``serve`` runs, and the same application with the hot routes taken out, so every call
reaches FastAPI. Each side uses its own request ids; the answers — status, body, the
headers a client reads — must be equal once the ids are named alike. The calls cover
the ways a call is answered: new, replayed, changed, unauthenticated, forbidden, a bad
name, a body FastAPI must judge (422), a query string, each end, ends refused.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from quotagate import Quotagate
from quotagate.http import create_app
from quotagate.http.hot_routes import HotRoutes, _hot_route
from support.http_servers import bearer, serving

_HEADERS = ("content-type", "www-authenticate", "retry-after")


def _without_hot_routes(app: FastAPI) -> FastAPI:
    app.user_middleware = [layer for layer in app.user_middleware if layer.cls is not HotRoutes]
    return app


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _calls(http: httpx.Client, gate: Quotagate, prefix: str,
           tokens: dict[str, dict[str, str]]) -> list[tuple[Any, ...]]:
    tenant, admin = tokens["tenant"], tokens["admin"]
    path = "/v1/tenants/team-a/requests"
    one = {"id": f"{prefix}1", "cost": {"gpu": 1}, "payload": {"n": 1}}
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", path, {"json": one, "headers": tenant}),
        ("POST", path, {"json": one, "headers": tenant}),
        ("POST", path, {"json": {**one, "cost": {"gpu": 2}}, "headers": tenant}),
        ("POST", path, {"json": {**one, "id": f"{prefix}2"}}),
        ("POST", path, {"json": {**one, "id": f"{prefix}2"}, "headers": bearer("qg_nope")}),
        ("POST", path, {"json": {**one, "id": f"{prefix}2"},
                        "headers": {"Authorization": "Basic abc"}}),
        ("POST", "/v1/tenants/team-b/requests", {"json": {**one, "id": f"{prefix}2"},
                                                 "headers": tenant}),
        ("POST", "/v1/tenants/Bad Name/requests", {"json": {**one, "id": f"{prefix}2"},
                                                    "headers": admin}),
        ("POST", path, {"json": {**one, "id": f"{prefix} bad"}, "headers": tenant}),
        ("POST", path, {"json": {"id": 5, "cost": {"gpu": 1}}, "headers": tenant}),
        ("POST", path, {"content": b'{"id": "x"', "headers": {
            **tenant, "Content-Type": "application/json"}}),
        ("POST", path, {"content": b"id=x", "headers": {
            **tenant, "Content-Type": "text/plain"}}),
        # Bodies json.loads cannot read (decision 808): nested past its recursion, a number
        # of more digits than Python converts, bytes that are not UTF-8.
        *[("POST", route, {"content": body, "headers": {
            **tenant, "Content-Type": "application/json"}})
          for route in (path, f"{path}/{prefix}1/complete")
          for body in (b"[" * 3000 + b"]" * 3000, b'{"id": ' + b"1" * 5000 + b"}",
                       b'{"id": "\xff"}')],
        ("POST", path, {"json": {**one, "id": f"{prefix}2", "payload": _nested(65)},
                        "headers": tenant}),
        ("POST", path, {"headers": tenant}),
        ("POST", f"{path}?dry_run=true", {"json": {**one, "id": f"{prefix}3"},
                                          "headers": tenant}),
        ("POST", f"{path}/", {"json": {**one, "id": f"{prefix}3"}, "headers": tenant}),
        ("POST", path, {"json": {**one, "id": f"{prefix}2"}, "headers": tenant}),
        ("POST", path, {"json": {**one, "id": f"{prefix}3"}, "headers": tenant}),
        ("POST", f"{path}/{prefix}1/cancel", {"headers": tenant}),
        ("POST", f"{path}/{prefix}1/complete", {"headers": admin}),
        ("ADMIT", "", {}),
        ("POST", f"{path}/{prefix}2/complete", {"headers": tenant}),
        ("POST", f"{path}/{prefix}2/complete", {"json": {"fencing_token": "x"},
                                                "headers": admin}),
        ("POST", f"{path}/{prefix}2/complete", {"json": {"reason": "done"}, "headers": admin}),
        ("POST", f"{path}/{prefix}3/fail", {"content": b"", "headers": admin}),
        ("POST", f"{path}/{prefix}9/fail", {"headers": admin}),
        ("POST", f"{path}/{prefix}9/complete", {}),
        ("POST", f"/v1/tenants/team-b/requests/{prefix}9/cancel", {"headers": tenant}),
        ("POST", f"{path}/{prefix}2/complete?x=1", {"headers": admin}),
    ]
    answers: list[tuple[Any, ...]] = []
    for method, url, options in calls:
        if method == "ADMIT":
            gate.admit(16)
            continue
        response = http.request(method, url, **options)
        headers = {name: response.headers.get(name) for name in _HEADERS}
        answers.append((url.replace(prefix, "<id>"), response.status_code,
                        response.text.replace(prefix, "<id>"), headers))
    return answers


def test_submits_and_callbacks_answer_as_fastapis_routes_do(gate: Quotagate) -> None:
    gate.set_pool("main", {"gpu": 8})
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_tenant("team-b", {"gpu": 4})
    tokens = {"tenant": bearer(gate.create_api_token(tenant="team-a", actor="test").token),
              "admin": bearer(gate.create_api_token(admin=True, actor="test").token)}
    answers = []
    for prefix, app in (("hot-", create_app(gate)),
                        ("fastapi-", _without_hot_routes(create_app(gate)))):
        with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            answers.append(_calls(http, gate, prefix, tokens))
    hot, fastapi = answers
    assert [answer[:2] for answer in hot] == [answer[:2] for answer in fastapi]
    for ours, theirs in zip(hot, fastapi, strict=True):
        assert ours == theirs
    # The calls reached what they were meant to: every kind of answer is among them.
    assert {status for _url, status, _text, _headers in hot} >= {
        200, 202, 400, 401, 403, 404, 409, 422}


@pytest.mark.parametrize(("method", "path", "query", "taken"), [
    ("POST", "/v1/tenants/team-a/requests", b"", True),
    ("POST", "/v1/tenants/team-a/requests/job-1/complete", b"", True),
    ("POST", "/v1/tenants/team-a/requests/job-1/fail", b"", True),
    ("POST", "/v1/tenants/team-a/requests/job-1/cancel", b"", True),
    ("POST", "/v1/tenants/team-a/requests", b"dry_run=true", False),
    ("POST", "/v1/tenants/team-a/requests/", b"", False),
    ("POST", "/v1/tenants//requests", b"", False),
    ("POST", "/v1/tenants/team-a/requests:batch", b"", False),
    ("POST", "/v1/tenants/team-a/requests/job-1/explain", b"", False),
    ("POST", "/v1/tenants/team-a/requests/job-1/complete/", b"", False),
    ("GET", "/v1/tenants/team-a/requests", b"", False),
    ("GET", "/v1/tenants/team-a/requests/job-1", b"", False),
])
def test_only_submits_and_ends_without_a_query_string_take_the_hot_routes(
    method: str, path: str, query: bytes, taken: bool,
) -> None:
    scope = {"type": "http", "method": method, "path": path, "query_string": query,
             "root_path": "", "headers": []}
    assert (_hot_route(scope) is not None) is taken
