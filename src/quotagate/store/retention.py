"""Retention: delete finished requests and old audit entries, in bounded batches.

Only requests in a final state (completed, failed, cancelled, expired, rejected,
preempted, timed_out) whose last change is older than the cutoff go, with their
outbox row and binding. A charged (reserved, delivered, or stopping) or waiting
request is never a candidate, and the candidates are locked before anything is
deleted: a rejected request submitted again at the same moment is either pruned
first (and the new submit creates it afresh) or becomes waiting first (and is
left alone).

Each batch is its own short transaction, so pruning a year of history never
holds a lock for long, and a prune that is killed halfway has removed whole
batches and nothing partial (docs/decisions/804-retention.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain import help_defaults
from quotagate.domain.model import FINAL_STATES
from quotagate.errors import Conflict, InvalidInput
from quotagate.store import schema
from quotagate.store.dialect import run_transaction

DEFAULT_BATCH = help_defaults.PRUNE_BATCH  # kept in domain.help_defaults: the CLI's help shows it
_FINAL = sorted(state.value for state in FINAL_STATES)


@dataclass(frozen=True)
class PrunedBinding:
    """The external object of a pruned request, for the target to clean up after."""

    request_id: str
    target: str
    external_name: str
    # A requeued request's earlier attempts had objects of their own (docs/decisions/720).
    tenant: str = ""
    attempt: int = 1


@dataclass(frozen=True)
class RequestBatch:
    request_ids: list[str]
    bindings: list[PrunedBinding]


def _check_batch(batch: int) -> None:
    if not 1 <= batch <= 10_000:
        raise InvalidInput("batch must be between 1 and 10000", code="invalid_batch")


def prune_request_batch(engine: Engine, cutoff: float, *, batch: int = DEFAULT_BATCH) -> RequestBatch:
    """Delete up to ``batch`` finished requests last changed before ``cutoff``."""
    _check_batch(batch)
    request = schema.request

    def work(connection: sa.Connection) -> RequestBatch:
        finished = sa.and_(request.c.state.in_(_FINAL), request.c.updated < cutoff)
        ids = list(connection.execute(
            sa.select(request.c.id).where(finished)
            .order_by(request.c.updated, request.c.id).limit(batch)
            .with_for_update()
        ).scalars())
        if not ids:
            return RequestBatch([], [])
        binding = schema.binding
        bindings = [
            PrunedBinding(row.request_id, row.target, row.external_name, row.tenant,
                          int(row.attempt))
            for row in connection.execute(
                sa.select(binding.c.request_id, binding.c.target, binding.c.external_name,
                          request.c.tenant, request.c.attempt)
                .select_from(binding.join(request, request.c.id == binding.c.request_id))
                .where(binding.c.request_id.in_(ids))
            )
        ]
        connection.execute(schema.outbox.delete().where(schema.outbox.c.request_id.in_(ids)))
        connection.execute(binding.delete().where(binding.c.request_id.in_(ids)))
        # The state condition again: the rows are locked, this is the last word on it.
        deleted = connection.execute(request.delete().where(request.c.id.in_(ids), finished))
        if deleted.rowcount != len(ids):
            # Cannot happen while the lock holds; if it ever does, undo the whole batch
            # rather than leave a live request without its outbox row.
            raise Conflict("a request changed state while being pruned; nothing was pruned",
                           code="prune_conflict")
        return RequestBatch(ids, bindings)

    return run_transaction(engine, work)


def prune_audit_batch(engine: Engine, cutoff: float, *, batch: int = DEFAULT_BATCH) -> int:
    """Delete up to ``batch`` audit entries written before ``cutoff``; how many went."""
    _check_batch(batch)
    audit = schema.audit

    def work(connection: sa.Connection) -> int:
        # Ids first: MySQL refuses DELETE … LIMIT with a subquery on the same table.
        ids = list(connection.execute(
            sa.select(audit.c.id).where(audit.c.at < cutoff).order_by(audit.c.id).limit(batch)
        ).scalars())
        if ids:
            connection.execute(audit.delete().where(audit.c.id.in_(ids)))
        return len(ids)

    return run_transaction(engine, work)


@dataclass(frozen=True)
class PruneProgress:
    """Running totals, reported after every batch."""

    requests: int = 0
    external_objects: int = 0
    audit_entries: int = 0
    done: bool = False


def prune(
    engine: Engine,
    cutoff: float,
    *,
    batch: int = DEFAULT_BATCH,
    forget: Callable[[list[PrunedBinding]], int] | None = None,
    progress: Callable[[PruneProgress], None] | None = None,
    max_batches: int | None = None,
) -> PruneProgress:
    """Prune everything past ``cutoff``, batch after batch, until nothing is left.

    ``forget`` removes what a pruned request left outside the database (a process
    target's run directory) and says how many it removed; it runs after the batch
    committed, so a crash in between leaves a stray directory, never a request
    whose run directory is gone. ``max_batches`` bounds one call (``serve`` prunes
    a little at a time).
    """
    totals = PruneProgress()
    batches = 0
    requests_left = True
    while max_batches is None or batches < max_batches:
        batches += 1
        if requests_left:
            pruned = prune_request_batch(engine, cutoff, batch=batch)
            if not pruned.request_ids:
                requests_left = False
                continue
            removed = forget(pruned.bindings) if forget and pruned.bindings else 0
            totals = replace(totals, requests=totals.requests + len(pruned.request_ids),
                             external_objects=totals.external_objects + removed)
        else:
            count = prune_audit_batch(engine, cutoff, batch=batch)
            if not count:
                totals = replace(totals, done=True)
                break
            totals = replace(totals, audit_entries=totals.audit_entries + count)
        if progress:
            progress(totals)
    if progress:
        progress(totals)
    return totals
