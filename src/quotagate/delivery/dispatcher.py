"""The outbox dispatcher behind ``quotagate worker``.

One pass (``run_once``): make sure this worker holds its lease, claim a batch
of due outbox rows, deliver them concurrently (a bounded thread pool,
``concurrency``), then write every binding and ``delivered`` mark of the batch
in one fenced transaction; carry out the stops of cancelled requests (and of
work past its max-runtime, where its tenant asks for that) the same way; then
read the outcomes of delivered requests, many per target call, and release
their cost when the executor says they ended. ``run`` repeats passes
until told to stop and then gives the lease up; on PostgreSQL and MariaDB it
reads the outcomes on a thread of its own beside the passes, under the same
lease (docs/decisions/260).

Each worker holds one lease, ``worker/<name>`` (docs/decisions/201). Its
generation fences every write it makes; its claims live exactly as long as the
lease (docs/decisions/212); the per-row claim token is the fencing token sent
downstream, one higher at every claim (docs/decisions/213).

Crash points for tests: ``QUOTAGATE_CRASH_AT=after_claim|after_create|after_binding``
makes the worker SIGKILL itself at that step of its first delivery batch
(``after_binding``: once the batch's bindings and marks are committed);
``after_stop``: once a target confirmed a stop, before the ledger records it;
``after_outcomes``: once a target reported ends, before they are released;
``after_ends``: once those ends are committed, before the target forgets them.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from quotagate.delivery.built_targets import BuiltTargets
from quotagate.delivery.naming import external_name
from quotagate.delivery.pass_report import PassReport
from quotagate.delivery.ports import DeliveryHost
from quotagate.delivery.reasons import public_reason, redact_text
from quotagate.delivery.registry import TargetConfig, TargetStore
from quotagate.delivery.retry import RetryPolicy
from quotagate.delivery.targets import Target
from quotagate.delivery.targets.base import (
    CreatesMany,
    DeliverySpec,
    ExternalObject,
    ForgetsEnded,
    IdentityMismatch,
    Outcome,
    StopResult,
)
from quotagate.delivery.wakeup import Wakeup
from quotagate.delivery.worker_defaults import (
    DEFAULT_BATCH,
    DEFAULT_CONCURRENCY,
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_ATTEMPTS,
)
from quotagate.domain.lease import Lease, validate_owner, validate_ttl
from quotagate.domain.model import RequestState, bounded_reason
from quotagate.errors import Conflict, InvalidInput, NotFound, QuotagateError, StaleGeneration
from quotagate.store import overruns
from quotagate.store.lease import LeaseStore
from quotagate.store.outbox import Claim, OutboxStore, RequestGone
from quotagate.store.release import End

__all__ = ["CRASH_POINTS", "Dispatcher", "lease_name"]

logger = logging.getLogger("quotagate.delivery")

CRASH_ENVIRONMENT_VARIABLE = "QUOTAGATE_CRASH_AT"
CRASH_POINTS = ("after_claim", "after_create", "after_binding", "after_stop",
                "after_outcomes", "after_ends")
DEFAULT_STOP_POLL = 1.0
TARGET_REFRESH_INTERVAL = 1.0
MAX_BATCHES_PER_PASS = 16
# Batches a pass delivers before it reads outcomes, when the last read ended a full page.
BATCHES_BEFORE_ENDS = 4
END_BATCH = 256  # ends released per transaction
OBSERVE_INTERVAL = 1.0
# Max-runtimes are whole seconds: looking for overruns once a second stops them
# within about a second of their limit, and a busy worker's passes pay for the
# look at most once a second (docs/decisions/714).
OVERRUN_INTERVAL = 1.0

Result = TypeVar("Result")


def lease_name(worker_name: str) -> str:
    return f"worker/{worker_name}"


class Dispatcher:
    """Delivers admitted requests; many may run, in threads or on many machines."""

    def __init__(
        self,
        gate: DeliveryHost,
        *,
        worker_name: str,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        batch: int = DEFAULT_BATCH,
        concurrency: int = DEFAULT_CONCURRENCY,
        retry_base: float = 1.0,
        retry_max: float = 300.0,
        poll_interval: float = 0.5,
        stop_poll: float = DEFAULT_STOP_POLL,
        admit: bool = False,
        observe_limit: int = 500,
        overrun_interval: float = OVERRUN_INTERVAL,
        wakeup: Wakeup | None = None,
    ) -> None:
        self.gate = gate
        self.worker_name = validate_owner(worker_name)
        self.lease_name = lease_name(worker_name)
        self.lease_ttl = validate_ttl(lease_ttl)
        if batch < 1:
            raise InvalidInput("batch must be at least 1", code="invalid_batch")
        if concurrency < 1:
            raise InvalidInput("concurrency must be at least 1", code="invalid_concurrency")
        if observe_limit < 0:
            raise InvalidInput("observe limit must be 0 or more", code="invalid_observe_limit")
        self.batch = batch
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.stop_poll = stop_poll
        self.admit = admit
        self.observe_limit = observe_limit
        # Seconds between looks for work past its max-runtime (0: every pass).
        self.overrun_interval = overrun_interval
        self.retry = RetryPolicy(max_attempts, retry_base, retry_max)
        self.counters = gate.delivery_counters
        self.leases = LeaseStore(gate.engine, counters=self.counters)
        self.outbox = OutboxStore(gate.engine, self.leases, gate.clock, self.counters)
        self.targets = TargetStore(gate.engine, clock=gate.clock)
        self.actor = f"worker:{worker_name}"
        self.ledger_id = gate.ledger_id
        self.built = BuiltTargets(self.targets, ledger_id=self.ledger_id)
        # The outcome thread's own targets (``run``): its reads share no client, cache or
        # read schedule with the deliveries and stops, and a target rebuilt for a changed
        # configuration is never closed under the other thread's call.
        self.observed = BuiltTargets(self.targets, ledger_id=self.ledger_id)
        # Set while ``run``'s outcome thread is up: the passes then leave outcomes to it.
        self._observer: threading.Thread | None = None
        # A lease lost by one thread is cleared only if no other thread replaced it since.
        self._lease_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._write_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lease: Lease | None = None
        self._renewed_at = 0.0
        self._refreshed_at = -TARGET_REFRESH_INTERVAL
        self._observed_up_to = ""
        self._observed_at = -OBSERVE_INTERVAL
        # The last outcome read was a full page and ended most of it: more ends wait.
        self._observe_again = False
        self._watched = 0  # delivered requests the last outcome read looked at
        self._overruns_at = -overrun_interval
        self._waiting_logged = False
        # What the last pass did, by kind (``quotagate worker --once`` prints it).
        self.last_pass: PassReport | None = None
        crash_at = os.environ.get(CRASH_ENVIRONMENT_VARIABLE) or None
        if crash_at is not None and crash_at not in CRASH_POINTS:
            raise InvalidInput(
                f"{CRASH_ENVIRONMENT_VARIABLE} must be one of {', '.join(CRASH_POINTS)}",
                code="invalid_crash_point",
            )
        self._crash_at = crash_at
        # SQLite has one writer at a time: a write overlapping the next claim
        # would only wait for it. With a crash point set, batches run one at a
        # time so the tests know where it hits.
        self._overlap_writes = crash_at is None and gate.engine.dialect.name != "sqlite"
        # Outcome reads and their ends beside the passes, not between them: while one ran,
        # nothing was claimed (docs/decisions/260). Not on SQLite: its one writer would
        # only make the ends and the deliveries wait for each other.
        self._observe_apart = observe_limit > 0 and gate.engine.dialect.name != "sqlite"
        # Rung by an admission loop in this process (serve): an idle pass waits for it or
        # for ``poll_interval``, whichever comes first (docs/decisions/258). ``worker
        # --admit`` admits in its passes and an end frees room for them: its outcome
        # thread rings a bell of its own after ends.
        if wakeup is None and admit and self._observe_apart:
            wakeup = Wakeup()
        self._bell = wakeup

    @property
    def lease(self) -> Lease | None:
        """The lease this worker holds, as it last knew it."""
        return self._lease

    # -- the loop ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set; then release the lease.

        Outcomes are read on a thread of their own meanwhile (docs/decisions/260),
        joined before the lease is given up: its ends are fenced by that lease.
        """
        halt = threading.Event()  # the passes ended without ``stop`` (an error escaped)
        if self._observe_apart:
            self._observer = threading.Thread(
                target=self._observe_beside, args=(stop, halt),
                name=f"outcomes-{self.worker_name}")
            self._observer.start()
        try:
            while not stop.is_set():
                try:
                    done = self.run_once()
                except QuotagateError as error:
                    # The store is down or similar: say so, wait, try again.
                    logger.warning("worker %s: pass failed: %s", self.worker_name, error.message)
                    done = 0
                except Exception:
                    # Keep the loop (often a thread of ``serve``) alive; the
                    # next pass starts from what the database holds.
                    logger.exception("worker %s: pass failed", self.worker_name)
                    done = 0
                if done == 0 and not stop.is_set():
                    self._idle(stop)
        finally:
            if self._observer is not None:
                halt.set()
                self._observer.join()  # bounded by its call in progress, as the passes are
                self._observer = None
            self.release()

    def _idle(self, stop: threading.Event) -> None:
        """Wait before the next look for work: ``poll_interval``, or until rung.

        With a bell, whoever sets ``stop`` rings it too (serve does), so a stop is
        not kept waiting for the interval.
        """
        if self._bell is None:
            stop.wait(self.poll_interval)
        else:
            self._bell.wait(self.poll_interval)

    def release(self) -> None:
        """Give the lease up, close the targets and the pool (the worker is shutting down)."""
        if self._lease is not None:
            try:
                self.leases.release(self._lease)
            except QuotagateError as error:
                logger.warning("worker %s: cannot release lease: %s", self.worker_name, error)
            self._lease = None
        self.built.close()
        self.observed.close()
        for pool in (self._pool, self._write_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._write_pool = None

    def run_once(self) -> int:
        """One pass; returns how many requests moved (admitted, delivered, stopped, ended).

        What moved, by kind, is in ``last_pass`` afterwards.
        """
        self.last_pass = None
        before = self.counters.snapshot()
        if not self._hold_lease():
            self.last_pass = PassReport(self.lease_name, lease_held=False)
            return 0
        admitted = self.gate.admit_until_idle() if self.admit else 0
        moved = admitted + self._deliver_stop_observe()
        # The counters are the gate's: a second dispatcher on the same gate in this
        # process (not something serve or the CLI does) would be counted here too.
        self.last_pass = PassReport.between(self.lease_name, before, self.counters.snapshot(),
                                            admitted if self.admit else None)
        return moved

    def _deliver_stop_observe(self) -> int:
        moved = 0
        if time.monotonic() - self._refreshed_at >= TARGET_REFRESH_INTERVAL:
            # Target changes reach a running worker within a second, without
            # a query per pass.
            self.built.refresh()
            self._refreshed_at = time.monotonic()
        lease = self._lease
        if lease is None:  # pragma: no cover - _hold_lease just set it
            return moved
        if time.monotonic() - self._overruns_at >= self.overrun_interval:
            # Before claiming: the stops begun here are claimed in this very pass.
            self._overruns_at = time.monotonic()
            moved += self._stop_overruns()
        delivered = self._work_through(lease)
        moved += delivered
        now = time.monotonic()
        # While batches keep coming, outcome reads wait their turn (at most one
        # page a second): every read pass delays the next delivery (decisions/217);
        # unless the last read was a full page that ended most of what it read,
        # where the ends are what falls behind (docs/decisions/251).
        if self._lease is not None and self.observe_limit and self._observer is None and (
            delivered == 0 or self._observe_again or now - self._observed_at >= OBSERVE_INTERVAL
        ):
            self._observed_at = now
            ended = self._observe()
            self._observe_again = self._watched == self.observe_limit and 2 * ended >= self._watched
            moved += ended
        return moved

    def _work_through(self, lease: Lease) -> int:
        """Claimed batches, one after another, each written while the next is delivered.

        Writing batch N (a database round trip) overlaps claiming and
        delivering batch N+1; they hold different rows (not on SQLite, or with
        a crash point set). A pass goes on while batches come back full, up to
        ``MAX_BATCHES_PER_PASS``, or ``BATCHES_BEFORE_ENDS`` when the last outcome read
        ended a full page.
        """
        moved = 0
        writing: concurrent.futures.Future[int] | None = None
        for _batch in range(MAX_BATCHES_PER_PASS):
            claims = self.outbox.claim_work(lease, self.batch)
            deliveries = [claim for claim in claims if not claim.stop]
            created, failed = self._create_all(deliveries)
            moved += failed
            if writing is not None:
                moved += writing.result()
                writing = None
            if created and self._lease is not None:
                if self._overlap_writes:
                    writing = self._writer().submit(self._write_batch, lease, created)
                else:
                    moved += self._write_batch(lease, created)
            if self._lease is not None:
                moved += self._stop_batch(lease, [claim for claim in claims if claim.stop])
            self._hold_lease()
            if len(claims) < self.batch or self._lease is None or self._crash_at is not None:
                break
            if self._observe_again and _batch + 1 >= BATCHES_BEFORE_ENDS:
                break  # ends are waiting to be read: their turn comes sooner (decisions/251)
        if writing is not None:
            moved += writing.result()
        return moved

    # -- lease -------------------------------------------------------------------

    def _hold_lease(self) -> bool:
        now = time.monotonic()
        if self._lease is None:
            self._lease = self.leases.acquire(self.lease_name, self.worker_name, self.lease_ttl)
            if self._lease is None:
                if not self._waiting_logged:
                    # Normal for a restart (the dead predecessor's lease must
                    # expire first); endless for two live workers sharing a name.
                    logger.warning("worker %s: lease %s is held; waiting for it to expire "
                                   "(each live worker needs its own --name)",
                                   self.worker_name, self.lease_name)
                    self._waiting_logged = True
                return False
            self._waiting_logged = False
            self._renewed_at = now
            logger.info("worker %s: lease %s generation %d", self.worker_name, self.lease_name,
                        self._lease.generation)
            return True
        if now - self._renewed_at >= self.lease_ttl / 3:
            try:
                self._lease = self.leases.renew(self._lease, self.lease_ttl)
                self._renewed_at = now
            except StaleGeneration:
                self._lost_lease()
                return False
        return True

    def _lost_lease(self, lease: Lease | None = None) -> None:
        """Forget the lease; with ``lease``, only if it is still the one held.

        The outcome thread and the writer learn of a loss under the lease they
        wrote with; the passes may have taken a newer generation since, which
        is not theirs to drop.
        """
        with self._lease_lock:
            if lease is not None and (self._lease is None
                                      or self._lease.generation != lease.generation):
                return
            logger.warning("worker %s: lease %s was taken over; stopping work under "
                           "generation %s", self.worker_name, self.lease_name,
                           None if self._lease is None else self._lease.generation)
            self._lease = None

    def _in_pool(self, calls: Sequence[Callable[[], Result]]) -> list[Result | BaseException]:
        """Run ``calls`` concurrently; results (or exceptions) in order.

        The lease is renewed while they run, so slow targets do not let it lapse.
        """
        if len(calls) == 1 or self.concurrency == 1:
            return [_outcome_of(call) for call in calls]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.concurrency, thread_name_prefix=f"deliver-{self.worker_name}"
            )
        futures = [self._pool.submit(call) for call in calls]
        pending = set(futures)
        while pending:
            _done, pending = concurrent.futures.wait(pending, timeout=self.lease_ttl / 3)
            if pending:
                self._hold_lease()
        return [future.exception() or future.result() for future in futures]

    # -- delivery ----------------------------------------------------------------

    def _create_all(
        self, claims: list[Claim]
    ) -> tuple[list[tuple[Claim, str, ExternalObject]], int]:
        """Create the batch's objects concurrently; (created, requests that ended failed).

        Claims for a target that creates many per call (``CreatesMany``, a
        webhook's ``--batch-deliver``) go in chunks of its batch size, one pool
        call per chunk; the others one call each. Either way every claim gets its
        own result, and the batch's bindings are written together afterwards.
        """
        if not claims:
            return [], 0
        self._crash_point("after_claim")
        singles: list[Claim] = []
        grouped: dict[str, tuple[TargetConfig, CreatesMany, list[Claim]]] = {}
        for claim in claims:
            try:
                config, target = self.built.get(claim.target)
            except QuotagateError:
                singles.append(claim)  # its own call raises the same error, per claim
                continue
            if isinstance(target, CreatesMany) and target.batch_size > 1:
                grouped.setdefault(config.name, (config, target, []))[2].append(claim)
            else:
                singles.append(claim)
        chunks: list[tuple[TargetConfig, CreatesMany, list[Claim]]] = [
            (config, target, group[start:start + target.batch_size])
            for config, target, group in grouped.values()
            for start in range(0, len(group), target.batch_size)
        ]
        calls: list[Callable[[], object]] = [
            functools.partial(self._create_chunk, target, chunk) for _config, target, chunk in chunks]
        calls += [functools.partial(self._create, claim) for claim in singles]
        answers = self._in_pool(calls)
        results: dict[str, tuple[str, ExternalObject] | BaseException] = {}
        for (config, _target, chunk), answer in zip(chunks, answers[:len(chunks)], strict=True):
            for claim, item in zip(chunk, _per_claim(answer, len(chunk)), strict=True):
                results[claim.request_id] = (item if isinstance(item, BaseException)
                                             else (config.name, item))
        for claim, single in zip(singles, answers[len(chunks):], strict=True):
            results[claim.request_id] = single  # type: ignore[assignment]
        created: list[tuple[Claim, str, ExternalObject]] = []
        failed = 0
        for claim in claims:
            result = results[claim.request_id]
            if isinstance(result, BaseException):
                failed += self._delivery_error(claim, result)
            else:
                target_name, obtained = result
                created.append((claim, target_name, obtained))
        return created, failed

    def _create_chunk(self, target: CreatesMany,
                      claims: list[Claim]) -> list[ExternalObject | Exception]:
        results = target.create_many([self._spec(claim) for claim in claims])
        self._crash_point("after_create")
        return results

    def _write_batch(self, lease: Lease, created: list[tuple[Claim, str, ExternalObject]]) -> int:
        """Bindings and delivered marks of one batch, one fenced transaction."""
        try:
            written = self.outbox.record_deliveries(lease, created, actor=self.actor)
        except StaleGeneration as error:
            self._stale(error, lease)
            return 0
        self._crash_point("after_binding")
        for request_id in written.gone:
            logger.info("worker %s: %s was cancelled during delivery; its stop follows",
                        self.worker_name, request_id)
        for request_id in written.ended:
            logger.info("worker %s: %s was ended by its executor during delivery; nothing to "
                        "record", self.worker_name, request_id)
        moved = 0
        for claim, message in written.conflicts:
            moved += self._give_up(claim, message, "delivery failed: binding conflict")
        if written.lost:
            logger.warning("worker %s: claims of %s were taken over; their writes were refused",
                           self.worker_name, ", ".join(written.lost))
        logger.info("worker %s: delivered %d of %d", self.worker_name, len(written.delivered),
                    len(created))
        return moved + len(written.delivered)

    def _writer(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._write_pool is None:
            self._write_pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"write-{self.worker_name}"
            )
        return self._write_pool

    def _create(self, claim: Claim) -> tuple[str, ExternalObject]:
        config, target = self.built.get(claim.target)
        obtained = target.create_if_absent(self._spec(claim))
        self._crash_point("after_create")
        return config.name, obtained

    def _spec(self, claim: Claim) -> DeliverySpec:
        return DeliverySpec(
            request_id=claim.request_id, tenant=claim.tenant, cost=claim.cost,
            payload=claim.payload, fencing_token=claim.fencing_token,
            external_name=external_name(self.ledger_id, claim.tenant, claim.request_id,
                                        claim.request_attempt),
            ledger_id=self.ledger_id, attempt=claim.request_attempt,
        )

    def _delivery_error(self, claim: Claim, error: BaseException) -> int:
        if isinstance(error, IdentityMismatch | Conflict):
            # Retrying cannot fix another request's object in our name.
            return self._give_up(claim, error.message,
                                 f"delivery failed: {public_reason(error)}")
        if isinstance(error, QuotagateError):
            return self._failed_attempt(claim, f"{error.code}: {error.message}", error)
        logger.error("worker %s: delivering %s", self.worker_name, claim.request_id,
                     exc_info=error)
        return self._failed_attempt(claim, f"{type(error).__name__}: {error}", error)

    def _failed_attempt(self, claim: Claim, detail: str, error: BaseException) -> int:
        """Retry later, or give up; ``detail`` (redacted) is kept for admins and logs."""
        self.counters.increment("delivery_errors")
        detail = redact_text(detail)
        attempts = claim.attempts + 1
        if self.retry.gives_up(attempts):
            return self._give_up(claim, f"delivery failed after {attempts} attempts: {detail}",
                                 f"delivery failed after {attempts} attempts: "
                                 f"{public_reason(error)}")
        error_text = detail
        logger.warning("worker %s: delivering %s failed (attempt %d): %s", self.worker_name,
                       claim.request_id, attempts, error_text)
        try:
            self.outbox.record_failure(claim, error_text, self.retry.delay(attempts))
        except StaleGeneration as stale_error:
            self._stale(stale_error)
        except RequestGone:
            pass
        return 0

    def _give_up(self, claim: Claim, detail: str, reason: str) -> int:
        """Fail the request: ``reason`` is what its tenant sees, ``detail`` goes to the log."""
        logger.error("worker %s: request %s failed: %s", self.worker_name, claim.request_id,
                     redact_text(detail))
        try:
            self.gate.ledger.release(
                claim.request_id, RequestState.FAILED, reason=bounded_reason(reason),
                actor=self.actor,
                fence=self.outbox.fence(claim),
            )
        except StaleGeneration as error:
            self._stale(error)
            return 0
        except (RequestGone, Conflict):
            return 0
        self.counters.increment("given_up")
        return 1

    def _stale(self, error: StaleGeneration, lease: Lease | None = None) -> None:
        logger.warning("worker %s: %s", self.worker_name, error.message)
        if error.code != "claim_lost":
            self._lost_lease(lease)

    def _target(self, name: str | None) -> tuple[TargetConfig, Target]:
        return self.built.get(name)

    # -- stops -------------------------------------------------------------------

    def _stop_batch(self, lease: Lease, claims: list[Claim]) -> int:
        """Ask the targets to stop cancelled requests; return the cost of confirmed ones."""
        if not claims:
            return 0
        results = self._in_pool([functools.partial(self._stop, claim) for claim in claims])
        confirmed: list[tuple[Claim, StopResult]] = []
        for claim, result in zip(claims, results, strict=True):
            if self._lease is None:
                break
            if isinstance(result, BaseException):
                detail = (f"{result.code}: {result.message}" if isinstance(result, QuotagateError)
                          else f"{type(result).__name__}: {result}")
                result = StopResult(stopped=False, failed=True,
                                    reason=f"stop failed: {redact_text(detail)}")
            if result.stopped:
                confirmed.append((claim, result))
                continue
            self.counters.increment("stops_pending")
            logger.info("worker %s: stop of %s not confirmed yet: %s", self.worker_name,
                        claim.request_id, result.reason)
            try:
                answer = result.reason or "stop not confirmed yet"
                if result.failed:
                    self.outbox.record_failure(claim, answer, self.stop_poll)
                else:
                    self.outbox.record_stop_progress(claim, answer, self.stop_poll)
            except StaleGeneration as error:
                self._stale(error)
            except RequestGone:
                pass
        if confirmed:
            self._crash_point("after_stop")
        return self._stopped(lease, confirmed) if confirmed and self._lease is not None else 0

    def _stop_overruns(self) -> int:
        """Begin the stop of work past its max-runtime, where its tenant asks for it."""
        begun = overruns.stop_overruns(self.gate.engine, self.gate.clock.now(),
                                       actor=self.actor)
        if begun:
            self.counters.increment("overruns", len(begun))
            logger.info("worker %s: stopping %d request(s) past their max-runtime: %s",
                        self.worker_name, len(begun), ", ".join(begun[:10]))
        return len(begun)

    def _stop(self, claim: Claim) -> StopResult:
        obtained = self.outbox.binding_of(claim.request_id)
        target_name = claim.target if obtained is None else obtained[0]
        try:
            _config, target = self.built.get(target_name)
        except NotFound:
            if obtained is not None:
                raise  # bound to a target since removed: not confirmed, retried
            # Never bound and no target to deliver it to: no attempt could have created
            # anything, so nothing runs (docs/decisions/821).
            return StopResult(stopped=True, reason="never delivered: no such target")
        if obtained is None:
            # Never bound: a lost reply may still have created it under our name.
            found = target.read(external_name(self.ledger_id, claim.tenant, claim.request_id,
                                              claim.request_attempt))
            if found is None:
                return StopResult(stopped=True, reason="never delivered")
            if found.request_id != claim.request_id or found.ledger_id != self.ledger_id:
                return StopResult(stopped=True, reason="never delivered")  # not ours to stop
            return target.stop(found, claim.fencing_token)
        return target.stop(obtained[1], claim.fencing_token)

    def _stopped(self, lease: Lease, confirmed: list[tuple[Claim, StopResult]]) -> int:
        """Cancel the confirmed stops and return their cost: one fenced transaction.

        The lease is checked once for the batch, each claim on its own row.
        """
        ends = [
            End(claim.request_id, RequestState.CANCELLED, reason=bounded_reason(result.reason),
                actor=self.actor, stopped=True, guard=self.outbox.claim_guard(claim))
            for claim, result in confirmed
        ]
        try:
            results = self.gate.ledger.release_many(
                ends, fence=functools.partial(self.leases.fence, lease=lease))
        except StaleGeneration as error:
            self._stale(error)
            return 0
        moved = 0
        for (claim, stop_result), released in zip(confirmed, results, strict=True):
            if isinstance(released, StaleGeneration):
                self._stale(released)
                continue
            if isinstance(released, RequestGone | Conflict):
                continue
            if isinstance(released, Exception):
                raise released
            if released.released:
                self.counters.increment("stopped")
                logger.info("worker %s: stopped %s (%s)", self.worker_name, claim.request_id,
                            stop_result.reason)
            moved += 1
        return moved

    # -- outcomes ----------------------------------------------------------------

    def _observe_beside(self, stop: threading.Event, halt: threading.Event) -> None:
        """``run``'s outcome thread: read outcomes and release ends beside the passes.

        A read that ended something is followed by the next at once (more ends may
        wait: the next page, or work that ended meanwhile); one that ended nothing,
        or found the lease not held, waits ``poll_interval``, as an idle pass does.
        Its ends are fenced by the lease the passes hold; a loss seen here stops
        them until the passes hold a lease again.
        """
        refreshed = -TARGET_REFRESH_INTERVAL
        try:
            while not (stop.is_set() or halt.is_set()):
                ended = 0
                try:
                    if time.monotonic() - refreshed >= TARGET_REFRESH_INTERVAL:
                        self.observed.refresh()  # target changes, within a second
                        refreshed = time.monotonic()
                    ended = self._observe(self.observed)
                except QuotagateError as error:
                    logger.warning("worker %s: outcome read failed: %s", self.worker_name,
                                   error.message)
                except Exception:
                    # Keep the thread alive; the next read starts from the database.
                    logger.exception("worker %s: outcome read failed", self.worker_name)
                if ended and self._bell is not None and self.admit:
                    self._bell.ring()  # room came back: the passes admit again at once
                if not ended:
                    stop.wait(self.poll_interval)
        finally:
            self.observed.close()
            if self._bell is not None and self.admit:
                self._bell.ring()  # a pass waiting on the bell sees the stop now

    def _observe(self, built: BuiltTargets | None = None) -> int:
        """Release delivered requests whose executor reports an end (fenced by the lease).

        ``built``: whose targets read (the outcome thread's own; the passes' by default).
        """
        built = self.built if built is None else built
        if self._lease is None:
            return 0
        watched = self.outbox.delivered_bindings(self.observe_limit, after=self._observed_up_to)
        self._watched = len(watched)
        # Next pass goes on from here; a short page means we reached the end: wrap around.
        self._observed_up_to = (
            watched[-1][2].request_id if len(watched) == self.observe_limit else ""
        )
        by_target: dict[str, list[ExternalObject]] = {}
        for _tenant, target_name, obtained in watched:
            by_target.setdefault(target_name, []).append(obtained)
        ended = 0
        for target_name, objects in by_target.items():
            try:
                _config, target = built.get(target_name)
                outcomes = target.outcomes(objects)
            except QuotagateError as error:
                logger.warning("worker %s: reading outcomes from %s: %s", self.worker_name,
                               target_name, redact_text(error.message))
                continue
            if outcomes:
                self._crash_point("after_outcomes")
            lease = self._lease
            if lease is None:
                return ended
            try:
                released, settled = self._end_all(lease, outcomes)
            except StaleGeneration as error:
                self._stale(error, lease)
                return ended
            if settled:
                self._crash_point("after_ends")
            ended += released
            if settled and isinstance(target, ForgetsEnded):
                target.forget_ended([obtained for obtained in objects
                                     if obtained.request_id in settled])
            if self._lease is None:
                return ended
        return ended

    def _end_all(self, lease: Lease, outcomes: dict[str, Outcome]) -> tuple[int, set[str]]:
        """Release the requests their executor reports ended, in fenced batches.

        One transaction per batch (``Ledger.release_many``): one end per
        transaction made the ends queue on the same usage rows (decisions/218).
        Returns how many this worker released (one another worker or a
        callback ended first is not counted) and the ids whose end is now
        recorded, by this worker or before.
        """
        ended = 0
        settled: set[str] = set()
        items = sorted(outcomes.items())
        for start in range(0, len(items), END_BATCH):
            chunk = items[start:start + END_BATCH]
            results = self.gate.ledger.release_many(
                [End(request_id,
                     RequestState.COMPLETED if outcome.completed else RequestState.FAILED,
                     reason=bounded_reason(outcome.reason), actor=self.actor)
                 for request_id, outcome in chunk],
                fence=functools.partial(self.leases.fence, lease=lease),
            )
            for (request_id, outcome), result in zip(chunk, results, strict=True):
                if isinstance(result, Conflict | NotFound):
                    settled.add(request_id)
                    continue  # another worker (or a callback) recorded the end first
                if isinstance(result, Exception):
                    raise result
                settled.add(request_id)
                if result.released:
                    self.counters.increment(
                        "executor_completed" if outcome.completed else "executor_failed")
                    ended += 1
        return ended, settled

    def _crash_point(self, name: str) -> None:
        if self._crash_at == name:
            logger.warning("worker %s: crash point %s: SIGKILL", self.worker_name, name)
            os.kill(os.getpid(), signal.SIGKILL)


def _per_claim(answer: object, count: int) -> list[ExternalObject | BaseException]:
    """A chunk's answer as one result per claim: its list, or its one error for each."""
    if isinstance(answer, BaseException):
        return [answer] * count
    if not isinstance(answer, list) or len(answer) != count:
        error = InvalidInput(f"a batch create answered {type(answer).__name__} for {count} "
                             "deliveries", code="invalid_batch_answer")
        return [error] * count
    return answer


def _outcome_of(call: Callable[[], Result]) -> Result | BaseException:
    try:
        return call()
    except Exception as error:
        return error
