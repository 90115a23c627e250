"""Unknown query parameters are refused (400 ``unknown_parameter``), not ignored.

A typo must not change the answer silently: ``GET /v1/audit?tenat=team-a`` would
otherwise list every tenant's entries to an admin who asked for one tenant's.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.routing import APIRoute

from quotagate.errors import InvalidInput


async def refuse_unknown_query_parameters(request: Request) -> None:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    known = {parameter.alias for parameter in route.dependant.query_params}
    for dependency in route.dependant.dependencies:
        known.update(parameter.alias for parameter in dependency.query_params)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        accepted = ", ".join(sorted(known)) or "none"
        raise InvalidInput(
            f"unknown query parameter {', '.join(map(repr, unknown))[:200]}; "
            f"this operation takes: {accepted}",
            code="unknown_parameter",
        )
