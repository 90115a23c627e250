"""Submit judged the same way for one request and for a batch of them.

A single submit (:meth:`quotagate.store.ledger.Ledger.submit`) and a batch
(:func:`submit_batch`, docs/decisions/224) must give every request the same
answer: a new request is recorded ``waiting`` (202), an identical replay
answers the original (200), a changed one is a conflict, bad references are
refused, a rate-limited tenant spends one token per new request or has it
recorded ``rejected``. The rules live here once; the two paths differ only in
how many rows one transaction writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import Decision
from quotagate.domain.clock import Clock
from quotagate.domain.model import Request, RequestState, Submission, kept_payload
from quotagate.domain.ordering import queue_key
from quotagate.domain.rate_refusal import rate_limited, rejection_reason
from quotagate.errors import Conflict, InvalidInput, QuotagateError, quoted
from quotagate.store import schema, statements
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import run_transaction
from quotagate.store.rate_gate import RateGate
from quotagate.store.rows import encode_cost, request_from_row
from quotagate.store.submission_facts import require_submittable

__all__ = ["SubmitResult", "TokenHolder", "refusal", "replayed", "submit_batch"]

# A batch that keeps losing the race for a new id to concurrent submits falls
# back to one transaction per entry, where each loser reads its winner's row.
_BATCH_ATTEMPTS = 3


@dataclass(frozen=True)
class SubmitResult:
    request: Request
    created: bool


@dataclass
class TokenHolder:
    """The rate decision of one submission, kept across reruns of its transaction.

    A token from a store outside the ledger database (Redis) is taken once per
    submission, not once per rerun, and given back if the call ends without
    recording the request as waiting.
    """

    decision: Decision | None = None


def refusal(submission: Submission, facts: Mapping[str, set[str]]) -> QuotagateError | None:
    """Why a new submission may not be recorded, from the facts read about it; None if it may."""
    try:
        require_submittable(submission, facts)
    except QuotagateError as error:
        return error
    return None


def _payload_as_kept(existing: Mapping[Any, Any], submission: Submission) -> str:
    """The submitted payload in the form the stored row keeps it (a rejected row may
    keep only its digest; one written before that rule, the whole payload)."""
    if existing["payload"] == submission.payload_json:
        return submission.payload_json
    return kept_payload(submission.payload_json, RequestState(existing["state"]))


def replayed(existing: Mapping[Any, Any], submission: Submission) -> Request:
    """The original request of an identical replay; :class:`Conflict` if anything differs."""
    differences = [
        name
        for name, stored, given in (
            ("tenant", existing["tenant"], submission.tenant),
            ("cost", existing["cost"], encode_cost(submission.cost)),
            ("priority", existing["priority"], submission.priority),
            ("payload", existing["payload"], _payload_as_kept(existing, submission)),
            ("target", existing["target"], submission.target),
            ("max_runtime", existing["max_runtime"], submission.max_runtime),
        )
        if stored != given
    ]
    if differences:
        raise Conflict(
            f"request {quoted(submission.id)} already exists with a different "
            f"{', '.join(differences)}; nothing was changed",
            code="request_conflict",
        )
    return request_from_row(existing)


def new_row(
    submission: Submission, decision: Decision | None, now: float, aging_interval: float,
    facts: Mapping[str, set[str]] | None = None,
) -> dict[str, Any]:
    """The request row a new attempt writes: ``waiting``, or ``rejected`` by the rate gate.

    Its reserved runtime is its own max-runtime, else the tenant's default now
    (a fact of :func:`quotagate.store.statements.submission_facts_query`): a
    later change of the default leaves waiting requests as they were.
    """
    refused = decision is not None and not decision.granted
    state = RequestState.REJECTED if refused else RequestState.WAITING
    return {
        "id": submission.id,
        "tenant": submission.tenant,
        "state": state.value,
        "cost": encode_cost(submission.cost),
        "priority": submission.priority,
        "payload": kept_payload(submission.payload_json, state),
        "target": submission.target,
        "pool": None,
        "queue_key": queue_key(submission.priority, now, aging_interval),
        "created": now,
        "updated": now,
        "reason": rejection_reason(decision) if decision is not None and refused else None,
        "max_runtime": submission.max_runtime,
        "reserved_runtime": reserved_runtime(submission, facts or {}),
        "admitted": None,
    }


def reserved_runtime(submission: Submission, facts: Mapping[str, set[str]]) -> int | None:
    """The max-runtime a budget reserves for ``submission``: its own, else the tenant's default."""
    if submission.max_runtime is not None:
        return submission.max_runtime
    default = facts.get("default_max_runtime")
    return int(next(iter(default))) if default else None


