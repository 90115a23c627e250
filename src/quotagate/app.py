"""The composition root: one object wiring the stores together for a database URL."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy.engine import Engine

from quotagate.domain.bucket import BucketConfig, config_from_mapping, parse_rate
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import Request, RequestState, Submission, build_submission, validate_name
from quotagate.domain.ordering import DEFAULT_AGING_INTERVAL
from quotagate.domain.placement import Placement
from quotagate.errors import QuotagateError
from quotagate.rate.backend import ENVIRONMENT_VARIABLE as RATE_STORE_VARIABLE
from quotagate.rate.backend import RateStore, rate_store_from_url
from quotagate.rate.keys import BucketKey
from quotagate.rate.quotas import RateQuotas
from quotagate.rate.sql import SqlRateStore
from quotagate.store import identity, migrate
from quotagate.store.config import Configuration
from quotagate.store.dashboard import DashboardViews, Snapshot
from quotagate.store.diagnosis import DeliveryTrail, delivery_trail
from quotagate.store.engine import create_engine, database_url
from quotagate.store.ledger import (
    DEFAULT_ADMISSION_WINDOW,
    DEFAULT_TTL,
    End,
    Ledger,
    ReleaseResult,
    SubmitResult,
)
from quotagate.store.views import LedgerViews
from quotagate.streams.connection import ENVIRONMENT_VARIABLE as REDIS_VARIABLE
from quotagate.streams.overview import streams_overview
from quotagate.streams.service import Streams


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
    ) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        # Rate quotas: buckets in the ledger database unless another store is given.
        self.rate_store: RateStore = rate_store or SqlRateStore(engine)
        self.rates = RateQuotas(engine, self.rate_store, clock=self.clock)
        self.ledger = Ledger(
            engine, clock=self.clock, aging_interval=aging_interval, ttl=ttl,
            admission_window=admission_window, rate_gate=self.rates,
        )
        self.views = LedgerViews(
            engine, clock=self.clock, aging_interval=aging_interval,
            admission_window=admission_window,
        )
        self.config = Configuration(engine, clock=self.clock)
        self._ledger_id: str | None = None
        # Streams (docs/streams.md): Redis is connected only when a stream is used.
        self.streams = Streams(engine, self.rates, redis_url=redis or os.environ.get(REDIS_VARIABLE),
                               clock=self.clock)
        self.dashboard_views = DashboardViews(
            engine, clock=self.clock, aging_interval=aging_interval,
            admission_window=admission_window,
        )

    @classmethod
    def connect(
        cls, url: str | None = None, *, rate_store: str | RateStore | None = None, **options: Any
    ) -> Quotagate:
        """Open the ledger at ``url`` (default ``$QUOTAGATE_DB`` or ``./quotagate.db``).

        ``rate_store``: where token buckets live — a URL (``redis://…``) or a
        store; default ``$QUOTAGATE_RATE_STORE``, else the ledger database.
        """
        engine = create_engine(database_url(url))
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

    def close(self) -> None:
        self.streams.close()
        self.rate_store.close()
        self.engine.dispose()

    def __enter__(self) -> Quotagate:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # admin
    def set_tenant(self, name: str, quota: Mapping[str, object], *, actor: str = "admin") -> dict[str, dict[str, int]]:
        return self.config.set_tenant(name, quota, actor=actor)

    def set_pool(self, name: str, capacity: Mapping[str, object], *, actor: str = "admin") -> dict[str, dict[str, int]]:
        return self.config.set_pool(name, capacity, actor=actor)

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
    ) -> SubmitResult:
        submission = build_submission(
            request_id=request_id, tenant=tenant, cost=cost, priority=priority,
            payload=payload, target=target,
        )
        return self.ledger.submit(submission, actor=actor)

    def submit_many(
        self, tenant: str, entries: Sequence[Mapping[str, Any]], *, actor: str = "system"
    ) -> list[SubmitResult | QuotagateError]:
        """Submit many requests of ``tenant`` in one transaction (docs/decisions/224).

        Each entry is a mapping of :meth:`submit`'s arguments (``id``, ``cost``,
        ``priority``, ``payload``, ``target``); the answer holds, in order, each
        entry's result or the error its single submit would have raised.
        """
        answers: list[SubmitResult | QuotagateError | None] = []
        submissions: list[Submission] = []
        for entry in entries:
            try:
                submissions.append(build_submission(
                    request_id=entry.get("id"), tenant=tenant, cost=entry.get("cost", {}),
                    priority=entry.get("priority", 0), payload=entry.get("payload"),
                    target=entry.get("target"),
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

    def complete(self, request_id: str, *, actor: str = "system") -> ReleaseResult:
        return self.ledger.release(request_id, RequestState.COMPLETED, actor=actor)

    def fail(self, request_id: str, reason: str | None = None, *, actor: str = "system") -> ReleaseResult:
        return self.ledger.release(request_id, RequestState.FAILED, reason=reason, actor=actor)

    def cancel(self, request_id: str, *, actor: str = "system") -> ReleaseResult:
        return self.ledger.release(request_id, RequestState.CANCELLED, actor=actor)

    def release_many(self, ends: Sequence[End]) -> list[ReleaseResult | Exception]:
        """End many requests in one transaction: a result or the refusal of each, in order
        (docs/decisions/218)."""
        return self.ledger.release_many(ends)

    def expire(self) -> int:
        return self.ledger.expire()

    # views
    def show(self, request_id: str) -> Request:
        return self.views.show(request_id)

    def inspect(self, limit: int = 20) -> dict[str, Any]:
        return self.views.inspect(limit)

    def explain(self, request_id: str) -> dict[str, Any]:
        return self.views.explain(request_id)

    def delivery_trail(self, request_id: str) -> DeliveryTrail:
        """Outbox row, binding and audit entries of one request (for ``quotagate diagnose``)."""
        return delivery_trail(self.engine, request_id)

    def usage(self) -> dict[str, list[dict[str, Any]]]:
        return self.views.usage()

    def check_invariants(self) -> list[str]:
        return self.views.check_invariants()

    # dashboard (docs/dashboard.md)
    def dashboard(self, tenant: str | None = None) -> Snapshot:
        """Everything the dashboard shows, for one tenant or (None) for everyone."""
        if tenant is not None:
            validate_name(tenant, "tenant")
        snapshot = replace(self.dashboard_views.snapshot(tenant),
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

    def request_story(self, request_id: str, tenant: str | None = None) -> dict[str, Any]:
        """A request's states, audit entries, binding, fencing token and why it waits."""
        story = self.dashboard_views.story(request_id, tenant)
        story["queue"] = None
        if story["request"]["state"] == RequestState.WAITING.value:
            explained = self.views.explain(request_id, tenant=tenant)
            if explained.get("waiting"):
                story["queue"] = explained
        return story
