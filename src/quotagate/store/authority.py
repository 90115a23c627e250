"""Who may end a request: the checks a release runs on the locked request row.

Once a request is reserved its executor may be running it (a reserved request
can be mid-delivery), so returning its cost on a tenant's word would let work
run uncharged. A tenant may therefore cancel (ask for a stop) but never mark
charged work completed or failed; an executor token may end only work bound to
its own target, and only with a fencing token no older than the bound attempt's
(docs/decisions/310-executor-tokens-and-callbacks.md) — or, before anything is
bound, with the token of the delivery attempt in flight (docs/decisions/225).
Admins and the workers release without a guard.

Each guard runs inside the release transaction, after the request row is
locked, so the state it judges is the state the release changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import CHARGED_STATES, RequestState
from quotagate.errors import Conflict, Forbidden, NotFound
from quotagate.store import schema

# (connection, locked request row, the state asked for) → None, or raises. In a batch
# of releases the row shows what the batch's earlier ends made of it.
ReleaseGuard = Callable[[sa.Connection, Mapping[str, Any], RequestState], None]

_ENDINGS = frozenset({RequestState.COMPLETED, RequestState.FAILED})


class NotDeliveredYet(Conflict):
    """The executor called back before the worker recorded the delivery; retry shortly."""

    default_code = "not_delivered"


class StaleFencingToken(Conflict):
    """The callback carries the token of an attempt older than the bound one."""

    default_code = "stale_fencing_token"


def tenant_guard(_connection: sa.Connection, row: Mapping[str, Any], to_state: RequestState) -> None:
    """A tenant may cancel its requests; ending charged work is its executor's word."""
    if to_state in _ENDINGS and RequestState(row["state"]) in CHARGED_STATES:
        raise Forbidden(
            f"request {row['id']!r} is {row['state']}: only its executor or an admin may mark "
            f"it {to_state.value}; cancel it to ask for a stop",
            code="executor_only",
        )


@lru_cache(maxsize=1)
def _callback_facts_query() -> sa.Select[Any]:
    """The binding, the outbox row and the default target of one request (``guarded_id``),
    in one round trip: callbacks are hot. Built once (docs/decisions/246)."""
    request, binding, outbox, targets = (schema.request, schema.binding, schema.outbox,
                                         schema.delivery_target)
    default_target = (sa.select(targets.c.name).where(targets.c.is_default == sa.true())
                      .limit(1).scalar_subquery())
    return (
        sa.select(binding.c.target, binding.c.fencing_token,
                  outbox.c.target.label("outbox_target"), outbox.c.claim_token,
                  outbox.c.delivered.label("outbox_delivered"),
                  outbox.c.request_id.label("queued"), default_target.label("default_target"))
        .select_from(
            request.outerjoin(binding, binding.c.request_id == request.c.id)
            .outerjoin(outbox, outbox.c.request_id == request.c.id)
        )
        .where(request.c.id == sa.bindparam("guarded_id"))
    )


def executor_guard(target: str, fencing_token: int | None) -> ReleaseGuard:
    """The guard for an executor token of ``target`` calling back with ``fencing_token``."""

    def guard(connection: sa.Connection, row: Mapping[str, Any], to_state: RequestState) -> None:
        request_id = row["id"]
        state = RequestState(row["state"])
        found = connection.execute(_callback_facts_query(), {"guarded_id": request_id}).one()
        if found.target is None:
            _judge_in_flight(request_id, state, found, target, fencing_token)
            return
        if found.target != target:
            raise NotFound(f"request {request_id!r} does not exist", code="unknown_request")
        _require_token(request_id, fencing_token)
        assert fencing_token is not None
        bound = int(found.fencing_token)
        newest = max(bound, int(found.claim_token or 0))
        if not bound <= fencing_token <= newest:
            raise StaleFencingToken(
                f"fencing token {fencing_token} is not the current one for request "
                f"{request_id!r}; a newer attempt owns it"
            )
        # Bound but not yet marked delivered (the two steps of decision 203): the
        # executor holds the object, so its word ends the request like a delivered one's.

    return guard


def _require_token(request_id: str, fencing_token: int | None) -> None:
    if fencing_token is None:
        raise StaleFencingToken(
            f"a callback for request {request_id!r} must carry the fencing token it was "
            "delivered with (fencing_token)",
            code="fencing_token_required",
        )


def _judge_in_flight(
    request_id: str, state: RequestState, found: Any, target: str, fencing_token: int | None
) -> None:
    """A request with no binding yet: its executor may end it only while the delivery it
    names is the one in flight (docs/decisions/225).

    The worker that delivers it then finds it ended and writes nothing for it: no
    binding, no ``delivered`` mark (``OutboxStore.record_deliveries``)."""
    # A request that names no target goes to the default one, whichever that is now.
    delivered_to = found.outbox_target or found.default_target
    if state != RequestState.RESERVED or found.queued is None or found.outbox_delivered or (
        delivered_to != target
    ):
        # Another target's request, or one never delivered: the same answer as
        # for an id that does not exist, so an executor learns nothing of others.
        raise NotFound(f"request {request_id!r} does not exist", code="unknown_request")
    _require_token(request_id, fencing_token)
    assert fencing_token is not None
    claimed = int(found.claim_token or 0)
    if fencing_token > claimed:
        # No attempt with this token has been claimed yet (nothing can have been sent).
        raise NotDeliveredYet(
            f"request {request_id!r} is not being delivered with fencing token {fencing_token}; "
            "call back again once it is"
        )
    if fencing_token < claimed:
        raise StaleFencingToken(
            f"fencing token {fencing_token} is not the current one for request "
            f"{request_id!r}; a newer attempt owns it"
        )
