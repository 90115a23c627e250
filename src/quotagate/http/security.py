"""Authentication (which token?) and the call into the authorizer hook (may it?)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError

from quotagate.auth.authorizer import REQUEST_OPERATIONS, TOPIC_OPERATIONS, Actor
from quotagate.auth.refusals import refusal_reason
from quotagate.errors import Forbidden, NotFound, QuotagateError, Unauthorized, quoted
from quotagate.http.context import ApiContext, Context
from quotagate.store.audit import AuditEntry

log = logging.getLogger("quotagate.http")

bearer_scheme = HTTPBearer(auto_error=False, description="An API token: `quotagate api-token create`")


# The bearer credentials alone, read on the event loop. Hot routes authenticate
# with them where their work runs instead of using CurrentActor: submit in its
# worker thread, saving one thread-pool hand-off per call; complete, fail and
# cancel on the group release's thread (docs/decisions/316), saving both.
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def current_actor(context: Context, credentials: Credentials) -> Actor:
    return authenticate(context, credentials)


def authenticate(context: ApiContext, credentials: HTTPAuthorizationCredentials | None,
                 *, read_since: float | None = None) -> Actor:
    """The actor behind the bearer token, or Unauthorized (counted, never audited).

    ``read_since``: when the call arrived (``time.monotonic()``); a check of the same
    token read after that counts for this call too (``TokenStore.authenticate``)."""
    if credentials is None:
        context.metrics.auth_refusals.labels("unauthenticated").inc()
        raise Unauthorized("send an API token as 'Authorization: Bearer <token>'",
                           code="missing_token")
    try:
        return context.gate.authenticate(credentials.credentials, read_since=read_since)
    except Unauthorized:
        # Not audited: an unauthenticated caller must not be able to make us write.
        context.metrics.auth_refusals.labels("unauthenticated").inc()
        raise


CurrentActor = Annotated[Actor, Depends(current_actor)]


def authorize(
    context: ApiContext,
    actor: Actor,
    tenant: str | None,
    operation: str,
    *,
    request_id: str | None = None,
) -> None:
    """Ask the authorizer; refuse with 404 for single requests (hides existence), else 403."""
    if context.authorizer(tenant, actor, operation):
        return
    context.metrics.auth_refusals.labels("forbidden").inc()
    target = f"{tenant}/{request_id}" if request_id else (f"tenant/{tenant}" if tenant else None)
    _audit_refusal(context, actor, operation, target)
    if operation in REQUEST_OPERATIONS:
        raise NotFound(f"request {quoted(request_id)} does not exist", code="unknown_request")
    if operation in TOPIC_OPERATIONS:
        # A listing names no topic: the same sentence whether or not the tenant exists.
        raise NotFound(f"topic {quoted(request_id)} does not exist" if request_id
                       else f"topics of tenant {quoted(tenant)} do not exist", code="unknown_topic")
    scope = f"tenant {tenant!r}" if tenant else "the whole platform"
    raise Forbidden(f"this token may not {operation} for {scope}", code="forbidden")


def _audit_refusal(context: ApiContext, actor: Actor, operation: str, target: str | None) -> None:
    # Recorded under the actor's own tenant, so a tenant sees its own refused
    # attempts and the tenant it aimed at learns nothing.
    now = context.gate.clock.now()
    count = context.refusals.admit(actor.name, operation, now)
    if count is None:
        return  # counted in the metric; this minute's row for it is written
    entry = AuditEntry(actor.name, operation, "refused", actor.tenant, target,
                       refusal_reason(count, context.refusals.window))
    try:
        context.gate.record_audit(entry)
    except (QuotagateError, SQLAlchemyError):
        log.warning("could not record an authorization refusal in the audit log")
