"""The calls every request makes, answered without FastAPI's routing and dependency solving.

A completed request is two inbound calls: its submit (``POST …/requests``) and its
executor's callback (``POST …/requests/{id}/complete``, or ``…/fail`` / ``…/cancel``).
Through FastAPI each passed five middleware layers, the router's match over every
route, the dependency solver and the content-type parse of the standard library's
``email`` package before the endpoint ran: more of ``serve``'s CPU than the endpoint
itself (docs/decisions/319-hot-routes-beside-fastapi.md).

This pure ASGI middleware answers those calls by running the very endpoint functions
FastAPI would (``routers.requests.submit`` and ``run_release``) with the same bearer
scheme, body models, thread limiter and error answers. Anything it does not
recognise in full goes on to FastAPI untouched, which still serves and documents
every route: a query string (``?dry_run=true``, an unknown parameter), a body that is
not JSON or does not validate (FastAPI writes the 422), another content type, a
trailing slash. Those checks are side-effect free, so handing such a call on changes
nothing. It sits inside the body limit and reads the body that one buffered.
"""

from __future__ import annotations

import json
from typing import Any

import anyio.to_thread
from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from quotagate.http.body_limit import BUFFERED_BODY
from quotagate.http.context import ApiContext
from quotagate.http.errors import known_error_response
from quotagate.http.models import ReleaseBody, SubmitBody
from quotagate.http.routers.requests import ENDS, run_release, submit
from quotagate.http.security import bearer_scheme

# What FastAPI parses as JSON and these calls' clients send.
_JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8"})


class HotRoutes:
    def __init__(self, app: ASGIApp, *, context: ApiContext) -> None:
        self.app = app
        self.context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _hot_route(scope)
        call = None if route is None else _parsed(scope, route)
        if call is None:
            await self.app(scope, receive, send)
            return
        try:
            answer: Response | None = await self._run(scope, *call)
        except Exception as error:
            answer = known_error_response(error)
            if answer is None:
                raise  # to the 500 answer of ServerErrorMiddleware, as through FastAPI
        assert answer is not None
        await answer(scope, receive, send)

    async def _run(self, scope: Scope, route: list[str],
                   body: SubmitBody | ReleaseBody | None) -> Response:
        context = self.context
        credentials = await bearer_scheme(HTTPConnection(scope))
        if isinstance(body, SubmitBody):
            submission, tenant = body, route[3]
            # The thread pool FastAPI runs a sync endpoint in, with serve's bound on it.
            response: Response = await anyio.to_thread.run_sync(
                lambda: submit(tenant, submission, context, credentials))
            return response
        return await run_release(context, credentials, route[3], route[5],
                                 *ENDS[route[6]], body)


def _parsed(scope: Scope, route: list[str]) -> tuple[list[str], SubmitBody | ReleaseBody | None] | None:
    """The route and its validated body, or None when FastAPI should judge the call."""
    body = scope.get(BUFFERED_BODY)
    if body is None:
        return None
    data = _json(scope, body)
    if data is _NOT_OURS:
        return None
    try:
        if len(route) == 5:
            return route, SubmitBody.model_validate(data)
        return route, None if data is None else ReleaseBody.model_validate(data)
    except ValidationError:
        return None


_NOT_OURS: Any = object()


def _hot_route(scope: Scope) -> list[str] | None:
    """The path's segments when this is a submit or a callback we answer, else None."""
    if (scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string")
            or scope.get("root_path")):
        return None
    route: list[str] = scope["path"].split("/")
    if route[:3] != ["", "v1", "tenants"] or len(route) not in (5, 7) or route[4] != "requests":
        return None
    if not all(route[3:]) or (len(route) == 7 and route[6] not in ENDS):
        return None
    return route


def _json(scope: Scope, body: bytes) -> Any:
    """The parsed body (None for an empty one), or _NOT_OURS when FastAPI should judge it."""
    if not body:
        return None
    content_types = [value for name, value in scope["headers"] if name == b"content-type"]
    if len(content_types) != 1 or content_types[0].lower() not in _JSON_TYPES:
        return _NOT_OURS
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        # Not valid JSON, too many digits, not UTF-8 (ValueErrors), or nested past the
        # parser: FastAPI's handlers say which (docs/decisions/808).
        return _NOT_OURS
