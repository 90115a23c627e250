"""Per-tenant metrics: in-process counters plus gauges read from the ledger at scrape time.

What happens inside this process (admissions it made, submissions it refused,
and the dispatcher's counters: attempts, failures, stale-generation refusals)
is counted here; Prometheus sums the
counters of all processes. What the database knows (usage, queue, outbox,
leases) is read at scrape time by :class:`LedgerCollector`, so every process
reports the same cluster-wide truth and nothing depends on which process did
the work. Each :class:`Metrics` has its own registry: two apps in one process
(tests) never collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ModuleNotFoundError as exc:  # pragma: no cover - depends on extras installed
    raise ModuleNotFoundError(
        "metrics need prometheus-client: pip install 'quotagate[server]'"
    ) from exc

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import RequestState
from quotagate.errors import InvalidInput, StoreUnavailable
from quotagate.store import admission_stats
from quotagate.store.counters import Counters
from quotagate.store.counters import delivery_counters as new_delivery_counters
from quotagate.store.gauges import read_gauges

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Waits from seconds (an idle gate) to hours (a tenant at its cap).
_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)


class LedgerCollector(Collector):
    """Gauges computed from the ledger tables on every scrape."""

    def __init__(self, engine: Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        # Describing would run the queries at registration; the families are dynamic.
        return []

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("quotagate_store_up", "1 if the ledger database answered the scrape")
        try:
            families = self._families()
        except StoreUnavailable as error:
            if error.code == "store_timeout":
                # The database answers, too slowly: the scrape answers 503 (docs/dashboard.md).
                raise
            up.add_metric([], 0)
            return [up]
        except sa.exc.SQLAlchemyError:
            # A scrape must not fail because the store is down: say so instead.
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *families]

    def _families(self) -> list[Metric]:
        gauges = read_gauges(self.engine)
        now = self.clock.now()
        families: list[Metric] = []
        for holder, usage in (("tenant", gauges.tenants), ("pool", gauges.pools)):
            used = GaugeMetricFamily(f"quotagate_{holder}_used", f"Charged amount per {holder} "
                                     "and resource", labels=[holder, "resource"])
            cap = GaugeMetricFamily(f"quotagate_{holder}_cap", f"Cap per {holder} and resource",
                                    labels=[holder, "resource"])
            for name, resources in usage.items():
                for resource, (used_amount, cap_amount) in resources.items():
                    used.add_metric([name, resource], used_amount)
                    cap.add_metric([name, resource], cap_amount)
            families += [used, cap]
        waiting_count = GaugeMetricFamily("quotagate_waiting_requests",
                                          "Requests waiting for admission", labels=["tenant"])
        oldest = GaugeMetricFamily("quotagate_oldest_waiting_seconds",
                                   "Age of the oldest waiting request", labels=["tenant"])
        for waiting in gauges.waiting:
            waiting_count.add_metric([waiting.tenant], waiting.count)
            oldest.add_metric([waiting.tenant], max(0.0, now - waiting.oldest_created))
        families += [waiting_count, oldest]
        expired = CounterMetricFamily("quotagate_expired_requests",
                                      "Requests that expired waiting (ledger-wide)",
                                      labels=["tenant"])
        rejected = CounterMetricFamily("quotagate_rejected_requests",
                                       "Requests recorded as rejected (ledger-wide)",
                                       labels=["tenant"])
        # Victims of preemption (docs/fair-sharing.md#preemption), by the victim's tenant
        # and the kind of preemption; the audit log names each one's preemptor.
        preempted = CounterMetricFamily("quotagate_preempted_requests",
                                        "Requests ended by preemption, by reason: reclaim "
                                        "or within-tenant (ledger-wide)",
                                        labels=["tenant", "reason"])
        families_by_state = {RequestState.EXPIRED.value: expired,
                             RequestState.REJECTED.value: rejected}
        for (tenant, state), count in gauges.ended.items():
            families_by_state[state].add_metric([tenant], count)
        for (tenant, kind), count in gauges.preempted.items():
            preempted.add_metric([tenant, kind], count)
        families += [expired, rejected, preempted]
        # --on-preempt requeue (docs/decisions/720): victims put back in the queue, and
        # preemptors whose freed room is held for them (721).
        requeued = CounterMetricFamily("quotagate_requeued_requests",
                                       "Preempted requests put back in the queue (ledger-wide)",
                                       labels=["tenant"])
        for tenant, count in sorted(gauges.requeued.items()):
            requeued.add_metric([tenant], count)
        held = GaugeMetricFamily("quotagate_held_preemptors",
                                 "Waiting preemptors the room their preemption frees is held for",
                                 labels=["tenant"])
        for tenant, count in sorted(gauges.held.items()):
            held.add_metric([tenant], count)
        families += [requeued, held]
        backlog = GaugeMetricFamily("quotagate_outbox_backlog", "Undelivered outbox rows",
                                    labels=["tenant"])
        attempts = GaugeMetricFamily("quotagate_outbox_delivery_attempts",
                                     "Delivery attempts recorded on outbox rows", labels=["tenant"])
        failing = GaugeMetricFamily("quotagate_outbox_delivery_failing",
                                    "Undelivered outbox rows whose last attempt failed",
                                    labels=["tenant"])
        stopping = GaugeMetricFamily("quotagate_stops_pending",
                                     "Cancelled requests still charged: their stop is not "
                                     "confirmed yet", labels=["tenant"])
        for row in gauges.backlog:
            backlog.add_metric([row.tenant], row.pending)
            attempts.add_metric([row.tenant], row.attempts)
            failing.add_metric([row.tenant], row.failing)
            stopping.add_metric([row.tenant], row.stopping)
        families += [backlog, attempts, failing, stopping]
        generation = GaugeMetricFamily("quotagate_lease_generation",
                                       "Current generation (fencing token) of each lease",
                                       labels=["lease"])
        for name, lease_generation in gauges.lease_generations.items():
            generation.add_metric([name], lease_generation)
        families.append(generation)
        unconfirmed = GaugeMetricFamily(
            "quotagate_unconfirmed_stops",
            "Stops and preemptions the executor has not confirmed yet (cost still charged)",
            labels=["tenant", "state"])
        oldest_stop = GaugeMetricFamily(
            "quotagate_oldest_unconfirmed_stop_seconds",
            "Age of the oldest stop not confirmed yet", labels=["tenant", "state"])
        for stop in gauges.stops:
            unconfirmed.add_metric([stop.tenant, stop.state], stop.count)
            oldest_stop.add_metric([stop.tenant, stop.state], max(0.0, now - stop.oldest_updated))
        families += [unconfirmed, oldest_stop]
        return families


class AdmissionStatsCollector(Collector):
    """Exports this process's admission reruns by cause and its lock-wait histogram."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        stats = admission_stats.snapshot()
        reruns = CounterMetricFamily(
            "quotagate_admission_reruns",
            "Admission transactions run again, by cause (this process)", labels=["cause"])
        for cause in admission_stats.RERUN_CAUSES:
            reruns.add_metric([cause], stats.reruns[cause])
        waits = HistogramMetricFamily(
            "quotagate_admission_lock_wait_seconds",
            "Time admission's lock-taking statements waited and ran (this process)")
        bounds = [str(bound) for bound in admission_stats.LOCK_WAIT_BUCKETS] + ["+Inf"]
        waits.add_metric([], list(zip(bounds, stats.lock_wait_buckets, strict=True)),
                         stats.lock_wait_sum)
        return [reruns, waits]


