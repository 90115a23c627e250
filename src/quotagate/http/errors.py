"""The one place where errors become HTTP answers: ``{"code", "message"}`` and a status."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException

from quotagate.errors import QuotagateError, RateLimited, StoreUnavailable, quoted
from quotagate.http.routers.rate import rate_limit_headers
from quotagate.store.dialect import translate

log = logging.getLogger("quotagate.http")

_CODES_BY_STATUS = {
    400: "invalid_input", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 413: "body_too_large", 422: "invalid_input",
}


def error_response(error: QuotagateError) -> JSONResponse:
    headers = {}
    if isinstance(error, RateLimited):
        # Whole seconds, rounded up; a bucket that never refills still gets a number.
        seconds = error.retry_after if math.isfinite(error.retry_after) else 86400
        headers["Retry-After"] = str(max(1, math.ceil(seconds)))
        headers.update(rate_limit_headers(error))
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error.to_dict(), status_code=error.status, headers=headers)


async def _quotagate_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, QuotagateError)
    return error_response(error)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    sent_as = request.headers.get("content-type")
    if not _is_json(sent_as) and any(problem.get("loc", ())[:1] == ("body",)
                                     for problem in error.errors()):
        # A body sent as a form (curl -d without -H) is never parsed, so FastAPI's own
        # words ("Input should be a valid dictionary") would say nothing about the cause.
        return JSONResponse({"code": "invalid_input", "message": (
            "invalid request: send the body as JSON with 'Content-Type: application/json', "
            f"not {quoted(sent_as) if sent_as else 'without a Content-Type'}; nothing was changed"
        )}, status_code=422)
    problems = []
    for problem in error.errors()[:5]:
        where = ".".join(str(part) for part in problem.get("loc", ()))
        problems.append(f"{where}: {problem.get('msg', 'invalid')}")
    message = "invalid request: " + "; ".join(problems) if problems else "invalid request"
    return JSONResponse({"code": "invalid_input", "message": message[:1000]}, status_code=422)


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body of this Content-Type as JSON."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


def _unparseable_body(error: HTTPException) -> str | None:
    """Why FastAPI could not parse a body it answers 400 for, or None for another 400.

    FastAPI turns a JSON syntax error into a validation error (422) but any other
    failure of ``json.loads`` into a bare 400: JSON nested deeper than the parser's
    recursion limit, a number of more digits than Python converts, bytes that are
    not UTF-8. All are
    malformed bodies, which docs/http-api.md answers with 422.
    """
    cause = error.__cause__
    if error.status_code != 400 or cause is None:
        return None
    if isinstance(cause, RecursionError):
        return "the body nests arrays and objects too deeply to be read; nothing was changed"
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not UTF-8 text; nothing was changed"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "the body holds a number too long to be read; nothing was changed"
    return "the body is not JSON this API can read; nothing was changed"


async def _http_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    unparseable = _unparseable_body(error)
    if unparseable is not None:
        return JSONResponse({"code": "invalid_input", "message": unparseable}, status_code=422)
    code = _CODES_BY_STATUS.get(error.status_code, "http_error")
    return JSONResponse({"code": code, "message": str(error.detail)},
                        status_code=error.status_code, headers=error.headers)


def known_error_response(error: Exception) -> JSONResponse | None:
    """The answer to an error an endpoint may raise, or None for a bug (the 500 handler's).

    FastAPI's routes reach these through the handlers below; http/hot_routes.py, which
    runs the same endpoints outside FastAPI's exception middleware, calls it directly.
    """
    if isinstance(error, QuotagateError):
        return error_response(error)
    if isinstance(error, DBAPIError):
        return _database_answer(error)
    if isinstance(error, PoolTimeout):
        return _pool_exhausted_answer()
    return None


def _database_answer(error: DBAPIError) -> JSONResponse:
    # Reads go straight to the engine (not through run_transaction), so a
    # database that went away surfaces here as a driver error.
    translated = translate(error)
    if isinstance(translated, QuotagateError):
        return error_response(translated)
    log.exception("database error", exc_info=error)
    return JSONResponse({"code": "internal_error", "message": "internal error"}, status_code=500)


def _pool_exhausted_answer() -> JSONResponse:
    # Every pooled connection stayed busy for the pool timeout: overload, not a bug.
    log.warning("no database connection free within the pool timeout")
    return error_response(StoreUnavailable(
        "the ledger database is too busy to take this request; retry", code="store_busy"
    ))


async def _database_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, DBAPIError)
    return _database_answer(error)


async def _pool_exhausted(_request: Request, _error: Exception) -> JSONResponse:
    return _pool_exhausted_answer()


async def _unexpected_error(_request: Request, error: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=error)
    return JSONResponse({"code": "internal_error", "message": "internal error"}, status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(QuotagateError, _quotagate_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(PoolTimeout, _pool_exhausted)
    app.add_exception_handler(Exception, _unexpected_error)
