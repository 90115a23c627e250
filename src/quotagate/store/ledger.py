"""The admission ledger: submit, admit, release and expire, each one transaction.

Every check-and-charge is a conditional UPDATE that must affect exactly one
row; the Python side only *chooses* (domain.placement) from a snapshot, the
database decides. A stale snapshot makes a conditional UPDATE miss, which rolls
the whole transaction back and runs it again on fresh numbers.

Lock order, one for every transaction (docs/decisions/041-one-lock-order.md):
a worker's lease, request rows (id order) and their outbox rows, the decision
lock, plain tenants' quota rows, members' quota rows (both by tenant, resource),
cohort rooms, pool rows (by pool, slice, resource), budget rows. A transaction
waits only for a lock later than all it holds; SKIP LOCKED takes never wait.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import Decision
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import (
    RequestState,
    Submission,
    validate_reason,
)
from quotagate.domain.ordering import DEFAULT_AGING_INTERVAL
from quotagate.domain.placement import Candidate, Placement, has_room, plan_admissions
from quotagate.domain.placement import charge as charge_usage
from quotagate.domain.preemption import HeldRoom, Preemption, choose_preemption
from quotagate.domain.rate_refusal import rate_limited
from quotagate.domain.sharing import Sharing
from quotagate.errors import Conflict, InvalidInput, QuotagateError, quoted
from quotagate.store import (
    admission_stats,
    budgets,
    cohorts,
    fair_history,
    holds,
    identity,
    pool_slices,
    schema,
    statements,
    tenant_claims,
)
from quotagate.store import preemption as preemption_reads
from quotagate.store.admission_reads import AdmissionReads
from quotagate.store.audit import AuditEntry, record
from quotagate.store.authority import ReleaseGuard
from quotagate.store.charges import charge_rows
from quotagate.store.dialect import (
    begin_statement,
    code_point_collation,
    counts_other_commits,
    locks_in_lateral_join,
    materializes_derived_tables,
    reserve_writes_records,
    reserves_with_lock,
    run_transaction,
    supports_skip_locked,
)
from quotagate.store.driver import DriverTransaction, run_driver_transaction, run_on_connection
from quotagate.store.head_rows import candidate, cost_items, head_entries
from quotagate.store.kept_connection import KeptConnection
from quotagate.store.rate_gate import RateGate
from quotagate.store.release import End, ReleaseResult, lock_decisions, release_batch
from quotagate.store.rows import request_from_row
from quotagate.store.steady_admission import SteadyAdmission
from quotagate.store.submission import (
    SubmitResult,
    new_row,
    replayed,
    submit_audit,
    submit_batch,
)
from quotagate.store.submission_facts import require_submittable

__all__ = ["DEFAULT_ADMISSION_WINDOW", "DEFAULT_TTL", "End", "Ledger", "ReleaseResult", "SubmitResult"]

DEFAULT_TTL = 3600.0
# How many waiting requests of each tenant one admission looks at. A request
# further back than this, behind requests of its own tenant that do not fit,
# waits until the head of that tenant's queue moves (see docs/admission.md).
DEFAULT_ADMISSION_WINDOW = 32
_MAX_EXPIRED_PER_PASS = 1000


class CapacityChanged(Exception):
    """A conditional charge missed: the snapshot was stale. The transaction is rerun."""


@dataclass
class _HeldDecision:
    """The rate decision of one submit call, kept across reruns of its transaction.

    A token from a store outside the ledger database (Redis) is taken once per
    call, not once per rerun, and given back if the call ends without
    recording the request as waiting.
    """

    decision: Decision | None = None


class _TokenNeeded(Exception):
    """A transaction reached the take of a store outside the ledger database.

    It rolls back; the token is taken with no transaction open, and the
    transaction runs again with the decision. A Redis that is slow or silent
    then holds no SQLite write lock and no row lock, only its own caller
    (docs/decisions/111-outside-take-outside-the-transaction.md).
    """


def _first_window(admission_window: int, limit: int) -> int:
    """How many heads of each queue an admission of ``limit`` looks at first: most are
    decided by the first few requests of each queue; the whole window is read only when
    those do not fill the batch."""
    return min(admission_window, max(4, 2 * limit))


def _open_tenants(tenants: Mapping[str, Mapping[str, tuple[int, int]]],
                  sharing: Sharing) -> list[str]:
    """The tenants that could take one more unit of something, by name."""
    roots = sharing.roots
    if not roots:  # no cohorts (the common case): one test per tenant, a list not a generator
        return sorted([name for name, usage in tenants.items() if has_room(usage)])
    return sorted(
        name for name, usage in tenants.items()
        if (sharing.open(name, usage) if name in roots else has_room(usage))
    )


class Ledger:
    """Write side of the ledger. Safe to share between threads of one process."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock | None = None,
        aging_interval: float = DEFAULT_AGING_INTERVAL,
        ttl: float = DEFAULT_TTL,
        admission_window: int = DEFAULT_ADMISSION_WINDOW,
        expiry_every: float = 1.0,
        rate_gate: RateGate | None = None,
        hold_seconds: float = holds.DEFAULT_HOLD_SECONDS,
        narrow_seconds: float = tenant_claims.NARROW_SECONDS,
        reuse_reads: bool = True,
    ) -> None:
        if aging_interval <= 0:
            raise InvalidInput("aging interval must be positive", code="invalid_aging_interval")
        if ttl <= 0:
            raise InvalidInput("ttl must be positive", code="invalid_ttl")
        if admission_window < 1:
            raise InvalidInput("admission window must be at least 1", code="invalid_window")
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        self.aging_interval = aging_interval
        self.ttl = ttl
        self.admission_window = admission_window
        self.expiry_every = expiry_every
        # How long the room a preemption frees is held for its preemptor.
        self.hold_seconds = hold_seconds
        # None: no rate quotas at all. With a gate, tenants without a bucket are unlimited.
        self.rate_gate = rate_gate
        self._last_expiry = float("-inf")
        self._expiry_lock = threading.Lock()
        # Set by each admission from its snapshot: does any tenant have a preemption policy?
        self._policies_seen = False
        self._lock_row_ready = False
        # Whether another admitter was seen lately: then claim tenants one by one.
        self._contention = tenant_claims.Contention(narrow_seconds)
        self._dry_queues = tenant_claims.DryQueues()
        # Admission's connection, kept between admissions where the dialect allows.
        self._admission_connection = KeptConnection(engine)
        # Its snapshot and queue heads, kept while nobody else writes (SQLite; False:
        # read at every admission, for comparisons).
        self._reads = AdmissionReads(engine, admission_window, enabled=reuse_reads)
        # Where an admission waits for another writer, for the lock-wait histogram: on
        # SQLite at BEGIN IMMEDIATE, which takes the only write lock (its statements
        # then never wait); on the servers in the statements that lock rows.
        locks_at_begin = begin_statement(engine) is not None
        self._begin_waited = admission_stats.observe_lock_wait if locks_at_begin else None
        self._lock_wait = admission_stats.no_lock_wait if locks_at_begin \
            else admission_stats.lock_wait
        # admit(1) decided on those kept reads alone, while they are current (SQLite).
        self._steady = SteadyAdmission(
            engine, self._reads, self._admission_connection, self.clock,
            _first_window(admission_window, 1), admission_window,
            admission_stats.observe_lock_wait,
        ) if reuse_reads and counts_other_commits(engine) else None

    def close(self) -> None:
        """Hand back the connection admission keeps between calls (quotagate.store.driver),
        and forget the reads kept with it (quotagate.store.admission_reads)."""
        self._admission_connection.close()
        self._reads.close()

    # -- submit ----------------------------------------------------------------

    def submit(self, submission: Submission, *, actor: str = "system") -> SubmitResult:
        """Record a request as waiting, or answer the original for an identical replay.

        With a rate gate, a new request — or a rejected one submitted again —
        takes a token first: the quota is decided before the request enters the
        queue (docs/rate-quotas.md). Without one it is recorded ``rejected`` with its
        reason, and :class:`RateLimited` is raised once that has committed.
        """
        held = _HeldDecision()
        try:
            result = self._submit_with_retries(submission, actor, held)
        except BaseException:
            if held.decision is not None and held.decision.granted and self.rate_gate:
                self.rate_gate.refund(submission.tenant)
            raise
        decision = held.decision
        if decision is None:
            return result
        if not decision.granted and result.request.state == RequestState.REJECTED:
            raise rate_limited(decision, submission.tenant, submission.id)
        if decision.granted and not result.created and self.rate_gate:
            # A rerun found the request recorded by a concurrent submit: unused token.
            self.rate_gate.refund(submission.tenant)
        return result

    def submit_many(
        self, submissions: Sequence[Submission], *, actor: str = "system"
    ) -> list[SubmitResult | QuotagateError]:
        """Submit many requests of one tenant in one transaction: each entry's result or
        refusal, in order, as :meth:`submit` would give it alone (docs/decisions/224).

        A :class:`~quotagate.errors.RateLimited` refusal is returned like any other
        (its ``rejected`` row committed with the batch)."""
        return submit_batch(
            self.engine, submissions, actor=actor, clock=self.clock,
            aging_interval=self.aging_interval, rate_gate=self.rate_gate,
            submit_one=lambda submission: self.submit(submission, actor=actor),
        )

    def _submit_with_retries(
        self, submission: Submission, actor: str, held: _HeldDecision
    ) -> SubmitResult:
        for _ in range(4):
            try:
                return run_transaction(
                    self.engine,
                    lambda connection: self._submit(connection, submission, actor, held),
                )
            except IntegrityError:
                # Two submits of one new id raced; the loser reads the winner's row.
                continue
            except _TokenNeeded:
                assert self.rate_gate is not None
                held.decision = self.rate_gate.take_outside(submission.tenant)
        raise Conflict(f"request {quoted(submission.id)} is being submitted concurrently; retry")

    def _submit(
        self, connection: sa.Connection, submission: Submission, actor: str, held: _HeldDecision
    ) -> SubmitResult:
        # The facts read and the writes on the driver cursor, in the transaction
        # ``connection`` began; a replay and a token take stay SQLAlchemy on it.
        return run_on_connection(connection, partial(
            self._submit_on, connection=connection, submission=submission, actor=actor,
            held=held))

    def _submit_on(
        self, transaction: DriverTransaction, *, connection: sa.Connection,
        submission: Submission, actor: str, held: _HeldDecision,
    ) -> SubmitResult:
        facts: dict[str, set[str]] = {}
        resources = list(submission.cost)
        for fact, value in transaction.rows(
            statements.submission_facts_query(submission.target is not None, len(resources)),
            statements.submission_facts_parameters(submission.id, submission.tenant, resources,
                                                   submission.target),
        ):
            facts.setdefault(fact, set()).add(value)
        existing = None
        if "request" in facts:
            existing = connection.execute(
                sa.select(schema.request).where(schema.request.c.id == submission.id)
            ).mappings().first()
        if existing is not None:
            original = replayed(existing, submission)
            if original.state != RequestState.REJECTED:
                return SubmitResult(original, created=False)
            # A rejected request never entered the queue: submitting it again is a
            # new attempt. Lock the row so two such attempts do not both take a token.
            existing = connection.execute(
                sa.select(schema.request)
                .where(schema.request.c.id == submission.id)
                .with_for_update()
            ).mappings().one()
            if existing["state"] != RequestState.REJECTED.value:
                return SubmitResult(request_from_row(dict(existing)), created=False)
        now = self.clock.now()
        require_submittable(submission, facts)
        # Everything is valid: only now may a token be spent on this request.
        # A tenant without a rate quota has no bucket row: no token to take.
        decision = (
            self._take_token(connection, submission.tenant, held) if "bucket" in facts else None
        )
        row = new_row(submission, decision, now, self.aging_interval, facts)
        if existing is None:
            transaction.execute(statements.request_insert(tuple(row)), row)
        else:
            connection.execute(
                schema.request.update()
                .where(schema.request.c.id == submission.id)
                .values(state=row["state"], queue_key=row["queue_key"], created=now, updated=now,
                        reason=row["reason"], payload=row["payload"])
            )
        record(transaction, now, submit_audit(actor, row))
        return SubmitResult(request_from_row(row), created=True)

    def _take_token(
        self, connection: sa.Connection, tenant: str, held: _HeldDecision
    ) -> Decision | None:
        if self.rate_gate is None:
            return None
        # In the ledger database the take reruns (and rolls back) with the transaction;
        # in another store it happens once, for good, outside any transaction, and is
        # kept for the reruns.
        if self.rate_gate.in_transaction:
            held.decision = self.rate_gate.take_for_submission(connection, tenant)
        elif held.decision is None:
            raise _TokenNeeded
        return held.decision

    # -- admit -----------------------------------------------------------------

    def admit(self, limit: int = 1, *, actor: str = "admission") -> list[Placement]:
        """Admit up to ``limit`` waiting requests in one transaction; return what was admitted."""
        if limit < 1:
            raise InvalidInput("admit limit must be at least 1", code="invalid_limit")
        self._expire_if_due()
        if limit == 1 and self._steady is not None:
            admitted = self._steady.admit(actor, partial(self._admit_one_in, actor=actor))
            if admitted is not None:
                if not admitted and self._policies_seen:
                    self.preempt(actor=actor)  # as below
                return admitted
        claim = True
        for _ in range(50):
            try:
                # On the driver connection: SQLAlchemy's Connection would cost more
                # than the database does here (quotagate.store.driver).
                admitted = run_driver_transaction(
                    self.engine, self._reads.noting(
                        partial(self._admit, limit=limit, actor=actor, claim=claim)),
                    on_retry=admission_stats.count_database_rerun,
                    kept=self._admission_connection, begin_waited=self._begin_waited,
                )
                self._reads.committed()
            except tenant_claims.ClaimsTooNarrow:
                # The tenants this admitter could claim had nothing to admit. Waiting on
                # the others' tenant rows while holding its claims could deadlock
                # another admitter doing the same: roll back and run once more holding
                # nothing, waiting for each tenant in name order (Ledger._fill_narrow).
                admission_stats.count_rerun("claims_too_narrow")
                claim = False
                continue
            except CapacityChanged:
                admission_stats.count_rerun("stale_snapshot")
                self._contention.seen()
                continue
            except pool_slices.SliceFragmented as fragmented:
                # The pool had room, no slice of it did: move room, in a transaction
                # of its own, and plan again (docs/decisions/029-capacity-slices.md).
                admission_stats.count_rerun("stale_snapshot")
                run_transaction(self.engine, partial(
                    pool_slices.rebalance, pool=fragmented.pool, need=fragmented.need))
                continue
            if not admitted and self._policies_seen:
                # Nothing fits and some tenant may preempt: choose, in a transaction of
                # its own; the preemptor is admitted by a later pass, once the cost is back.
                self.preempt(actor=actor)
            return admitted
        return []

    def _admit_one_in(self, transaction: DriverTransaction, *, actor: str) -> list[Placement]:
        """The general admission of one request, in a transaction begun by the steady one."""
        return self._reads.noting(partial(self._admit, limit=1, actor=actor))(transaction)

    # -- preempt ---------------------------------------------------------------

    def preempt(self, *, actor: str = "admission") -> Preemption | None:
        """Stop running work so the first waiting request that may preempt fits.

        Victims go ``reserved``/``delivered`` → ``preempting``: still charged, their
        outbox rows stops for a worker, exactly as a cancel (docs/decisions/211);
        the confirmed stop makes them ``preempted`` and returns their cost once.
        Chosen from one snapshot in one transaction; each victim's change is
        conditional on its state, so two admitters never stop one twice.
        """
        if not self._lock_row_ready:
            identity.ledger_id(self.engine)  # the row preemption decisions lock exists
            self._lock_row_ready = True
        try:
            return run_transaction(self.engine,
                                   lambda connection: self._preempt(connection, actor))
        except CapacityChanged:
            return None  # a victim moved meanwhile: the next pass chooses again

    def _preempt(self, connection: sa.Connection, actor: str) -> Preemption | None:
        # One decision at a time, ledger-wide: two admitters deciding from
        # snapshots taken side by side would each stop victims for the same
        # preemptor. Under the lock, the snapshot sees every earlier decision's
        # victims as preempting (counted as coming back). Decisions are rare
        # (after a pass that admitted nothing), so the lock costs little.
        lock_decisions(connection)
        policies = {name: (reclaim, within) for name, reclaim, within in connection.execute(
            sa.select(schema.tenant.c.name, schema.tenant.c.reclaim, schema.tenant.c.within_tenant)
            .where(sa.or_(schema.tenant.c.reclaim != "never",
                          schema.tenant.c.within_tenant != "never")))}
        if not policies:
            return None
        # The reads are separate statements (each its own snapshot under READ
        # COMMITTED), ordered so that whatever commits between them makes the
        # choice take too little, never too much: running work first, then
        # usage, then the heads. A victim's confirmed stop, which would make it
        # vanish from the running work while its cost still shows in usage,
        # waits for the decision lock (Ledger._release).
        running = preemption_reads.running_work(connection, set(policies))
        snapshot = cohorts.snapshot_from_rows(
            connection.execute(statements.admission_snapshot_query()))
        request, outbox = schema.request, schema.outbox
        heads = sorted(
            connection.execute(statements.head_query(len(policies), self.admission_window),
                               statements.head_parameters(sorted(policies))),
            key=lambda head: (head.queue_key, head.created, head.id))
        if not heads:
            return None
        priorities: dict[str, int] = {}
        spared: dict[str, str] = {}
        for row in connection.execute(
            sa.select(request.c.id, request.c.priority, request.c.preempted_by)
            .where(request.c.id.in_([head.id for head in heads]))):
            priorities[row.id] = int(row.priority)
            if row.preempted_by is not None:
                spared[row.id] = row.preempted_by
        now = self.clock.now()
        holds.clean(connection, now)
        candidates = [Candidate(head.id, head.tenant, dict(cost_items(head.cost)),
                                head.reserved_runtime) for head in heads]
        if snapshot.budgeted:
            # Never stop work for a request its budget keeps waiting anyway.
            budget = budgets.read_budgets(connection, now)
            candidates = [candidate for candidate in candidates
                          if budget.fits(candidate.tenant, candidate.cost, candidate.runtime)]
        chosen = choose_preemption(
            candidates,
            priorities, tenants=snapshot.tenants, pools=snapshot.pools,
            sharing=snapshot.sharing, policies=policies, running=running, spared=spared,
            holders=holds.holders(connection, now))
        if chosen is None:
            return None
        if not preemption_reads.lock_victims(connection, [v.id for v in chosen.victims]):
            raise CapacityChanged("victim")  # being ended right now: choose again next pass
        preemptor_tenant = next(head.tenant for head in heads if head.id == chosen.preemptor)
        holds.hold(connection, chosen.preemptor, preemptor_tenant, now, self.hold_seconds)
        # The preemptor's own story names its victims (theirs name it).
        record(connection, now, AuditEntry(
            actor, "hold", "held", preemptor_tenant, chosen.preemptor,
            f"{chosen.kind}: room of {', '.join(victim.id for victim in chosen.victims)}"))
        for victim in chosen.victims:
            reason = f"preempted ({chosen.kind}) by {chosen.preemptor}"
            moved = connection.execute(
                request.update()
                .where(request.c.id == victim.id,
                       request.c.state.in_([RequestState.RESERVED.value,
                                            RequestState.DELIVERED.value]))
                .values(state=RequestState.PREEMPTING.value, updated=now, reason=reason,
                        preempted_by=chosen.preemptor))
            if moved.rowcount != 1:
                raise CapacityChanged(victim.id)
            # The stop, due at once; a delivered row's claim is spent (as _begin_stop).
            connection.execute(
                outbox.update().where(outbox.c.request_id == victim.id)
                .values(stopping=True, attempts=0, last_error=None, stop_progress=None,
                        claimed_by=sa.case((outbox.c.delivered == sa.true(), sa.null()),
                                           else_=outbox.c.claimed_by)))
            record(connection, now, AuditEntry(actor, "preempt", "stopping", victim.tenant,
                                               victim.id, f"{chosen.kind} for {chosen.preemptor}"))
        return chosen

    def _admit(
        self, transaction: DriverTransaction, limit: int, actor: str, *, claim: bool = True
    ) -> list[Placement]:
        snapshot = self._reads.snapshot(transaction)  # the last one's, if nobody wrote since
        guard: HeldRoom | None = None
        if snapshot.holds:
            # Freed room is held for a preemptor (docs/decisions/721): judge it on a
            # snapshot taken under the decision lock, which a victim's confirmed stop
            # takes too, so no two admitters spend the same freed room.
            transaction.rows(holds.lock_query(), {})
            snapshot = cohorts.snapshot_from_rows(
                transaction.rows(statements.admission_snapshot_query(), {}))
            guard = holds.read_guard(transaction, self.clock.now())
            if guard is None:  # every hold expired or lost its preemptor: forget them
                transaction.execute(holds.clean_statement(), {"now": self.clock.now()})
        tenants, pools, sharing = snapshot.tenants, snapshot.pools, snapshot.sharing
        self._policies_seen = bool(snapshot.policies)
        now = self.clock.now()
        if snapshot.budgeted:
            # One more read, only where some tenant has a budget.
            snapshot.budgets = budgets.budgets_from_rows(
                transaction.rows(budgets.budget_query(), {"now": now}))
        open_tenants = _open_tenants(tenants, sharing)
        if not open_tenants or not any(map(has_room, pools.values())):
            return []
        # Several admitters: plan for the tenants no other admitter is charging
        # (quotagate.store.tenant_claims) — one by one in fair order once another
        # admitter was seen, all the waiting ones at once with sliced pools; if
        # those had nothing that fits, roll back and run once for all of them
        # (Ledger.admit).
        narrow = supports_skip_locked(transaction) and (not claim or self._contention.recent())
        if narrow:
            admitted, targets, floors, narrowed = self._fill_narrow(
                transaction, open_tenants, snapshot, limit, now, guard, wait=not claim,
                actor=actor)
        else:
            admitted, targets, floors, narrowed = self._fill(
                transaction, open_tenants, snapshot, limit, now, guard,
                claim=claim and bool(snapshot.slices), actor=actor)
        if narrowed:
            self._contention.seen()
        if not admitted and narrowed:
            raise tenant_claims.ClaimsTooNarrow
        if not admitted:
            return []
        with self._lock_wait():
            self._charge(transaction, admitted, snapshot)
            if snapshot.budgets and not budgets.charge(transaction, admitted, snapshot.budgets):
                raise CapacityChanged("budget")
        if not reserve_writes_records(transaction):  # else _reserve wrote them
            self._record_admissions(transaction, admitted, targets, now, actor)
        if transaction.pending:
            # MariaDB batched the reserve, the charges and the records: their lock waits are here.
            with self._lock_wait():
                transaction.flush()
        carried = [{"request_id": placement.id, "token": floors[placement.id]}
                   for placement in admitted if placement.id in floors]
        if carried:  # requeued requests: their tokens go on above the stopped attempt's
            transaction.executemany(statements.carry_token_statement(), carried)
        if guard is not None:
            held = [placement.id for placement in admitted if placement.id in guard.ids]
            if held:  # the preemptor has its room: the hold is done
                transaction.execute(holds.release_statement(len(held)),
                                    {f"id_{index}": name for index, name in enumerate(held)})
        return admitted

    def _fill(
        self, transaction: DriverTransaction, open_tenants: Sequence[str],
        snapshot: cohorts.Snapshot, limit: int, now: float, guard: HeldRoom | None,
        *, claim: bool = False, actor: str,
    ) -> tuple[list[Placement], dict[str, str | None], dict[str, int], bool]:
        """Plan and reserve up to ``limit`` from the heads of ``open_tenants``' queues.

        Returns the placements, the requests' targets, the token floors of
        requeued ones (:meth:`_candidates`) and whether claims left tenants out:
        with ``claim`` (sliced pools: several admitters) only the tenants with
        waiting requests whose quota rows no other admitter holds are planned
        for (quotagate.store.tenant_claims).
        """
        window = _first_window(self.admission_window, limit)
        admitted: list[Placement] = []
        targets: dict[str, str | None] = {}
        claimed: set[str] | None = None
        narrowed = False
        floors: dict[str, int] = {}
        while True:
            candidates, window_targets, window_floors = self._candidates(
                transaction, open_tenants, window)
            targets.update(window_targets)
            floors.update(window_floors)
            if claim:
                if claimed is None:
                    waiting = sorted({candidate.tenant for candidate in candidates})
                    claimed = set(tenant_claims.claim_tenants(
                        transaction, waiting, snapshot.tenants, snapshot.sharing.roots))
                    narrowed = len(claimed) < len(waiting)
                candidates = [c for c in candidates if c.tenant in claimed]
            # No other admitter seen lately (else Ledger._fill_narrow runs): alone.
            admitted += self._plan_and_reserve(
                transaction, candidates, snapshot, limit - len(admitted), now, guard, actor=actor,
                alone=True,
            )
            if len(admitted) == limit or window >= self.admission_window:
                break
            per_tenant = Counter(candidate.tenant for candidate in candidates)
            if not any(count == window for count in per_tenant.values()):
                break  # every queue was read to its end already
            # The wider read no longer sees what was just reserved (it is not
            # waiting any more), and plans on usage that includes it.
            window = self.admission_window
        return admitted, targets, floors, narrowed

    def _fill_narrow(
        self, transaction: DriverTransaction, open_tenants: Sequence[str],
        snapshot: cohorts.Snapshot, limit: int, now: float, guard: HeldRoom | None,
        *, wait: bool = False, actor: str,
    ) -> tuple[list[Placement], dict[str, str | None], dict[str, int], bool]:
        """:meth:`_fill` for an admitter that saw others: claim plain tenants one by one.

        In fair order (lowest dominant share first), a tenant another admitter
        holds is skipped; each tenant claimed has its heads read and planned
        for, with the cohort members' (never claimed) on the first round,
        until the batch is full or no tenant is left. If every tenant was held
        by others and this transaction holds no tenant row, it waits for the
        first of them: holding nothing, the wait closes no cycle, and it saves
        the rollback and rerun of :class:`~quotagate.store.tenant_claims.ClaimsTooNarrow`
        when there are as many admitters as tenants. A tenant this admitter last
        read empty is claimed only if it has work again (``Claim.EMPTY``,
        docs/decisions/045-dry-tenants-are-not-claimed.md): a dry tenant's rows
        held would forbid that wait. Returns as :meth:`_fill`: the flag says some
        tenant was skipped. On PostgreSQL the tenants are tried, and the heads of
        the one got read, in one statement per claim (tenant_claims.claim_first,
        docs/decisions/046-claim-and-heads-in-one-statement.md).

        With ``wait`` (the rerun after :class:`~quotagate.store.tenant_claims.ClaimsTooNarrow`,
        holding nothing) the tenants are taken in name order, each waited for:
        every tenant is looked at, so an empty batch means nothing fits, and
        only as many tenants are held as the batch needs.
        """
        sharing = snapshot.sharing
        members = [tenant for tenant in open_tenants if sharing.is_member(tenant)]
        plain = [tenant for tenant in open_tenants if not sharing.is_member(tenant)]
        order = sorted(plain) if wait else tenant_claims.fair_order(
            plain, snapshot.tenants, snapshot.weights, fair_history.history(snapshot, now))
        pending = iter(order)
        # PostgreSQL tries the tenants in one statement that also reads the heads of the
        # one it got (tenant_claims.claim_first): a round trip per admission instead of
        # one per tenant tried plus the head read. Not for the waiting rerun.
        one_statement = not wait and locks_in_lateral_join(transaction)
        dry = {tenant for tenant in order if tenant in self._dry_queues} if one_statement else set()
        admitted: list[Placement] = []
        targets: dict[str, str | None] = {}
        floors: dict[str, int] = {}
        skipped = False
        first_held: str | None = None  # the first tenant skipped, none of its rows got
        holding = False  # some tenant rows are locked by this transaction
        reading = members
        while len(admitted) < limit:
            claimed: str | None = None
            heads: list[Any] | None = None  # the claimed tenant's, read with its claim
            while one_statement and order and claimed is None:
                first = tenant_claims.claim_first(transaction, order, snapshot.tenants, dry,
                                                  self.admission_window)
                skipped = skipped or first.skipped > 0
                if first_held is None and first.first_held is not None:
                    first_held = order[first.first_held]
                if first.index is None:
                    order = []
                    break
                tenant, order = order[first.index], order[first.index + 1:]
                holding = True
                if first.claim is tenant_claims.Claim.CLAIMED:
                    claimed, heads = tenant, first.heads
                else:  # partly got: held until the end, not planned for (as below)
                    skipped = True
                    first_held = first_held or tenant
            for tenant in () if one_statement else pending:
                got = tenant_claims.claim_tenant(transaction, tenant, snapshot.tenants[tenant],
                                                 wait=wait, dry=tenant in self._dry_queues)
                if got is tenant_claims.Claim.CLAIMED:
                    claimed = tenant
                    holding = True
                    break
                if got is tenant_claims.Claim.EMPTY:
                    # Its queue is still dry (tenant_claims.DryQueues): nothing locked,
                    # nothing to read. Not counted as skipped, so at the drain's tail,
                    # admitters outnumbering the tenants left wait for a held tenant
                    # instead of rolling back.
                    continue
                skipped = True
                holding = holding or got is tenant_claims.Claim.PARTLY
                first_held = first_held or tenant
            if claimed is None and not holding and first_held is not None:
                got = tenant_claims.claim_tenant(
                    transaction, first_held, snapshot.tenants[first_held], wait=True,
                    dry=first_held in self._dry_queues)
                holding = got is not tenant_claims.Claim.EMPTY
                if got is tenant_claims.Claim.CLAIMED:
                    claimed = first_held
                first_held = None  # waited for once: not again in a later round
            if claimed is not None and heads is None:
                reading = [*reading, claimed]
            if not reading and heads is None:
                break
            candidates, window_targets, window_floors = self._candidates(
                transaction, reading, self.admission_window, heads)
            if claimed is not None:
                self._dry_queues.read(
                    claimed, empty=not any(c.tenant == claimed for c in candidates))
            targets.update(window_targets)
            floors.update(window_floors)
            admitted += self._plan_and_reserve(
                transaction, candidates, snapshot, limit - len(admitted), now, guard, actor=actor)
            if claimed is None:
                break
            reading = []
        return admitted, targets, floors, skipped

    def _plan_and_reserve(
        self,
        transaction: DriverTransaction,
        candidates: list[Candidate],
        snapshot: cohorts.Snapshot,
        limit: int,
        now: float,
        guard: HeldRoom | None = None,
        *,
        actor: str,
        alone: bool = False,
    ) -> list[Placement]:
        """Plan on the snapshot and reserve what was planned; charge the snapshot with it.

        Another admitter may hold some of our picks; those are skipped and, if
        none could be had, the plan is made again without them, a few rounds at
        most. When only some were had, they are kept: the pools chosen for them
        still fit (the skipped ones would only have used more room), and the
        next call takes the rest. ``alone`` (no other admitter seen lately): on
        MariaDB a pick another transaction holds reruns the admission instead
        (:meth:`_reserve`).
        """
        tenants, pools, sharing = snapshot.tenants, snapshot.pools, snapshot.sharing
        skipped: set[str] = set()
        for _ in range(4):
            # Fair sharing between tenants, queue order within each (docs/fair-sharing.md).
            plan = plan_admissions(
                [c for c in candidates if c.id not in skipped] if skipped else candidates,
                tenants, pools, limit, sharing, snapshot.weights,
                budgets=snapshot.budgets or None, history=fair_history.history(snapshot, now),
                guard=guard,
            )
            if not plan:
                return []
            with self._lock_wait():
                got = self._reserve(transaction, plan, now, actor, alone=alone)
            if len(got) < len(plan):
                self._contention.seen()  # another admitter holds some of these requests
            if got:
                reserved = [placement for placement in plan if placement.id in got]
                for placement in reserved:
                    if sharing.is_member(placement.tenant):
                        sharing.charge(placement.tenant, placement.cost, tenants[placement.tenant])
                    charge_usage(tenants[placement.tenant], placement.cost)
                    charge_usage(pools[placement.pool], placement.cost)
                    snapshot.budgets.charge(placement.tenant, placement.cost, placement.runtime)
                return reserved
            skipped |= {placement.id for placement in plan}
        return []

    def _candidates(
        self, transaction: DriverTransaction, tenants: Sequence[str], window: int,
        read: list[Any] | None = None,
    ) -> tuple[list[Candidate], dict[str, str | None], dict[str, int]]:
        """The head of each open tenant's queue, merged into queue order, their targets,
        and the token floors of those that were requeued (docs/decisions/720).

        One bounded index range scan per tenant: the cost does not grow with
        the length of the waiting queue. ``read``: heads read already, in the
        head read's columns (a claim's, tenant_claims.claim_first), merged in.
        """
        candidates: list[Candidate] = []
        targets: dict[str, str | None] = {}
        floors: dict[str, int] = {}
        add = candidates.append
        if read is None and not self._reads.keeping(transaction):
            rows = transaction.rows(
                statements.ordered_head_query(len(tenants), window,
                                              code_point_collation(transaction),
                                              flat=materializes_derived_tables(transaction)),
                statements.head_parameters(tenants),
            ) if tenants else []
            # One pass over the rows for all three: a head read is a few rows per
            # tenant, at every admission.
            for request_id, tenant, cost, target, runtime, floor in rows:
                add(candidate(request_id, tenant, cost, runtime))
                targets[request_id] = target
                if floor:
                    floors[request_id] = int(floor)
            return candidates, targets, floors
        # Heads kept from an earlier admission (SQLite), with their candidates built
        # when first read (quotagate.store.head_rows), or read with a claim: merged
        # into queue order here (head entries sort as tuples).
        entries = self._reads.head_entries(transaction, tenants, window) if tenants else []
        if read:
            entries = [*head_entries(read), *entries]
        entries.sort()
        for _key, _created, request_id, kept, target, floor in entries:
            add(kept)
            targets[request_id] = target
            if floor:
                floors[request_id] = int(floor)
        return candidates, targets, floors

    @staticmethod
    def _reserve(
        transaction: DriverTransaction, plan: Sequence[Placement], now: float, actor: str,
        *, alone: bool = False,
    ) -> set[str]:
        """Set the planned requests reserved; return the ids that were.

        A request another admitter holds (or has just admitted) is skipped, not
        waited for. PostgreSQL locks and reserves in one statement, which also
        writes the outbox rows and audit entries of what it reserved
        (:meth:`_record_admissions` elsewhere); MySQL and MariaDB lock with a
        SELECT first; SQLite's transaction began IMMEDIATE and holds the only
        write lock, so the rows it read as waiting still are.

        An admitter ``alone`` on MariaDB sends no SELECT: the lock goes with the
        batched writes as a count the server checks (``expect_count``), so one
        pick held by another transaction fails the whole attempt with
        :class:`CapacityChanged`, whose rerun narrows (the other admitter is seen)
        and skips it as above (docs/decisions/053-mariadb-lock-in-the-write-batch.md).
        """
        if reserve_writes_records(transaction):
            rows = transaction.rows(statements.reserve_and_record_statement(),
                                    statements.reserve_arrays(plan, now, actor))
            return {row[0] for row in rows}
        chosen = list(plan)
        if supports_skip_locked(transaction):
            ids = {f"id_{index}": placement.id for index, placement in enumerate(plan)}
            if alone and transaction.batching:
                transaction.expect_count(
                    statements.count_locked_waiting_query(len(plan)), ids, len(plan),
                    CapacityChanged("held by another transaction"))
            else:
                got = {row[0] for row in transaction.rows(
                    statements.lock_waiting_query(len(plan)), ids)}
                chosen = [placement for placement in plan if placement.id in got]
                if not chosen:
                    return set()
        # Checked now or with the charges that follow (DriverTransaction.expect).
        transaction.expect(
            statements.reserve_statement(len(chosen)), statements.reserve_parameters(chosen, now),
            len(chosen), CapacityChanged(",".join(placement.id for placement in chosen)),
        )
        return {placement.id for placement in chosen}

    @staticmethod
    def _charge(
        transaction: DriverTransaction, placements: Sequence[Placement], snapshot: cohorts.Snapshot
    ) -> None:
        """Charge tenants, then pools: one conditional UPDATE per table for the whole batch
        (on SQLite one per row: docs/decisions/051-sqlite-charges-row-by-row.md).

        Cohort members are charged after the other tenants and before the pools,
        with their cohorts' rooms (quotagate.store.cohorts; the lock order).
        Pools are charged on their capacity slices (quotagate.store.pool_slices).
        """
        sharing = snapshot.sharing
        # A plain dict: a Counter's missing key costs a Python call (its __missing__).
        tenant_amounts: dict[tuple[str, str], int] = {}
        members: list[Placement] = []
        for placement in placements:
            member = sharing.is_member(placement.tenant)
            if member:
                members.append(placement)
                continue
            for resource, amount in placement.cost.items():
                key = (placement.tenant, resource)
                tenant_amounts[key] = tenant_amounts.get(key, 0) + amount
        lock_in_order = reserves_with_lock(transaction)
        if tenant_amounts:
            charge_rows(transaction, schema.tenant_quota, "tenant", tenant_amounts,
                        lock_in_order=lock_in_order, missed=CapacityChanged("tenant"))
        if members and not cohorts.charge_members(transaction, members, sharing.roots,
                                                  lock_in_order=lock_in_order):
            raise CapacityChanged("cohort")
        pool_slices.charge(transaction, placements, snapshot.slices, snapshot.pools,
                           lock_in_order=lock_in_order, missed=CapacityChanged("pool"))

    @staticmethod
    def _record_admissions(
        transaction: DriverTransaction,
        placements: Sequence[Placement],
        targets: dict[str, str | None],
        now: float,
        actor: str,
    ) -> None:
        """The outbox row and the audit entry of every admission (docs/invariants.md, 2),
        where the reserve did not write them (:meth:`_reserve`)."""
        # Batched with the reserve and the charges where the server checks their row
        # counts (DriverTransaction.write_many): one round trip for all of them on MariaDB.
        transaction.write_many(statements.outbox_insert(), [
            statements.outbox_row(placement, targets.get(placement.id), now)
            for placement in placements
        ])
        transaction.write_many(statements.admission_audit_insert(), [
            statements.admission_audit_row(placement, now, actor) for placement in placements
        ])

    # -- release ---------------------------------------------------------------

    def release(
        self,
        request_id: str,
        to_state: RequestState,
        *,
        reason: str | None = None,
        actor: str = "system",
        tenant: str | None = None,
        fence: Callable[[sa.Connection], None] | None = None,
        stopped: bool = False,
        guard: ReleaseGuard | None = None,
        admin: bool = False,
        force: bool = False,
    ) -> ReleaseResult:
        """Move a request to a final state, returning its charged cost exactly once.

        ``tenant``, when given, scopes the call: a request of another tenant is
        reported as not found. ``fence``, when given, runs first inside the same
        transaction (a worker's lease check); it raises StaleGeneration to refuse
        the release, which then changes nothing. ``guard``, when given, judges the
        locked request row (who may end it: :mod:`quotagate.store.authority`).

        Cancelling a ``reserved`` or ``delivered`` request is a stop: it becomes
        ``cancelling``, still charged, and its outbox row a stop for a worker to
        carry out. Only the worker that saw the target confirm the stop passes
        ``stopped=True``, which makes it ``cancelled`` and returns the cost
        (docs/decisions/211). A waiting request is cancelled at once.

        ``admin``: an admin's verdict, not the executor's word. A complete or fail
        of work an executor may hold (delivered, or reserved with its delivery
        taken up) is then a stop too: ``completing``/``failing``, charged until
        the confirmed stop ends it in the verdict (docs/decisions/819). ``force``
        (with ``admin``) ends it now, stopping or not, and returns the cost now,
        audited ``forced``: the override for a lost executor (docs/decisions/820).

        A batch of one for :meth:`release_many`.
        """
        reason = validate_reason(reason)
        end = End(request_id, to_state, reason=reason, actor=actor, tenant=tenant, guard=guard,
                  stopped=stopped, admin=admin, force=force)
        (result,) = self.release_many([end], fence=fence)
        if isinstance(result, Exception):
            raise result
        return result

    def release_many(
        self, ends: Sequence[End], *, fence: Callable[[sa.Connection], None] | None = None
    ) -> list[ReleaseResult | Exception]:
        """End many requests in one transaction (:mod:`quotagate.store.release`).

        One result per end, in order: its :class:`ReleaseResult`, or the error
        that refused it (which wrote nothing). ``fence`` runs once, first; if it
        refuses, nothing is written and its error is raised.
        """
        if not ends:
            return []
        return run_transaction(
            self.engine,
            lambda connection: release_batch(connection, ends, self.clock.now(), fence),
        )

    # -- expire ----------------------------------------------------------------

    def expire(self, *, actor: str = "expiry") -> int:
        """Mark waiting requests older than the TTL expired; return how many."""
        total = 0
        while True:
            count = run_transaction(self.engine, lambda connection: self._expire(connection, actor))
            total += count
            if count < _MAX_EXPIRED_PER_PASS:
                return total

    def _expire_if_due(self) -> None:
        now = self.clock.now()
        with self._expiry_lock:
            if now - self._last_expiry < self.expiry_every:
                return
            self._last_expiry = now
        self.expire()

    def _expire(self, connection: sa.Connection, actor: str) -> int:
        now = self.clock.now()
        request = schema.request
        query = (
            sa.select(request.c.id, request.c.tenant)
            .where(request.c.state == RequestState.WAITING.value, request.c.created < now - self.ttl,
                   # A requeued request waits its TTL again from its requeue.
                   sa.or_(request.c.attempt == 1, request.c.updated < now - self.ttl))
            .order_by(request.c.created)
            .limit(_MAX_EXPIRED_PER_PASS)
        )
        if supports_skip_locked(connection):
            query = query.with_for_update(skip_locked=True)
        rows = connection.execute(query).all()
        if not rows:
            return 0
        connection.execute(
            request.update()
            .where(
                request.c.id.in_([row[0] for row in rows]),
                request.c.state == RequestState.WAITING.value,
            )
            .values(state=RequestState.EXPIRED.value, updated=now, reason="ttl")
        )
        record(
            connection,
            now,
            *(AuditEntry(actor, "expire", "expired", tenant, request_id, "ttl")
              for request_id, tenant in rows),
        )
        return len(rows)