# The delivery counters (quotagate.store.counters) and the names they are exported under.
_DELIVERY_COUNTERS = {
    "claimed": ("quotagate_delivery_claims", "Outbox rows claimed for delivery"),
    "delivered": ("quotagate_deliveries", "Deliveries that reached their target"),
    "delivery_errors": ("quotagate_delivery_failures", "Delivery attempts that failed"),
    "retried": ("quotagate_delivery_retries", "Deliveries scheduled for another attempt"),
    "given_up": ("quotagate_delivery_given_up",
                 "Requests failed because delivery gave up: last attempt, or an error "
                 "no retry can fix"),
    "executor_completed": ("quotagate_executor_completions",
                           "Requests their executor reported completed (read back)"),
    "executor_failed": ("quotagate_executor_failures",
                        "Requests their executor reported failed (read back)"),
    "stale_writes": ("quotagate_stale_generation_rejections",
                     "Writes refused because a newer lease generation exists"),
    "leases_acquired": ("quotagate_leases_acquired", "Leases this process acquired"),
    "leases_lost": ("quotagate_leases_lost", "Leases this process lost to a newer generation"),
    "stops_claimed": ("quotagate_stop_claims", "Outbox rows claimed to stop their request"),
    "stops_pending": ("quotagate_stops_unconfirmed", "Stop attempts the target did not confirm"),
    "stopped": ("quotagate_stops_confirmed", "Cancelled requests whose stop was confirmed"),
    "overruns": ("quotagate_max_runtime_stops",
                 "Running requests whose stop began because their max-runtime passed"),
}


