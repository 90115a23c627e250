"""The composition root: one object wiring the stores together for a database URL."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Engine

from quotagate.domain.bucket import BucketConfig, config_from_mapping, parse_rate
from quotagate.domain.budget import parse_duration
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.lease import Lease
from quotagate.domain.model import (
    ON_PREEMPT_POLICIES,
    RECLAIM_POLICIES,
    WITHIN_TENANT_POLICIES,
    Request,
    RequestState,
    Submission,
    build_submission,
    validate_limits,
    validate_name,
    validate_policy,
    validate_priority,
    validate_weight,
)
from quotagate.domain.ordering import DEFAULT_AGING_INTERVAL
from quotagate.domain.placement import Placement
from quotagate.domain.sharing import KEEP, Keep, TenantSharing
from quotagate.errors import InvalidInput, NotFound, QuotagateError
from quotagate.rate.backend import RateStore
from quotagate.rate.keys import BucketKey
from quotagate.rate.quotas import RateQuotas
from quotagate.rate.sql import SqlRateStore
from quotagate.rate.stores import ENVIRONMENT_VARIABLE as RATE_STORE_VARIABLE
from quotagate.rate.stores import rate_store_from_url
from quotagate.store import census, identity, migrate, retention, stream_settings
from quotagate.store.audit import AuditEntry
from quotagate.store.authority import ReleaseGuard
from quotagate.store.budgets import budget_change
from quotagate.store.config import Configuration
from quotagate.store.counters import Counters, delivery_counters
from quotagate.store.diagnosis import AuditTrail, DeliveryTrail, audit_trail, delivery_trail
from quotagate.store.dialect import reading
from quotagate.store.engine import create_engine, database_url, shown_url
from quotagate.store.holds import DEFAULT_HOLD_SECONDS
from quotagate.store.ledger import (
    DEFAULT_ADMISSION_WINDOW,
    DEFAULT_TTL,
    End,
    Ledger,
    ReleaseResult,
    SubmitResult,
)
from quotagate.store.listing import AuditRecord, Binding, Page, list_audit, list_requests, read_binding
from quotagate.store.stream_settings import StreamSettings
from quotagate.store.views import Explanation, Inspection, LedgerCheck, LedgerViews, Usage

if TYPE_CHECKING:
    from quotagate.auth.authorizer import Actor
    from quotagate.auth.tokens import CreatedToken, TokenInfo, TokenStore
    from quotagate.delivery.registry import TargetConfig, TargetStore
    from quotagate.observability.metrics import Metrics
    from quotagate.store.dashboard import DashboardViews, Snapshot
    from quotagate.store.lease import LeaseStore
    from quotagate.streams.service import Streams

_Part = TypeVar("_Part")

# The id a dry run without one is judged under (it is never written).
DRY_RUN_ID = "dry-run"


class Quotagate:
    """The Python API: everything the CLI and the HTTP API do goes through here."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock | None = None,
        aging_interval: float = DEFAULT_AGING_INTERVAL,
        ttl: float = DEFAULT_TTL,
        admission_window: int = DEFAULT_ADMISSION_WINDOW,
        rate_store: RateStore | None = None,
        redis: str | None = None,
        token_cache_ttl: float = 0.0,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
    ) -> None:
        if hold_seconds < 0:
            raise InvalidInput("hold seconds must be 0 (no hold) or more",
                               code="invalid_hold_seconds")
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        # What this app's workers did, exported by its metrics (observability.metrics).
        self.delivery_counters: Counters = delivery_counters()
        # Rate quotas: buckets in the ledger database unless another store is given.
        self.rate_store: RateStore = rate_store or SqlRateStore(engine)
        self.rates = RateQuotas(engine, self.rate_store, clock=self.clock)
        self.ledger = Ledger(
            engine, clock=self.clock, aging_interval=aging_interval, ttl=ttl,
            admission_window=admission_window, rate_gate=self.rates, hold_seconds=hold_seconds,
        )
        self.views = LedgerViews(
            engine, clock=self.clock, aging_interval=aging_interval,
            admission_window=admission_window,
        )
        self.config = Configuration(engine, clock=self.clock)
        self._ledger_id: str | None = None
        self._aging_interval = aging_interval
        self._admission_window = admission_window
        self._redis = redis
        self._token_cache_ttl = token_cache_ttl
        # The stores only some commands use (streams, dashboard, tokens, targets, leases) are
        # built on first use, and their packages imported then: a ledger command pays for
        # none of them (docs/decisions/241). Streams, the dashboard and a token cache hold
        # state, so two threads of the HTTP server must not each build one: the lock.
        self._parts: dict[str, Any] = {}
        self._parts_lock = threading.Lock()
        if token_cache_ttl:
            # Only a server caches tokens, and it authenticates from its first request: built
            # now, so a bad cache time is refused here, not by the first request.
            self.api_tokens  # noqa: B018

    @property
    def database(self) -> str:
        """The ledger database's URL as given, password masked: safe to print and log."""
        return shown_url(self.engine)

    def _part(self, name: str, build: Callable[[], _Part]) -> _Part:
        """The part ``name``, built by ``build`` the first time it is asked for, then kept."""
        part = self._parts.get(name)
        if part is None:
            with self._parts_lock:
                part = self._parts.get(name)
                if part is None:
                    part = self._parts[name] = build()
        return part

    @property
    def streams(self) -> Streams:
        """Streams (docs/streams.md); Redis is connected only when a stream is used."""
        def build() -> Streams:
            from quotagate.streams.connection import ENVIRONMENT_VARIABLE as REDIS_VARIABLE
            from quotagate.streams.service import Streams

            return Streams(self.engine, self.rates,
                           redis_url=self._redis or os.environ.get(REDIS_VARIABLE), clock=self.clock)
        return self._part("streams", build)

    def stream_settings(self, tenant: str) -> StreamSettings:
        """A tenant's stream settings (docs/streams.md), read without building the streams:
        a caller that needs only these (``tenant show``) loads no producer, consumer or
        Redis script (docs/decisions/243). The same as ``streams.settings(tenant)``."""
        with reading(self.engine) as connection:
            return stream_settings.read(connection, tenant)

    @property
    def dashboard_views(self) -> DashboardViews:
        def build() -> DashboardViews:
            from quotagate.store.dashboard import DashboardViews

            return DashboardViews(self.engine, clock=self.clock, aging_interval=self._aging_interval,
                                  admission_window=self._admission_window)
        return self._part("dashboard_views", build)

    @property
    def api_tokens(self) -> TokenStore:
        """``token_cache_ttl`` > 0: a verified token is believed that long without its row
        (revocations made elsewhere count within it; docs/decisions/237)."""
        def build() -> TokenStore:
            from quotagate.auth.tokens import TokenStore

            return TokenStore(self.engine, clock=self.clock, cache_ttl=self._token_cache_ttl)
        return self._part("api_tokens", build)

    @property
    def targets(self) -> TargetStore:
        def build() -> TargetStore:
            from quotagate.delivery.registry import TargetStore

            return TargetStore(self.engine, clock=self.clock)
        return self._part("targets", build)

    @property
    def leases(self) -> LeaseStore:
        def build() -> LeaseStore:
            from quotagate.store.lease import LeaseStore

            return LeaseStore(self.engine, counters=self.delivery_counters)
        return self._part("leases", build)

    @classmethod
    def connect(
        cls, url: str | None = None, *, rate_store: str | RateStore | None = None,
        connections: int | None = None, **options: Any
    ) -> Quotagate:
        """Open the ledger at ``url`` (default ``$QUOTAGATE_DB`` or ``./quotagate.db``).

        ``rate_store``: where token buckets live — a URL (``redis://…``) or a
        store; default ``$QUOTAGATE_RATE_STORE``, else the ledger database.
        ``connections``: a fixed pool of that many database connections
        (``serve --db-connections``); default SQLAlchemy's 5 plus 10 overflow.
        """
        engine = create_engine(database_url(url), connections=connections)
        if not isinstance(rate_store, RateStore):
            rate_store = rate_store_from_url(
                rate_store or os.environ.get(RATE_STORE_VARIABLE), ledger_engine=engine
            )
        return cls(engine, rate_store=rate_store, **options)

    def init(self) -> str | None:
        """Create or migrate the schema; return the schema revision."""
        return migrate.upgrade(self.engine)

    @property
    def ledger_id(self) -> str:
        """This ledger's identity, given at init (docs/decisions/210); read once, then cached."""
        if self._ledger_id is None:
            self._ledger_id = identity.ledger_id(self.engine)
        return self._ledger_id

    @property
    def metrics(self) -> Metrics:
        """What this app exports on ``/metrics``, its delivery counters included (needs the
        ``server`` extra: prometheus-client). Made on first use, then kept."""
        def build() -> Metrics:
            from quotagate.observability.metrics import Metrics

            return Metrics(self.engine, clock=self.clock, delivery_counters=self.delivery_counters)
        return self._part("metrics", build)

    def now(self) -> float:
        """The app's clock (``clock``: the system's, or a test's manual one)."""
        return self.clock.now()

    def has_schema(self) -> bool:
        """True once the ledger schema exists (``init`` has run)."""
        return census.schema_present(self.engine)

    def ping(self) -> None:
        """One round trip to the ledger database; raises if it does not answer."""
        census.ping(self.engine)

    def close(self) -> None:
        streams: Streams | None = self._parts.get("streams")
        if streams is not None:  # never built: nothing to close, and no reason to build it now
            streams.close()
        self.rate_store.close()
        self.ledger.close()
        self.engine.dispose()

    def __enter__(self) -> Quotagate:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # admin
    def set_tenant(
        self, name: str, quota: Mapping[str, object], *, actor: str = "admin",
        cohort: str | Keep | None = KEEP,
        borrowing_limit: Mapping[str, object] | None = None,
        lending_limit: Mapping[str, object] | None = None,
        weight: object = None,
        max_priority: object = KEEP,
        reclaim: str | None = None,
        within_tenant: str | None = None,
        budget: Mapping[str, object] | None = None,
        clear_budgets: bool = False,
        default_max_runtime: object = KEEP,
        on_preempt: str | None = None,
        stop_at_max_runtime: bool | None = None,
        max_runtime_grace: object = None,
    ) -> dict[str, dict[str, int]]:
        """Create or change a tenant. ``cohort`` (None: leave it), limits per resource
        (a None amount removes a limit), ``weight`` and ``max_priority`` (None: no cap):
        docs/fair-sharing.md. ``budget``: per resource ``"100h/30d"`` or None (removed);
        ``clear_budgets`` removes every budget first; ``default_max_runtime``: ``"1h"``,
        seconds, or None (removed); ``stop_at_max_runtime``: stop its running work at its
        max-runtime (True), let it overrun (False), None: unchanged (docs/decisions/714);
        ``max_runtime_grace``: seconds (or ``"5m"``) past the max-runtime before that stop
        begins, 0 none, None unchanged (docs/decisions/715)."""
        change = budget_change(budget, clear_budgets, default_max_runtime, stop_at_max_runtime,
                               max_runtime_grace)
        sharing = TenantSharing(
            cohort=cohort,
            borrowing_limit=validate_limits(borrowing_limit, what="borrowing_limit")
            if borrowing_limit else {},
            lending_limit=validate_limits(lending_limit, what="lending_limit")
            if lending_limit else {},
            weight=None if weight is None else validate_weight(weight),
            max_priority=max_priority if max_priority is KEEP or max_priority is None
            else validate_priority(max_priority),
            reclaim=None if reclaim is None
            else validate_policy(reclaim, RECLAIM_POLICIES, "reclaim"),
            within_tenant=None if within_tenant is None
            else validate_policy(within_tenant, WITHIN_TENANT_POLICIES, "within_tenant"),
            on_preempt=None if on_preempt is None
            else validate_policy(on_preempt, ON_PREEMPT_POLICIES, "on_preempt"),
        )
        return self.config.set_tenant(name, quota, actor=actor, sharing=sharing, budget=change)

    def set_cohort(
        self, name: str, *, parent: str | Keep | None = KEEP, actor: str = "admin"
    ) -> dict[str, Any]:
        """Create a cohort, or move it under ``parent`` (None: make it a root)."""
        return self.config.set_cohort(name, parent=parent, actor=actor)

    def set_fair_share(self, *, half_life: object, actor: str = "admin") -> dict[str, Any]:
        """Set the ledger's fair-share half-life (``"1h"``, seconds; None: current use only),
        docs/fair-sharing.md#half-life."""
        return self.config.set_fair_share(
            None if half_life is None else parse_duration(half_life, what="half_life"),
            actor=actor)

    def fair_share(self) -> dict[str, Any]:
        """The fair-share settings: ``{"half_life": seconds or None}``."""
        return self.config.fair_share()

    def set_pool(self, name: str, capacity: Mapping[str, object], *, actor: str = "admin",
                 slices: int | None = None) -> dict[str, dict[str, int]]:
        """Create or change a pool; ``slices`` splits its capacity over that many capacity
        slices, so several admitters charge it on different rows (docs/admission.md)."""
        return self.config.set_pool(name, capacity, actor=actor, slices=slices)

    def tenant(self, name: str) -> dict[str, Any]:
        """A tenant's quotas and use."""
        return self.config.get_tenant(name)

    def tenants(self) -> list[str]:
        return self.config.list_tenants()

    def pool(self, name: str) -> dict[str, Any]:
        """A pool's capacity and use."""
        return self.config.get_pool(name)

    def pools(self) -> list[str]:
        return self.config.list_pools()

    # API tokens (docs/http-api.md)
    def create_api_token(
        self, *, admin: bool = False, tenant: str | None = None, executor_target: str | None = None,
        label: str | None = None, actor: str = "cli",
    ) -> CreatedToken:
        """A new API token: admin, one tenant's, or an executor's (exactly one); shown only now."""
        return self.api_tokens.create(admin=admin, tenant=tenant, executor_target=executor_target,
                                      label=label, actor=actor)

    def list_api_tokens(self) -> list[TokenInfo]:
        """Every token's id, scope and label (never a secret), revoked ones too."""
        return self.api_tokens.list()

    def revoke_api_token(self, token_id: str, *, actor: str = "cli") -> TokenInfo:
        return self.api_tokens.revoke(token_id, actor=actor)

    def authenticate(self, token: str, *, read_since: float | None = None) -> Actor:
        """The actor an API token stands for; Unauthorized if it is not a live token.

        ``read_since``: the caller's arrival (``time.monotonic()``); a check of the same
        token whose row was read after it counts for it too (docs/decisions/316).
        """
        return self.api_tokens.authenticate(token, read_since=read_since)

    # delivery targets and worker leases (docs/delivery.md)
    def set_target(
        self, name: str, kind: str, config: Mapping[str, Any], *, default: bool = False,
        tenants: Sequence[str] | None = None, actor: str = "admin",
    ) -> TargetConfig:
        """Create or replace a delivery target; ``default`` makes it the only default."""
        return self.targets.set(name, kind, config, default=default, tenants=tenants, actor=actor)

    def list_targets(self) -> list[TargetConfig]:
        return self.targets.list()

    def target(self, name: str | None) -> TargetConfig:
        """The target named ``name``, or the default one for None."""
        return self.targets.resolve(name)

    def list_leases(self) -> tuple[float, list[Lease]]:
        """The database's clock now and every lease, by name."""
        return self.leases.list()

    def lease(self, name: str) -> Lease:
        return self.leases.get(name)

    # rate quotas
    def set_rate(
        self, tenant: str, rate: BucketConfig | Mapping[str, object] | str | None, *,
        topic: str | None = None, actor: str = "admin",
    ) -> dict[str, Any] | None:
        """Give a tenant a token bucket (``{"capacity": 5, "refill_per_second": 0}`` or
        ``"capacity=5,refill=0"``), reshape it, or remove it with None; return its status."""
        if isinstance(rate, str):
            rate = parse_rate(rate)
        elif rate is not None and not isinstance(rate, BucketConfig):
            rate = config_from_mapping(rate)
        return self.rates.set(tenant, rate, topic=topic, actor=actor)

    def check_rate_store(self, tenant: str, rate: BucketConfig) -> None:
        """Raise ``rate_store_unavailable`` (or the store's error) if ``tenant``'s bucket
        could not be shaped now, changing nothing: asked before a tenant change that also
        gives it a rate, so an outage leaves the tenant as it was (docs/rate-quotas.md)."""
        self.rates.check_usable(tenant, rate)

    def add_tokens(
        self, tenant: str, amount: int, *, topic: str | None = None, actor: str = "admin"
    ) -> dict[str, Any]:
        """Top up a tenant's bucket (never above its capacity); return its status."""
        return self.rates.add(tenant, amount, topic=topic, actor=actor)

    def rate_status(self, tenant: str, *, topic: str | None = None) -> dict[str, Any] | None:
        """Capacity, refill and tokens left of a tenant's bucket; None if it has none."""
        return self.rates.status(tenant, topic=topic)

    # requests
    def submit(
        self,
        request_id: str,
        tenant: str,
        cost: Mapping[str, object],
        *,
        priority: int = 0,
        payload: Any = None,
        target: str | None = None,
        actor: str = "system",
        max_runtime: object = None,
    ) -> SubmitResult:
        """``max_runtime`` (``"2h"`` or seconds): what a budget reserves for it."""
        submission = build_submission(
            request_id=request_id, tenant=tenant, cost=cost, priority=priority,
            payload=payload, target=target, max_runtime=max_runtime,
        )
        return self.ledger.submit(submission, actor=actor)

    def simulate(
        self,
        tenant: str,
        cost: Mapping[str, object],
        *,
        priority: int = 0,
        payload: Any = None,
        target: str | None = None,
        request_id: str | None = None,
        max_runtime: object = None,
    ) -> dict[str, Any]:
        """A dry run of :meth:`submit`: would it be admitted now, at which queue position,
        and if not, why (docs/fair-sharing.md#dry-run). Writes nothing, takes no token."""
        submission = build_submission(
            request_id=request_id or DRY_RUN_ID, tenant=tenant, cost=cost, priority=priority,
            payload=payload, target=target, max_runtime=max_runtime,
        )
        tokens: float | None = None
        try:
            status = self.rates.status(submission.tenant)
        except NotFound:
            status = None  # an unknown tenant: simulate says so with submit's error
        if status is not None:
            tokens = float(status["tokens"])
        return self.views.simulate(submission, rate_tokens=tokens, named=request_id is not None)

    def submit_many(
        self, tenant: str, entries: Sequence[Mapping[str, Any]], *, actor: str = "system"
    ) -> list[SubmitResult | QuotagateError]:
        """Submit many requests of ``tenant`` in one transaction (docs/decisions/224).

        Each entry is a mapping of :meth:`submit`'s arguments (``id``, ``cost``,
        ``priority``, ``payload``, ``target``, ``max_runtime``); the answer holds, in order, each
        entry's result or the error its single submit would have raised.
        """
        answers: list[SubmitResult | QuotagateError | None] = []
        submissions: list[Submission] = []
        for entry in entries:
            try:
                submissions.append(build_submission(
                    request_id=entry.get("id"), tenant=tenant, cost=entry.get("cost", {}),
                    priority=entry.get("priority", 0), payload=entry.get("payload"),
                    target=entry.get("target"), max_runtime=entry.get("max_runtime"),
                ))
                answers.append(None)
            except QuotagateError as error:
                answers.append(error)
        submitted = iter(self.ledger.submit_many(submissions, actor=actor))
        return [next(submitted) if answer is None else answer for answer in answers]

    def admit(self, limit: int = 1) -> list[Placement]:
        return self.ledger.admit(limit)

    def admit_until_idle(self, batch: int = 16) -> int:
        """Admit until nothing waiting fits; return how many were admitted."""
        total = 0
        while True:
            admitted = self.ledger.admit(batch)
            if not admitted:
                return total
            total += len(admitted)

    def complete(self, request_id: str, *, actor: str = "system", force: bool = False) -> ReleaseResult:
        """An admin's complete: work an executor may hold is stopped first and becomes
        ``completed`` (its cost back) once the target confirms; ``force`` ends it now
        (docs/decisions/819, 820)."""
        return self.ledger.release(request_id, RequestState.COMPLETED, actor=actor, admin=True,
                                   force=force)

    def fail(
        self, request_id: str, reason: str | None = None, *, actor: str = "system",
        force: bool = False,
    ) -> ReleaseResult:
        """An admin's fail: as :meth:`complete`, ending ``failed``."""
        return self.ledger.release(request_id, RequestState.FAILED, reason=reason, actor=actor,
                                   admin=True, force=force)

    def cancel(self, request_id: str, *, actor: str = "system") -> ReleaseResult:
        return self.ledger.release(request_id, RequestState.CANCELLED, actor=actor)

    def release(
        self, request_id: str, to_state: RequestState, *, reason: str | None = None,
        actor: str = "system", tenant: str | None = None, guard: ReleaseGuard | None = None,
        admin: bool = False, force: bool = False,
    ) -> ReleaseResult:
        """End a request (completed, failed, cancelled) with an optional reason.

        ``tenant``: the request must be that tenant's (NotFound otherwise);
        ``guard``: who may end what (``store.authority``), for the HTTP API;
        ``admin``: an admin's verdict, which stops work an executor may hold before
        it ends; ``force``: an admin's end now (:meth:`Ledger.release`).
        """
        return self.ledger.release(request_id, to_state, reason=reason, actor=actor,
                                   tenant=tenant, guard=guard, admin=admin, force=force)

    def release_many(self, ends: Sequence[End]) -> list[ReleaseResult | Exception]:
        """End many requests in one transaction: a result or the refusal of each, in order
        (docs/decisions/218)."""
        return self.ledger.release_many(ends)

    def expire(self) -> int:
        return self.ledger.expire()

    # views
    def show(self, request_id: str, *, tenant: str | None = None) -> Request:
        """One request; with ``tenant``, NotFound unless it is that tenant's."""
        return self.views.show(request_id, tenant=tenant)

    def inspect(self, limit: int = 20) -> Inspection:
        return self.views.inspect(limit)

    def explain(self, request_id: str, *, tenant: str | None = None) -> Explanation:
        """Why a request waits (or what it holds); with ``tenant``, only that tenant's view."""
        return self.views.explain(request_id, tenant=tenant)

    def binding(self, request_id: str) -> Binding | None:
        """The external object a request was delivered as, if any."""
        return read_binding(self.engine, request_id)

    def list_requests(
        self, tenant: str, *, state: RequestState | None = None, cursor: str | None = None,
        limit: int = 50,
    ) -> Page[Request]:
        """A tenant's requests, newest first, one page at a time."""
        return list_requests(self.engine, tenant, state=state, cursor=cursor, limit=limit)

    def list_audit(
        self, *, tenant: str | None = None, request: str | None = None,
        cursor: str | None = None, limit: int = 100,
    ) -> Page[AuditRecord]:
        """Audit entries, newest first; only ``tenant``'s, or only about ``request``
        (entries of its own tenant), when given."""
        return list_audit(self.engine, tenant=tenant, request=request, cursor=cursor,
                          limit=limit)

    def record_audit(self, entry: AuditEntry) -> None:
        """Record a decision that changed nothing else (a refused authorization)."""
        census.record_audit(self.engine, self.clock.now(), entry)

    def audit_size(self) -> int:
        return census.audit_size(self.engine)

    def state_counts(self) -> dict[str, int]:
        """How many requests are in each state (states with none are absent)."""
        return census.state_counts(self.engine)

    def submitted_at(self, request_ids: Sequence[str]) -> dict[str, float]:
        """When each of ``request_ids`` was submitted (for the admission-wait metric)."""
        return census.created_at(self.engine, request_ids)

    def delivery_trail(self, request_id: str) -> DeliveryTrail:
        """Outbox row and binding of one request (for ``quotagate diagnose``)."""
        return delivery_trail(self.engine, request_id)

    def audit_trail(self, request_id: str, *, tenant: str | None = None,
                    limit: int = 50) -> AuditTrail:
        """Who did what to one request and when: its newest audit entries of its own tenant,
        oldest first; with ``tenant``, none unless the request is that tenant's."""
        return audit_trail(self.engine, request_id, tenant=tenant, limit=limit)

    def usage(self) -> Usage:
        return self.views.usage()

    def check_invariants(self) -> list[str]:
        return self.views.check_invariants()

    def check_ledger(self) -> LedgerCheck:
        return self.views.check_ledger()

    # retention (docs/decisions/804-retention.md)
    def prune(
        self,
        older_than: float,
        *,
        batch: int = retention.DEFAULT_BATCH,
        forget: Callable[[list[retention.PrunedBinding]], int] | None = None,
        progress: Callable[[retention.PruneProgress], None] | None = None,
        max_batches: int | None = None,
    ) -> retention.PruneProgress:
        """Delete finished requests and audit entries last changed ``older_than`` seconds ago.

        The run directories of pruned process and Spark runs go with them, unless
        ``forget`` says otherwise.
        """
        if not older_than > 0:
            raise InvalidInput("the retention period must be more than 0 seconds",
                               code="invalid_retention")
        if forget is None:
            from quotagate.delivery.cleanup import remove_run_directories

            def forget(bindings: list[retention.PrunedBinding]) -> int:
                return remove_run_directories(self.targets, bindings, self.ledger_id)
        return retention.prune(self.engine, self.clock.now() - older_than, batch=batch,
                               forget=forget, progress=progress, max_batches=max_batches)

    # dashboard (docs/dashboard.md)
    def dashboard(self, tenant: str | None = None, *, operator: bool | None = None) -> Snapshot:
        """Everything the dashboard shows, for one tenant or (None) for everyone.

        ``operator`` (default: ``tenant is None``) also gets the delivery targets'
        error texts, which are for operators (docs/decisions/214)."""
        if tenant is not None:
            validate_name(tenant, "tenant")
        from quotagate.streams.overview import streams_overview

        snapshot = replace(self.dashboard_views.snapshot(tenant, operator=operator),
                           streams=streams_overview(self.streams, tenant))
        if self.rates.in_transaction or not snapshot.buckets:
            return snapshot
        # Tokens live in another store (Redis): the ledger row holds only the shape.
        buckets = [
            replace(entry, tokens=round(self.rate_store.peek(
                BucketKey(entry.tenant, entry.topic),
                BucketConfig(entry.capacity, entry.refill_per_second)), 3))
            for entry in snapshot.buckets
        ]
        return replace(snapshot, buckets=buckets)

    def request_story(self, request_id: str, tenant: str | None = None, *,
                      operator: bool | None = None) -> dict[str, Any]:
        """A request's states, audit entries, binding, fencing token and why it waits."""
        story = self.dashboard_views.story(request_id, tenant, operator=operator)
        story["queue"] = None
        if story["request"]["state"] == RequestState.WAITING.value:
            explained = self.views.explain(request_id, tenant=tenant)
            if explained.get("waiting"):
                story["queue"] = explained
        return story