def submit_audit(actor: str, row: Mapping[str, Any]) -> AuditEntry:
    outcome = "accepted" if row["state"] == RequestState.WAITING.value else row["state"]
    return AuditEntry(actor, "submit", outcome, row["tenant"], row["id"], row["reason"])


# -- batches ---------------------------------------------------------------------------


class _TokensNeeded(Exception):
    """Entries of a batch reached the take of a store outside the ledger database.

    The transaction rolls back; their tokens are taken with none open, and the
    batch runs again with the decisions.
    """

    def __init__(self, tokens: list[TokenHolder]) -> None:
        super().__init__(f"{len(tokens)} tokens to take")
        self.tokens = tokens


@dataclass
class _Pending:
    """What one transaction of a batch is about to write."""

    inserts: dict[str, dict[str, Any]] = field(default_factory=dict)   # id -> new row
    updates: dict[str, dict[str, Any]] = field(default_factory=dict)   # id -> rejected row retried
    audit: list[AuditEntry] = field(default_factory=list)
    tokens_needed: list[TokenHolder] = field(default_factory=list)


def _facts_by_target(
    connection: sa.Connection, submissions: Sequence[Submission]
) -> dict[str | None, dict[str, set[str]]]:
    """The single submit's facts query, once per distinct target of the batch (most
    batches name one, or none), so a fact it learns is a fact every batch knows."""
    tenant = submissions[0].tenant
    resources = sorted({resource for submission in submissions for resource in submission.cost})
    found: dict[str | None, dict[str, set[str]]] = {}
    for target in sorted({submission.target for submission in submissions},
                         key=lambda name: name or ""):
        facts: dict[str, set[str]] = {}
        # No request has the empty id (ids are validated): the stored rows are read apart.
        for fact, value in connection.execute(
            statements.submission_facts_query(target is not None),
            {"id": "", "tenant": tenant, "resources": resources, "target": target},
        ):
            facts.setdefault(fact, set()).add(value)
        found[target] = facts
    return found


def submit_batch(
    engine: Engine,
    submissions: Sequence[Submission],
    *,
    actor: str,
    clock: Clock,
    aging_interval: float,
    rate_gate: RateGate | None,
    submit_one: Callable[[Submission], SubmitResult],
) -> list[SubmitResult | QuotagateError]:
    """Submit many requests of one tenant in one transaction; each answered as
    :meth:`~quotagate.store.ledger.Ledger.submit` would answer it alone, in order.

    Entries are judged one after another on what the ledger holds plus what the
    entries before them wrote, so an id repeated in the batch is new the first
    time and a replay (or a conflict) the second. A refused entry writes
    nothing; the others go on. ``submit_one`` is the single submit, the
    fallback when concurrent submits of the same new ids keep winning.
    """
    if not submissions:
        return []
    tenants = {submission.tenant for submission in submissions}
    if len(tenants) != 1:
        raise InvalidInput("a batch submits the requests of one tenant", code="invalid_batch")
    tokens = [TokenHolder() for _ in submissions]
    answers: list[SubmitResult | QuotagateError] = []
    try:
        lost_races = 0
        while True:
            try:
                answers = run_transaction(engine, lambda connection: _submit_batch(
                    connection, submissions, tokens, actor, clock.now(), aging_interval, rate_gate))
                break
            except IntegrityError:
                # A concurrent submit recorded one of the new ids first: judge again.
                lost_races += 1
                if lost_races >= _BATCH_ATTEMPTS:
                    answers = _one_by_one(submissions, tokens, rate_gate, submit_one)
                    break
            except _TokensNeeded as needed:
                # Taken with no transaction open, once per entry, and kept for the
                # reruns (docs/decisions/111): a silent store holds no ledger lock.
                assert rate_gate is not None
                for token in needed.tokens:
                    token.decision = rate_gate.take_outside(submissions[0].tenant)
    except BaseException:
        _refund(rate_gate, submissions, tokens, answers=None)
        raise
    _refund(rate_gate, submissions, tokens, answers)
    return [
        rate_limited(token.decision, submission.tenant, submission.id)
        if isinstance(answer, SubmitResult) and token.decision is not None
        and not token.decision.granted and answer.request.state == RequestState.REJECTED
        and answer.created
        else answer
        for answer, token, submission in zip(answers, tokens, submissions, strict=True)
    ]