class DeliveryStatsCollector(Collector):
    """Exports the delivery counters of the app's workers (``Quotagate.delivery_counters``)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        values = self.counters.snapshot()
        families: list[Metric] = []
        for key, (name, documentation) in _DELIVERY_COUNTERS.items():
            if key in values:
                family = CounterMetricFamily(name, documentation + " (this process)")
                family.add_metric([], values[key])
                families.append(family)
        return families


class StreamStatsCollector(Collector):
    """Exports the stream layer's process-wide counters and gauges (tenant, topic labels)."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        from quotagate.streams import metrics as stream_metrics

        counters, gauges = stream_metrics.snapshot()
        families: list[Metric] = []
        for name, documentation in stream_metrics.COUNTERS.items():
            family = CounterMetricFamily(f"quotagate_stream_{name}", documentation + " (this process)",
                                         labels=["tenant", "topic"])
            for (counter, tenant, topic), value in sorted(counters.items()):
                if counter == name:
                    family.add_metric([tenant, topic], value)
            families.append(family)
        for name, documentation in stream_metrics.GAUGES.items():
            gauge = GaugeMetricFamily(f"quotagate_stream_{name}", documentation,
                                      labels=["tenant", "topic", "group"])
            for (gauge_name, tenant, topic, group), value in sorted(gauges.items()):
                if gauge_name == name:
                    gauge.add_metric([tenant, topic, group], value)
            families.append(gauge)
        return families


def serve_stream_metrics(host: str, port: int) -> Callable[[], None]:
    """Export this process's stream counters on ``http://HOST:PORT/metrics``; the stop function.

    A ``quotagate stream consume`` process counts what it consumed, acked,
    redelivered and dead-lettered in its own memory, and has no HTTP server
    whose ``/metrics`` could show it: this is that endpoint, and nothing more.
    """
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamStatsCollector())
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise InvalidInput(f"cannot serve metrics on {host}:{port}: {error.strerror or error}",
                           code="metrics_port_unavailable") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


class Metrics:
    """Everything one process exports on ``/metrics``."""

    def __init__(
        self, engine: Engine, *, clock: Clock | None = None, delivery_counters: Counters | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.admissions = Counter(
            "quotagate_admissions", "Requests admitted by this process",
            ["tenant", "pool"], registry=self.registry,
        )
        self.submissions = Counter(
            "quotagate_submissions", "Submissions answered by this process",
            ["tenant", "outcome"], registry=self.registry,
        )
        self.rejections = Counter(
            "quotagate_rejections", "Submissions this process refused, by error code",
            ["tenant", "code"], registry=self.registry,
        )
        self.admission_wait = Histogram(
            "quotagate_admission_wait_seconds", "Time from submission to admission",
            ["tenant"], buckets=_WAIT_BUCKETS, registry=self.registry,
        )
        self.admission_pass = Histogram(
            "quotagate_admission_pass_seconds", "Duration of one admission transaction",
            registry=self.registry,
        )
        self.auth_refusals = Counter(
            "quotagate_auth_refusals", "Requests refused by authentication or authorization",
            ["reason"], registry=self.registry,
        )
        self.registry.register(LedgerCollector(engine, clock or SystemClock()))
        # Without the app's counters (a bare engine), delivery reports zeros.
        self.registry.register(DeliveryStatsCollector(
            delivery_counters if delivery_counters is not None else new_delivery_counters()))
        self.registry.register(StreamStatsCollector())
        self.registry.register(AdmissionStatsCollector())

    def record_admissions(
        self, admitted: Sequence[Any], created_by_id: dict[str, float], now: float
    ) -> None:
        """Count placements (objects with id, tenant, pool) and observe their waits."""
        self.count_admissions(admitted)
        self.observe_admission_waits(admitted, created_by_id, now)

    def count_admissions(self, admitted: Sequence[Any]) -> None:
        for placement in admitted:
            self.admissions.labels(placement.tenant, placement.pool).inc()

    def observe_admission_waits(
        self, admitted: Sequence[Any], created_by_id: dict[str, float], now: float
    ) -> None:
        """How long each placement waited: ``now`` (its admission) minus its submission."""
        for placement in admitted:
            created = created_by_id.get(placement.id)
            if created is not None:
                self.admission_wait.labels(placement.tenant).observe(max(0.0, now - created))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
