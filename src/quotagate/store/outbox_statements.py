"""The statements of a delivery batch's claim and record, built once (per batch size).

A batch of 64 deliveries was a claim and a record transaction of Core
expressions built at every call, with expanding ``IN`` lists of 64 ids: about
9 ms of CPU to claim and 15 ms to record on PostgreSQL, most of it SQLAlchemy
(docs/decisions/253). These are the same statements, with bound parameters
(``id_0`` …) instead of values, cached here so that :mod:`quotagate.store.driver`
compiles each once per dialect and runs it on the transaction's driver cursor,
as the release path does (docs/decisions/246).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import RequestState
from quotagate.store import schema
from quotagate.store.dialect import dialect_now
from quotagate.store.release_statements import id_binds, id_parameters, state_is

__all__ = ["LEASE_PREFIX", "binding_insert", "bindings_query", "claim_due_statement",
           "claim_statement", "claimable_query", "claimed_tokens_query",
           "delivered_outbox_statement",
           "give_up_claims_statement", "id_parameters", "lock_claims_by_key_query",
           "lock_claims_query", "lock_states_query", "mark_delivered_statement",
           "record_by_arrays_statement", "requests_query"]

_outbox, _request, _binding, _lease = schema.outbox, schema.request, schema.binding, schema.lease
# id_parameters (from release_statements) gives the ``id_i`` parameters of the statements
# here that take ``len(ids)`` ids; outbox.py reaches it through this module.
# A worker's lease is named ``worker/<its name>``; its claims carry the name.
LEASE_PREFIX = "worker/"


@lru_cache(maxsize=32)
def claimable_query(dialect: str, stops: bool, limit: int, skip_locked: bool) -> sa.Select[Any]:
    """Up to ``limit`` due rows of one kind (stops, or deliveries), oldest due first.

    A row is claimable when nobody holds it, or when its holder's lease is no
    longer alive (expired by the database clock, or taken over by a newer
    generation): a claim lives exactly as long as the lease it was made under
    (docs/decisions/212). Due is judged by the database clock too; a first
    attempt is due at once, whatever clock wrote the row. Rows another worker
    has locked are skipped (``skip_locked``), not waited for. One query per kind,
    each read from its own index, rather than one OR that would scan every
    delivered row the outbox keeps.
    """
    now = dialect_now(dialect)
    holder = _lease.alias("holder")
    holder_alive = (
        sa.select(holder.c.name)
        .where(
            holder.c.name == sa.literal(LEASE_PREFIX) + _outbox.c.claimed_by,
            holder.c.owner == _outbox.c.claimed_by,
            holder.c.generation == _outbox.c.claim_generation,
            holder.c.expires_at >= now,
        )
        .exists()
    )
    claimable = sa.and_(
        sa.or_(_outbox.c.attempts == 0, _outbox.c.next_attempt_at <= now),
        sa.or_(_outbox.c.claimed_by.is_(None), ~holder_alive),
    )
    kind = (_outbox.c.stopping == sa.true() if stops
            else sa.and_(_outbox.c.delivered == sa.false(), _outbox.c.stopping == sa.false()))
    query = (
        sa.select(_outbox.c.request_id, _outbox.c.tenant, _outbox.c.target,
                  _outbox.c.attempts, _outbox.c.claim_token, _outbox.c.stopping)
        .where(kind, claimable)
        .order_by(_outbox.c.next_attempt_at, _outbox.c.request_id)
        .limit(limit)
    )
    return query.with_for_update(skip_locked=True) if skip_locked else query


@lru_cache(maxsize=64)
def claim_statement(count: int) -> sa.Update:
    """Claim ``count`` rows (``id_i``) still at claim ``token`` for ``owner``'s
    ``generation`` (held ``until``): each row's token goes one up."""
    return (
        _outbox.update()
        .where(_outbox.c.request_id.in_(id_binds(count)),
               _outbox.c.claim_token == sa.bindparam("token"))
        .values(claimed_by=sa.bindparam("owner"), claim_generation=sa.bindparam("generation"),
                claimed_until=sa.bindparam("until", type_=sa.Double),
                claim_token=_outbox.c.claim_token + 1)
    )


@lru_cache(maxsize=1)
def lock_claims_by_key_query() -> sa.TextClause:
    """PostgreSQL: :func:`lock_claims_query` for ``ids`` (an array, sorted), each row locked
    through its primary key in a LATERAL subquery: one lookup per id, in id order,
    whatever the statistics say (as the reserve's, docs/decisions/250)."""
    return sa.text(
        "SELECT held.request_id, held.claimed_by, held.claim_generation, held.claim_token,"
        " held.delivered FROM unnest(CAST(:ids AS TEXT[])) WITH ORDINALITY AS w(id, rank)"
        " CROSS JOIN LATERAL (SELECT request_id, claimed_by, claim_generation, claim_token,"
        f" delivered FROM {_outbox.name} WHERE request_id = w.id FOR UPDATE) AS held"
        " ORDER BY w.rank"
    )


