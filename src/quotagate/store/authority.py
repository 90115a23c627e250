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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import CHARGED_STATES, RequestState
from quotagate.errors import Conflict, Forbidden, NotFound, quoted
from quotagate.store import schema
from quotagate.store.driver import DriverTransaction

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
            f"request {quoted(row['id'])} is {row['state']}: only its executor or an admin may mark "
            f"it {to_state.value}; cancel it to ask for a stop",
            code="executor_only",
        )


@lru_cache(maxsize=64)
def callback_facts_query(count: int) -> sa.Select[Any]:
    """The binding, the outbox row and the default target of ``count`` requests
    (``guarded_0`` …), one row each, in one round trip: a group release judges all its
    callbacks with one read (docs/decisions/247). Built once per count (decision 246)."""
    request, binding, outbox, targets = (schema.request, schema.binding, schema.outbox,
                                         schema.delivery_target)
    default_target = (sa.select(targets.c.name).where(targets.c.is_default == sa.true())
                      .limit(1).scalar_subquery())
    return (
        sa.select(request.c.id, binding.c.target, binding.c.fencing_token,
                  outbox.c.target.label("outbox_target"), outbox.c.claim_token,
                  outbox.c.delivered.label("outbox_delivered"),
                  outbox.c.request_id.label("queued"), default_target.label("default_target"))
        .select_from(
            request.outerjoin(binding, binding.c.request_id == request.c.id)
            .outerjoin(outbox, outbox.c.request_id == request.c.id)
        )
        .where(request.c.id.in_([sa.bindparam(f"guarded_{index}") for index in range(count)]))
    )


@dataclass(frozen=True)
class CallbackFacts:
    """What an executor's callback is judged by, besides the locked request row."""

    target: str | None  # the binding's; None: nothing bound yet
    fencing_token: int | None  # the bound attempt's
    outbox_target: str | None
    claim_token: int | None  # the newest claim's
    outbox_delivered: bool | None
    queued: str | None  # the outbox row's request id: None when it has none
    default_target: str | None


def callback_facts(
    transaction: sa.Connection | DriverTransaction, request_ids: Sequence[str],
) -> dict[str, CallbackFacts]:
    """The :class:`CallbackFacts` of existing requests, by id, in one statement."""
    parameters = {f"guarded_{index}": request_id for index, request_id in enumerate(request_ids)}
    rows = transaction.execute(callback_facts_query(len(request_ids)), parameters).fetchall()
    return {row[0]: CallbackFacts(*row[1:]) for row in rows}


@dataclass(frozen=True)
class ExecutorGuard:
    """The guard for an executor token of ``target`` calling back with ``fencing_token``.

    Called as a :data:`ReleaseGuard` it reads its request's facts itself; a batch
    of releases reads the facts of all its callbacks at once (:func:`callback_facts`)
    and hands each to :meth:`judge` (docs/decisions/247): the same rules either way.
    """

    target: str
    fencing_token: int | None

    def __call__(self, connection: sa.Connection, row: Mapping[str, Any],
                 to_state: RequestState) -> None:
        self.judge(row, to_state, callback_facts(connection, [row["id"]])[row["id"]])

    def judge(self, row: Mapping[str, Any], _to_state: RequestState,
              found: CallbackFacts) -> None:
        """Raise unless this callback may end the locked ``row`` (its facts: ``found``)."""
        request_id = row["id"]
        fencing_token = self.fencing_token
        if found.target is None:
            _judge_in_flight(request_id, RequestState(row["state"]), found, self.target,
                             fencing_token)
            return
        if found.target != self.target:
            raise NotFound(f"request {quoted(request_id)} does not exist", code="unknown_request")
        _require_token(request_id, fencing_token)
        assert fencing_token is not None
        bound = int(found.fencing_token or 0)
        newest = max(bound, int(found.claim_token or 0))
        if not bound <= fencing_token <= newest:
            raise _stale(request_id, fencing_token, newest)
        # Bound but not yet marked delivered (the two steps of decision 203): the
        # executor holds the object, so its word ends the request like a delivered one's.


def executor_guard(target: str, fencing_token: int | None) -> ExecutorGuard:
    """The guard for an executor token of ``target`` calling back with ``fencing_token``."""
    return ExecutorGuard(target, fencing_token)


def _require_token(request_id: str, fencing_token: int | None) -> None:
    if fencing_token is None:
        raise StaleFencingToken(
            f"a callback for request {request_id!r} must carry the fencing token it was "
            "delivered with (fencing_token)",
            code="fencing_token_required",
        )


def _judge_in_flight(
    request_id: str, state: RequestState, found: CallbackFacts, target: str,
    fencing_token: int | None,
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
        raise NotFound(f"request {quoted(request_id)} does not exist", code="unknown_request")
    _require_token(request_id, fencing_token)
    assert fencing_token is not None
    claimed = int(found.claim_token or 0)
    if fencing_token > claimed:
        # No attempt with this token has been claimed yet (nothing can have been sent).
        raise NotDeliveredYet(
            f"request {quoted(request_id)} is not being delivered with fencing token "
            f"{quoted(fencing_token)}; "
            "call back again once it is"
        )
    if fencing_token < claimed:
        raise _stale(request_id, fencing_token, claimed)


def _stale(request_id: str, fencing_token: int, newest: int) -> StaleFencingToken:
    """The refusal of a token outside the current attempt's, in words that fit its side."""
    if fencing_token > newest:
        # Above every claim: not a stale executor but a token no delivery carried.
        return StaleFencingToken(
            f"fencing token {quoted(fencing_token)} was never given to a delivery of request "
            f"{quoted(request_id)}; send the Quotagate-Fencing-Token its delivery carried")
    return StaleFencingToken(
        f"fencing token {quoted(fencing_token)} is not the current one for request "
        f"{quoted(request_id)}; a newer attempt owns it")