def _one_by_one(
    submissions: Sequence[Submission], tokens: Sequence[TokenHolder],
    rate_gate: RateGate | None, submit_one: Callable[[Submission], SubmitResult],
) -> list[SubmitResult | QuotagateError]:
    # Tokens the failed batch attempts took outside the database go back first:
    # each single submit takes its own.
    _refund(rate_gate, submissions, tokens, answers=None)
    for token in tokens:
        token.decision = None
    answers: list[SubmitResult | QuotagateError] = []
    for submission in submissions:
        try:
            answers.append(submit_one(submission))
        except QuotagateError as error:
            answers.append(error)
    return answers


def _refund(
    rate_gate: RateGate | None, submissions: Sequence[Submission], tokens: Sequence[TokenHolder],
    answers: Sequence[SubmitResult | QuotagateError] | None,
) -> None:
    """Give back tokens taken outside the transaction for entries that recorded no new
    request (all of them when the batch did not commit)."""
    if rate_gate is None or rate_gate.in_transaction:
        return
    for index, token in enumerate(tokens):
        if token.decision is None or not token.decision.granted:
            continue
        answer = None if answers is None else answers[index]
        if not isinstance(answer, SubmitResult) or not answer.created:
            rate_gate.refund(submissions[index].tenant)


def _submit_batch(
    connection: sa.Connection, submissions: Sequence[Submission], tokens: Sequence[TokenHolder],
    actor: str, now: float, aging_interval: float, rate_gate: RateGate | None,
) -> list[SubmitResult | QuotagateError]:
    facts = _facts_by_target(connection, submissions)
    known = _existing_rows(connection, {submission.id for submission in submissions})
    pending = _Pending()
    answers: list[SubmitResult | QuotagateError] = []
    for submission, token in zip(submissions, tokens, strict=True):
        try:
            answers.append(_judge(connection, submission, token, facts[submission.target], known,
                                  pending, actor, now, aging_interval, rate_gate))
        except QuotagateError as error:
            answers.append(error)
    if pending.tokens_needed:
        raise _TokensNeeded(pending.tokens_needed)
    if pending.inserts:
        # In id order: concurrent batches of overlapping ids then wait on each other's
        # key locks in one order instead of deadlocking.
        connection.execute(schema.request.insert(),
                           [pending.inserts[id_] for id_ in sorted(pending.inserts)])
    for row in pending.updates.values():
        connection.execute(
            schema.request.update().where(schema.request.c.id == row["id"]).values(
                state=row["state"], queue_key=row["queue_key"], created=row["created"],
                updated=row["updated"], reason=row["reason"], payload=row["payload"]))
    record(connection, now, *pending.audit)
    return answers


def _existing_rows(connection: sa.Connection, ids: set[str]) -> dict[str, dict[str, Any]]:
    request = schema.request
    rows = {row["id"]: dict(row) for row in connection.execute(
        sa.select(request).where(request.c.id.in_(sorted(ids)))).mappings()}
    rejected = sorted(id_ for id_, row in rows.items() if row["state"] == RequestState.REJECTED.value)
    if rejected:
        # A rejected request submitted again is a new attempt: lock its row so two
        # such attempts do not both take a token (the single submit does the same).
        rows.update({row["id"]: dict(row) for row in connection.execute(
            sa.select(request).where(request.c.id.in_(rejected)).order_by(request.c.id)
            .with_for_update()).mappings()})
    return rows


def _judge(
    connection: sa.Connection, submission: Submission, token: TokenHolder,
    facts: Mapping[str, set[str]], known: dict[str, dict[str, Any]], pending: _Pending,
    actor: str, now: float, aging_interval: float, rate_gate: RateGate | None,
) -> SubmitResult:
    """One entry, judged as a single submit would judge it; raises its refusal."""
    existing = known.get(submission.id)
    if existing is not None:
        original = replayed(existing, submission)
        if original.state != RequestState.REJECTED:
            return SubmitResult(original, created=False)
    refused = refusal(submission, facts)
    if refused is not None:
        raise refused
    decision = None
    if "bucket" in facts and rate_gate is not None:
        # In the ledger database the take reruns (and rolls back) with the transaction;
        # in another store it happens once, for good, outside any transaction, and is
        # kept for the reruns.
        if rate_gate.in_transaction:
            token.decision = rate_gate.take_for_submission(connection, submission.tenant)
        elif token.decision is None:
            # Judged as if granted, so that later entries see it (a repeated id is a
            # replay); this attempt then rolls back and runs again with the decision.
            pending.tokens_needed.append(token)
        decision = token.decision
    row = new_row(submission, decision, now, aging_interval, facts)
    if existing is None or submission.id in pending.inserts:
        pending.inserts[submission.id] = row
    else:
        pending.updates[submission.id] = row
    known[submission.id] = row
    pending.audit.append(submit_audit(actor, row))
    return SubmitResult(request_from_row(row), created=True)