@lru_cache(maxsize=64)
def claimed_tokens_query(count: int) -> sa.Select[Any]:
    """The tokens of those of ``count`` rows (``id_i``) ``owner``'s ``generation`` holds."""
    return sa.select(_outbox.c.request_id, _outbox.c.claim_token).where(
        _outbox.c.request_id.in_(id_binds(count)),
        _outbox.c.claimed_by == sa.bindparam("owner"),
        _outbox.c.claim_generation == sa.bindparam("generation"),
    )


@lru_cache(maxsize=64)
def requests_query(count: int) -> sa.Select[Any]:
    """What a target needs of ``count`` claimed requests (``id_i``)."""
    return sa.select(_request.c.id, _request.c.cost, _request.c.payload,
                     _request.c.attempt).where(_request.c.id.in_(id_binds(count)))


@lru_cache(maxsize=64)
def lock_states_query(count: int) -> sa.Select[Any]:
    """Lock ``count`` request rows (``id_i``, sorted) in id order; their states."""
    return (sa.select(_request.c.id, _request.c.state).where(_request.c.id.in_(id_binds(count)))
            .order_by(_request.c.id).with_for_update())


@lru_cache(maxsize=64)
def lock_claims_query(count: int) -> sa.Select[Any]:
    """Lock ``count`` outbox rows (``id_i``, sorted) in id order; the claim each carries."""
    return (sa.select(_outbox.c.request_id, _outbox.c.claimed_by, _outbox.c.claim_generation,
                      _outbox.c.claim_token, _outbox.c.delivered)
            .where(_outbox.c.request_id.in_(id_binds(count)))
            .order_by(_outbox.c.request_id).with_for_update())


@lru_cache(maxsize=64)
def bindings_query(count: int) -> sa.Select[Any]:
    """The bindings of ``count`` requests (``id_i``), where they have one."""
    return sa.select(_binding.c.request_id, _binding.c.external_name, _binding.c.uid).where(
        _binding.c.request_id.in_(id_binds(count)))


@lru_cache(maxsize=1)
def binding_insert() -> sa.Insert:
    """One binding row."""
    return _binding.insert().values(
        request_id=sa.bindparam("request_id"), target=sa.bindparam("target"),
        external_name=sa.bindparam("external_name"), uid=sa.bindparam("uid"),
        fencing_token=sa.bindparam("fencing_token"),
        created=sa.bindparam("created", type_=sa.Double),
    )


@lru_cache(maxsize=64)
def give_up_claims_statement(count: int) -> sa.Update:
    """``count`` outbox rows (``id_i``) left unclaimed: their requests left ``reserved``."""
    return (_outbox.update().where(_outbox.c.request_id.in_(id_binds(count)))
            .values(claimed_by=sa.null(), claim_generation=sa.null(), claimed_until=sa.null()))


@lru_cache(maxsize=64)
def delivered_outbox_statement(count: int) -> sa.Update:
    """``count`` outbox rows (``id_i``) delivered at ``now``."""
    return (_outbox.update().where(_outbox.c.request_id.in_(id_binds(count)))
            .values(delivered=sa.true(), delivered_at=sa.bindparam("now", type_=sa.Double),
                    claimed_until=sa.null(), last_error=sa.null()))


@lru_cache(maxsize=64)
def mark_delivered_statement(count: int) -> sa.Update:
    """``reserved`` → ``delivered`` (at ``now``) for ``count`` requests (``id_i``) a
    delivery batch locked and read reserved: found by id, their state only confirmed
    (release_statements.state_is, docs/decisions/256)."""
    return (_request.update()
            .where(_request.c.id.in_(id_binds(count)), state_is(RequestState.RESERVED.value))
            .values(state=RequestState.DELIVERED.value,
                    updated=sa.bindparam("now", type_=sa.Double)))


