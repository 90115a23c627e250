"""A tenant's requests: submit, read, list, cancel, complete, fail."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from quotagate.auth import authorizer as operations
from quotagate.auth.authorizer import Actor
from quotagate.domain.model import (
    STOPPING_STATES,
    RequestState,
    validate_name,
    validate_request_id,
)
from quotagate.errors import Conflict, Forbidden, NotFound, QuotagateError, quoted
from quotagate.http.context import ApiContext, Context
from quotagate.http.models import (
    MAX_BATCH,
    BatchAnswer,
    BatchEndAnswer,
    BatchEndBody,
    BatchEntry,
    BatchEntryBody,
    BatchSubmitBody,
    EndResult,
    ReleaseBody,
    SubmitBody,
)
from quotagate.http.openapi import ErrorBody
from quotagate.http.security import Credentials, CurrentActor, authenticate, authorize
from quotagate.store.authority import ReleaseGuard, executor_guard, tenant_guard
from quotagate.store.ledger import SubmitResult
from quotagate.store.listing import MAX_PAGE
from quotagate.store.release import End

router = APIRouter(prefix="/v1/tenants/{tenant}/requests", tags=["requests"])
# ``…/requests:batch`` is not below ``…/requests/``, so it needs its own prefix.
batch_router = APIRouter(prefix="/v1/tenants/{tenant}", tags=["requests"])


class BatchTooLarge(QuotagateError):
    status = 413
    default_code = "batch_too_large"


@router.post(
    "",
    status_code=202,
    summary="Submit a request (202 new, 200 identical replay, 409 changed); "
    "?dry_run=true answers whether it would be admitted, writing nothing",
    responses={200: {"description": "An identical submission was already recorded, or the "
                                    "answer of a dry run (docs/fair-sharing.md#dry-run)"},
               409: {"model": ErrorBody,
                     "description": "The id is in use with different content "
                                    "(request_conflict) or by another tenant (request_id_taken)"}},
)
def submit(
    tenant: str, body: SubmitBody, context: Context, credentials: Credentials,
    dry_run: Annotated[bool, Query(description="Judge the request without submitting it")] = False,
) -> JSONResponse:
    actor = authenticate(context, credentials)
    authorize(context, actor, tenant, operations.REQUEST_SUBMIT)
    if dry_run:
        return JSONResponse(context.gate.simulate(
            tenant, body.cost, priority=body.priority, payload=body.payload,
            target=body.target, request_id=body.id, max_runtime=body.max_runtime))
    try:
        result = _submit(context, actor, tenant, body)
    except QuotagateError as error:
        context.metrics.rejections.labels(tenant, error.code).inc()
        raise
    context.metrics.submissions.labels(tenant, "created" if result.created else "replayed").inc()
    return JSONResponse(result.request.to_dict(), status_code=202 if result.created else 200)


@batch_router.post(
    "/requests:batch",
    summary=f"Submit up to {MAX_BATCH} requests; each is answered as a single submit would be",
    description="Entries are judged one after another, in order, and written in one "
    "transaction (docs/decisions/224): `results[i]` holds the status a single submit of `requests[i]` would have "
    "answered (202 new, 200 identical replay, or an error status with `{code, message}`), and "
    "an entry that fails writes nothing while the others go on. A malformed body (422) or more "
    f"than {MAX_BATCH} entries (413 `batch_too_large`) writes nothing at all.",
    responses={413: {"model": ErrorBody,
                     "description": f"More than {MAX_BATCH} entries; nothing was written"}},
)
def submit_batch(
    tenant: str, body: BatchSubmitBody, context: Context, credentials: Credentials
) -> BatchAnswer:
    actor = authenticate(context, credentials)
    authorize(context, actor, tenant, operations.REQUEST_SUBMIT)
    # A bad tenant is the whole batch's error, not a thousand entries' one.
    validate_name(tenant, "tenant")
    if len(body.requests) > MAX_BATCH:
        raise BatchTooLarge(
            f"a batch holds at most {MAX_BATCH} requests, this one {len(body.requests)}; "
            "nothing was submitted"
        )
    answers = context.gate.submit_many(
        tenant, [entry.model_dump() for entry in body.requests], actor=actor.name)
    results: list[BatchEntry] = []
    for entry, answer in zip(body.requests, answers, strict=True):
        if isinstance(answer, Conflict):
            answer = _taken_or(context, tenant, entry.id, answer)
        if isinstance(answer, QuotagateError):
            context.metrics.rejections.labels(tenant, answer.code).inc()
            results.append(BatchEntry(status=answer.status, error=answer.to_dict()))
            continue
        context.metrics.submissions.labels(
            tenant, "created" if answer.created else "replayed").inc()
        results.append(BatchEntry(status=202 if answer.created else 200,
                                  request=answer.request.to_dict()))
    return BatchAnswer(results=results)


@batch_router.post(
    "/requests:end",
    summary=f"Complete or fail up to {MAX_BATCH} requests in one call (executors, admins)",
    description="For a receiver ending many requests: `results[i]` holds what the single "
    "`…/complete` or `…/fail` call of `ends[i]` would have answered (200 with the request and "
    "the cost returned, 202 with it stopping when an admin's end asked a stop, "
    "or an error status with `{code, message}`), each end judged on its own "
    "(fencing token, target, state) and a refused one writing nothing; all of them are written "
    "in one transaction (docs/decisions/223). A malformed body (422) or more than "
    f"{MAX_BATCH} entries (413 `batch_too_large`) writes nothing at all.",
    responses={413: {"model": ErrorBody,
                     "description": f"More than {MAX_BATCH} entries; nothing was written"}},
)
def end_batch(
    tenant: str, body: BatchEndBody, context: Context, credentials: Credentials
) -> BatchEndAnswer:
    actor = authenticate(context, credentials)
    validate_name(tenant, "tenant")
    if len(body.ends) > MAX_BATCH:
        raise BatchTooLarge(
            f"a batch holds at most {MAX_BATCH} ends, this one {len(body.ends)}; "
            "nothing was changed"
        )
    refusals: dict[str, QuotagateError | None] = {}
    results: list[EndResult | None] = [None] * len(body.ends)
    ends: list[tuple[int, End]] = []
    for index, entry in enumerate(body.ends):
        operation = (operations.REQUEST_COMPLETE if entry.state == "completed"
                     else operations.REQUEST_FAIL)
        if operation not in refusals:
            try:
                authorize(context, actor, tenant, operation, request_id=entry.id)
                refusals[operation] = None
            except QuotagateError as error:
                refusals[operation] = error
        try:
            validate_request_id(entry.id)
            refused = refusals[operation]
            if refused is not None:
                raise NotFound(f"request {quoted(entry.id)} does not exist", code="unknown_request")
        except QuotagateError as error:
            results[index] = EndResult(status=error.status, error=error.to_dict())
            continue
        release = ReleaseBody(reason=entry.reason, fencing_token=entry.fencing_token,
                              force=entry.force)
        try:
            ends.append((index, _end(actor, tenant, entry.id, RequestState(entry.state),
                                     release)))
        except QuotagateError as error:
            results[index] = EndResult(status=error.status, error=error.to_dict())
    for (index, end), result in zip(
        ends, context.gate.release_many([end for _index, end in ends]), strict=True
    ):
        if isinstance(result, QuotagateError):
            results[index] = EndResult(status=result.status, error=result.to_dict())
        elif isinstance(result, Exception):
            raise result
        else:
            results[index] = EndResult(status=_status(end.to_state, result.request.state),
                                       request=result.request.to_dict(),
                                       released=result.released)
    return BatchEndAnswer(results=[result for result in results if result is not None])


def _submit(
    context: ApiContext, actor: Actor, tenant: str, body: SubmitBody | BatchEntryBody
) -> SubmitResult:
    try:
        return context.gate.submit(
            body.id, tenant, body.cost, priority=body.priority, payload=body.payload,
            target=body.target, actor=actor.name,
            max_runtime=body.max_runtime if isinstance(body, SubmitBody) else None,
        )
    except Conflict as conflict:
        raise _taken_or(context, tenant, body.id, conflict) from None


def _taken_or(context: ApiContext, tenant: str, request_id: str, conflict: Conflict) -> Conflict:
    """Request ids are global. If another tenant holds this one, say only that it is
    taken: neither who holds it nor what it contains."""
    try:
        owner = context.gate.show(request_id).tenant
    except NotFound:
        return conflict
    if owner != tenant:
        return Conflict(f"request id {quoted(request_id)} is already in use; choose another id",
                        code="request_id_taken")
    return conflict


@router.get("", summary="The tenant's requests, newest first, with cursor pagination")
def list_tenant_requests(
    tenant: str,
    context: Context,
    actor: CurrentActor,
    state: RequestState | None = None,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.REQUEST_LIST)
    validate_name(tenant, "tenant")
    page = context.gate.list_requests(tenant, state=state, cursor=cursor, limit=limit)
    return {"requests": [request.to_dict() for request in page.items], "next_cursor": page.next_cursor}


@router.get("/{request_id}", summary="One request, its binding, and for a waiting one its queue")
def get_request(
    tenant: str, request_id: str, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.REQUEST_READ, request_id=request_id)
    _check(tenant, request_id)
    gate = context.gate
    request = gate.show(request_id, tenant=tenant)
    data = request.to_dict()
    data["binding"] = gate.binding(request_id)
    data["queue"] = None
    if request.state == RequestState.WAITING:
        explained = gate.explain(request_id, tenant=tenant)
        if explained.get("waiting"):
            data["queue"] = {
                "position": explained["position"],
                "tenant_position": explained["tenant_position"],
                "effective_priority": explained["effective_priority"],
                "waited_seconds": explained["waited_seconds"],
                # Others' usage stays hidden: a tenant sees its own quota
                # blocks and only the names of pools that lack room.
                "tenant_blocked_by": explained["tenant_blocked_by"],
                "pools_blocked": explained["pools_blocked"],
                "fitting_pools": explained["fitting_pools"],
                "reason": explained["reason"],
            }
    return data


# The calls that end a request, by their last path segment: the operation asked of
# the authorizer and the state the request ends in.
ENDS: dict[str, tuple[str, RequestState]] = {
    "cancel": (operations.REQUEST_CANCEL, RequestState.CANCELLED),
    "complete": (operations.REQUEST_COMPLETE, RequestState.COMPLETED),
    "fail": (operations.REQUEST_FAIL, RequestState.FAILED),
}


async def run_release(
    context: ApiContext, credentials: Credentials, tenant: str, request_id: str, operation: str,
    to_state: RequestState, body: ReleaseBody | None,
) -> JSONResponse:
    """End one request through the group release (these routes, and http/hot_routes.py)."""
    arrived = time.monotonic()

    def prepare() -> End:
        # On the group release's thread: one token read serves the callbacks that
        # arrived before it (docs/decisions/316), and no worker thread waits here.
        actor = authenticate(context, credentials, read_since=arrived)
        authorize(context, actor, tenant, operation, request_id=request_id)
        _check(tenant, request_id)
        return _end(actor, tenant, request_id, to_state, body)

    # Through the group commit: a burst of callbacks shares its transactions,
    # each end still judged by its guard on its locked row.
    result = await asyncio.wrap_future(context.releases.release_later(prepare))
    return JSONResponse({**result.request.to_dict(), "released": result.released},
                        status_code=_status(to_state, result.request.state))


def _end(actor: Actor, tenant: str, request_id: str, to_state: RequestState,
         body: ReleaseBody | None) -> End:
    """The end ``actor`` asks for: an admin's is a verdict, forced only on its word."""
    force = body is not None and body.force
    if force and not actor.admin:
        raise Forbidden("force is an admin's override for a lost executor; this token is not "
                        "an admin's", code="admin_only")
    return End(request_id, to_state, reason=body.reason if body else None, actor=actor.name,
               tenant=tenant, guard=_guard(actor, body), admin=actor.admin, force=force)