# PostgreSQL: a claim in one statement (docs/decisions/259). The claim was seven round
# trips (fence, BEGIN, the stops read, the deliveries read, the claim UPDATE, the
# requests read, COMMIT); each one, in a busy ``serve``, also waits for the GIL to come
# back to the dispatcher thread.
@lru_cache(maxsize=16)
def claim_due_statement(limit: int, stops: bool, deliveries: bool) -> sa.Update:
    """Lock up to ``limit`` due rows (stops first, then deliveries), claim them for
    ``owner``'s ``generation`` (held ``until``) and read what the targets need, at once.

    The reads are :func:`claimable_query`'s, each a CTE with its own ``FOR UPDATE SKIP
    LOCKED``: PostgreSQL reads a CTE only as far as the ``LIMIT`` above it asks, so the
    deliveries' rows are read (and locked) only for the room the stops left. The rows
    are locked before the UPDATE finds them again by key, so nobody changed their claim
    in between: no token condition is needed, and each row's token goes one up. The
    rows come back in no set order; ``next_attempt_at`` comes with them for the caller
    to sort by.
    """
    kinds = [stopping for stopping, wanted in ((True, stops), (False, deliveries)) if wanted]
    due = [
        sa.select(claimable_query("postgresql", stopping, limit, True)
                  .cte(f"due_{'stops' if stopping else 'deliveries'}").c.request_id)
        for stopping in kinds
    ]
    union = due[0] if len(due) == 1 else sa.union_all(*due)
    picked = sa.select(union.subquery("due").c.request_id).limit(limit).subquery("picked")
    # The ids as one array (an InitPlan), each row found again through its key: joined
    # to the CTE instead, an outbox the statistics did not know yet was read whole and
    # hashed (the trap of docs/decisions/254).
    ids = sa.cast(sa.select(sa.func.array_agg(picked.c.request_id)).scalar_subquery(),
                  sa.ARRAY(sa.Text))
    return (
        _outbox.update()
        .where(_outbox.c.request_id == sa.any_(ids), _request.c.id == _outbox.c.request_id)
        .values(claimed_by=sa.bindparam("owner"), claim_generation=sa.bindparam("generation"),
                claimed_until=sa.bindparam("until", type_=sa.Double),
                claim_token=_outbox.c.claim_token + 1)
        .returning(_outbox.c.request_id, _outbox.c.tenant, _outbox.c.target,
                   _outbox.c.attempts, _outbox.c.claim_token, _outbox.c.stopping,
                   _outbox.c.next_attempt_at, _request.c.cost, _request.c.payload,
                   _request.c.attempt)
    )


@lru_cache(maxsize=1)
def record_by_arrays_statement() -> sa.TextClause:
    """PostgreSQL: a delivery batch's four writes as one statement (docs/decisions/259).

    The bindings (``binding_*`` arrays, one item per new binding), the outbox rows'
    ``delivered`` mark and the requests' ``reserved → delivered`` (``marked``, an array
    of ids) and their audit entries (``audit_*``, in the batch's order), at ``now`` by
    ``actor``: :func:`binding_insert`, :func:`delivered_outbox_statement` (by one id
    array, as decision 254 wrote it), :func:`mark_delivered_statement` and the audit INSERT, which were four round trips
    and two ``executemany`` of 64 rows. Every row they touch was locked and checked by
    the batch's reads before; the data-modifying CTEs write different tables, so the
    one snapshot they share sees nothing another of them wrote.
    """
    return sa.text(
        f"WITH bound AS (INSERT INTO {_binding.name}"
        " (request_id, target, external_name, uid, fencing_token, created)"
        " SELECT item.request_id, item.target, item.external_name, item.uid,"
        " item.fencing_token, :now FROM unnest(CAST(:binding_ids AS TEXT[]),"
        " CAST(:binding_targets AS TEXT[]), CAST(:binding_names AS TEXT[]),"
        " CAST(:binding_uids AS TEXT[]), CAST(:binding_tokens AS BIGINT[]))"
        " AS item(request_id, target, external_name, uid, fencing_token)),"
        f" outbox_marked AS (UPDATE {_outbox.name} SET delivered = true,"
        " delivered_at = :now, claimed_until = NULL, last_error = NULL"
        " WHERE request_id = ANY(CAST(:marked AS TEXT[]))),"
        f" requests_marked AS (UPDATE {_request.name} SET state = :delivered, updated = :now"
        " WHERE id = ANY(CAST(:marked AS TEXT[])) AND coalesce(state, '') = :reserved)"
        f" INSERT INTO {schema.audit.name} (at, actor, tenant, operation, target, outcome,"
        " reason) SELECT :now, :actor, entry.tenant, 'deliver', entry.request_id,"
        " 'delivered', entry.reason FROM unnest(CAST(:audit_tenants AS TEXT[]),"
        " CAST(:marked AS TEXT[]), CAST(:audit_reasons AS TEXT[])) WITH ORDINALITY"
        " AS entry(tenant, request_id, reason, rank) ORDER BY entry.rank"
    ).bindparams(sa.bindparam("now", type_=sa.Double))