def _status(to_state: RequestState, state: RequestState) -> int:
    """202 when a complete or fail asked a stop and holds the cost until it is confirmed
    (docs/decisions/819); a cancel's answer stays 200 whatever it began."""
    return 202 if to_state != RequestState.CANCELLED and state in STOPPING_STATES else 200


def _guard(actor: Actor, body: ReleaseBody | None) -> ReleaseGuard | None:
    """Who may end what (docs/decisions/310-*): admins anything, executors their
    target's delivered work, tenants may cancel but not end charged work."""
    if actor.admin:
        return None
    if actor.executor_target is not None:
        return executor_guard(actor.executor_target, body.fencing_token if body else None)
    return tenant_guard


@router.post("/{request_id}/cancel", summary="Cancel a request; a reserved one returns its cost")
async def cancel(
    tenant: str, request_id: str, context: Context, credentials: Credentials,
    body: ReleaseBody | None = None,
) -> JSONResponse:
    return await run_release(context, credentials, tenant, request_id, *ENDS["cancel"], body)


# An admin's complete or fail of work that may run answers 202: a stop was asked.
_STOP_ASKED: dict[int | str, dict[str, Any]] = {202: {
    "description": "An admin's complete or fail of work an executor may hold: the request is "
                   "`completing`/`failing`, its cost still charged until a worker sees the "
                   "target confirm the stop (`released` is empty); `force` ends it now"}}


@router.post("/{request_id}/complete",
             summary="Mark a request completed (its executor, with the fencing token, or an admin)",
             responses=_STOP_ASKED)
async def complete(
    tenant: str, request_id: str, context: Context, credentials: Credentials,
    body: ReleaseBody | None = None,
) -> JSONResponse:
    return await run_release(context, credentials, tenant, request_id, *ENDS["complete"], body)


@router.post("/{request_id}/fail",
             summary="Mark a request failed (its executor, with the fencing token, or an admin)",
             responses=_STOP_ASKED)
async def fail(
    tenant: str, request_id: str, context: Context, credentials: Credentials,
    body: ReleaseBody | None = None,
) -> JSONResponse:
    return await run_release(context, credentials, tenant, request_id, *ENDS["fail"], body)


def _check(tenant: str, request_id: str) -> None:
    validate_name(tenant, "tenant")
    validate_request_id(request_id)
