"""The outbox dispatcher behind ``quotagate worker``.

One pass (``run_once``): make sure this worker holds its lease, claim due
outbox rows, deliver each to its target, record the binding, mark it
delivered; then read back outcomes of delivered requests and release their
cost when the executor says they ended. ``run`` repeats passes until told to
stop and then gives the lease up.

Each worker holds one lease, ``worker/<name>`` (docs/decisions/201). Its
generation fences every write it makes; the per-row claim token is the fencing
token sent downstream.

Crash points for tests: ``QUOTAGATE_CRASH_AT=after_claim|after_create|after_binding``
makes the worker SIGKILL itself at that step of its first delivery.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from quotagate.delivery import stats
from quotagate.delivery.naming import external_name
from quotagate.delivery.outbox import Claim, OutboxStore, RequestGone
from quotagate.delivery.registry import TargetConfig, TargetStore
from quotagate.delivery.retry import RetryPolicy
from quotagate.delivery.targets import Target, build_target
from quotagate.delivery.targets.base import DeliverySpec, IdentityMismatch
from quotagate.domain.lease import Lease, validate_owner, validate_ttl
from quotagate.domain.model import RequestState
from quotagate.errors import Conflict, InvalidInput, QuotagateError, StaleGeneration
from quotagate.store.lease import LeaseStore

if TYPE_CHECKING:
    from quotagate.app import Quotagate

__all__ = ["CRASH_POINTS", "Dispatcher", "lease_name"]

logger = logging.getLogger("quotagate.delivery")

CRASH_ENVIRONMENT_VARIABLE = "QUOTAGATE_CRASH_AT"
CRASH_POINTS = ("after_claim", "after_create", "after_binding")
DEFAULT_LEASE_TTL = 15.0
DEFAULT_CLAIM_TTL = 120.0
DEFAULT_MAX_ATTEMPTS = 5


def lease_name(worker_name: str) -> str:
    return f"worker/{worker_name}"


class Dispatcher:
    """Delivers admitted requests; many may run, in threads or on many machines."""

    def __init__(
        self,
        gate: Quotagate,
        *,
        worker_name: str,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        batch: int = 16,
        claim_ttl: float = DEFAULT_CLAIM_TTL,
        retry_base: float = 1.0,
        retry_max: float = 300.0,
        poll_interval: float = 0.5,
        admit: bool = False,
        observe_limit: int = 100,
    ) -> None:
        self.gate = gate
        self.worker_name = validate_owner(worker_name)
        self.lease_name = lease_name(worker_name)
        self.lease_ttl = validate_ttl(lease_ttl)
        self.claim_ttl = validate_ttl(claim_ttl)
        if batch < 1:
            raise InvalidInput("batch must be at least 1", code="invalid_batch")
        if observe_limit < 0:
            raise InvalidInput("observe limit must be 0 or more", code="invalid_observe_limit")
        self.batch = batch
        self.poll_interval = poll_interval
        self.admit = admit
        self.observe_limit = observe_limit
        self.retry = RetryPolicy(max_attempts, retry_base, retry_max)
        self.leases = LeaseStore(gate.engine)
        self.outbox = OutboxStore(gate.engine, self.leases, gate.clock)
        self.targets = TargetStore(gate.engine, clock=gate.clock)
        self.actor = f"worker:{worker_name}"
        self.ledger_id = gate.ledger_id
        self._lease: Lease | None = None
        self._renewed_at = 0.0
        self._built: dict[str, tuple[TargetConfig, Target]] = {}
        self._observed_up_to = ""
        self._waiting_logged = False
        crash_at = os.environ.get(CRASH_ENVIRONMENT_VARIABLE) or None
        if crash_at is not None and crash_at not in CRASH_POINTS:
            raise InvalidInput(
                f"{CRASH_ENVIRONMENT_VARIABLE} must be one of {', '.join(CRASH_POINTS)}",
                code="invalid_crash_point",
            )
        self._crash_at = crash_at

    @property
    def lease(self) -> Lease | None:
        """The lease this worker holds, as it last knew it."""
        return self._lease

    # -- the loop ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set; then release the lease."""
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
                if done == 0:
                    stop.wait(self.poll_interval)
        finally:
            self.release()

    def release(self) -> None:
        if self._lease is not None:
            try:
                self.leases.release(self._lease)
            except QuotagateError as error:
                logger.warning("worker %s: cannot release lease: %s", self.worker_name, error)
            self._lease = None

    def run_once(self) -> int:
        """One pass; returns how many requests moved (admitted, delivered, ended)."""
        if not self._hold_lease():
            return 0
        moved = self.gate.admit_until_idle() if self.admit else 0
        self._built.clear()  # pick up target changes once per pass
        lease = self._lease
        if lease is None:  # pragma: no cover - _hold_lease just set it
            return moved
        for claim in self.outbox.claim(lease, self.batch, self.claim_ttl):
            if self._lease is None:
                break  # lease lost mid-batch: the rest would be refused anyway
            moved += self._deliver(claim)
            self._hold_lease()
        if self._lease is not None and self.observe_limit:
            moved += self._observe()
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

    def _lost_lease(self) -> None:
        logger.warning("worker %s: lease %s was taken over; stopping work under generation %s",
                       self.worker_name, self.lease_name,
                       None if self._lease is None else self._lease.generation)
        self._lease = None

    # -- delivery ----------------------------------------------------------------

    def _deliver(self, claim: Claim) -> int:
        try:
            config, target = self._target(claim.target)
            spec = DeliverySpec(
                request_id=claim.request_id, tenant=claim.tenant, cost=claim.cost,
                payload=claim.payload, fencing_token=claim.token,
                external_name=external_name(self.ledger_id, claim.tenant, claim.request_id),
                ledger_id=self.ledger_id,
            )
            self._crash_point("after_claim")
            obtained = target.create_if_absent(spec)
            self._crash_point("after_create")
            self.outbox.record_binding(claim, config.name, obtained)
            self._crash_point("after_binding")
            self.outbox.mark_delivered(claim, actor=self.actor)
            logger.info("worker %s: delivered %s to %s as %s (uid %s, token %d)",
                        self.worker_name, claim.request_id, config.name, obtained.name,
                        obtained.uid, claim.token)
            return 1
        except StaleGeneration as error:
            self._stale(error)
            return 0
        except RequestGone:
            logger.warning("worker %s: %s left reserved during delivery; an external object "
                           "may be left in place", self.worker_name, claim.request_id)
            return 0
        except (IdentityMismatch, Conflict) as error:
            # Retrying cannot fix another request's object in our name.
            return self._give_up(claim, error.message)
        except QuotagateError as error:
            return self._failed_attempt(claim, f"{error.code}: {error.message}")
        except Exception as error:  # a target bug must not stop the worker
            logger.exception("worker %s: delivering %s", self.worker_name, claim.request_id)
            return self._failed_attempt(claim, f"{type(error).__name__}: {error}")

    def _failed_attempt(self, claim: Claim, error: str) -> int:
        stats.increment("delivery_errors")
        attempts = claim.attempts + 1
        if self.retry.gives_up(attempts):
            return self._give_up(claim, f"delivery failed after {attempts} attempts: {error}")
        retry_at = self.gate.clock.now() + self.retry.delay(attempts)
        logger.warning("worker %s: delivering %s failed (attempt %d): %s", self.worker_name,
                       claim.request_id, attempts, error)
        try:
            self.outbox.record_failure(claim, error, retry_at)
        except StaleGeneration as stale_error:
            self._stale(stale_error)
        except RequestGone:
            pass
        return 0

    def _give_up(self, claim: Claim, reason: str) -> int:
        logger.error("worker %s: request %s failed: %s", self.worker_name, claim.request_id,
                     reason)
        try:
            self.gate.ledger.release(
                claim.request_id, RequestState.FAILED, reason=reason, actor=self.actor,
                fence=self.outbox.fence(claim),
            )
        except StaleGeneration as error:
            self._stale(error)
            return 0
        except (RequestGone, Conflict):
            return 0
        stats.increment("failed")
        return 1

    def _stale(self, error: StaleGeneration) -> None:
        logger.warning("worker %s: %s", self.worker_name, error.message)
        if error.code != "claim_lost":
            self._lost_lease()

    def _target(self, name: str | None) -> tuple[TargetConfig, Target]:
        key = name or ""
        if key not in self._built:
            config = self.targets.resolve(name)
            self._built[key] = (
                config, build_target(config.kind, config.config, ledger_id=self.ledger_id)
            )
        return self._built[key]

    # -- outcomes ----------------------------------------------------------------

    def _observe(self) -> int:
        """Release delivered requests whose executor reports an end (fenced by the lease)."""
        ended = 0
        watched = self.outbox.delivered_bindings(self.observe_limit, after=self._observed_up_to)
        # Next pass goes on from here; a short page means we reached the end: wrap around.
        self._observed_up_to = (
            watched[-1][2].request_id if len(watched) == self.observe_limit else ""
        )
        for _tenant, target_name, obtained in watched:
            lease = self._lease
            if lease is None:
                break
            try:
                _config, target = self._target(target_name)
                outcome = target.outcomes([obtained]).get(obtained.request_id)
            except QuotagateError as error:
                logger.warning("worker %s: reading the outcome of %s: %s", self.worker_name,
                               obtained.request_id, error.message)
                continue
            if outcome is None:
                continue
            state = RequestState.COMPLETED if outcome.completed else RequestState.FAILED
            try:
                result = self.gate.ledger.release(
                    obtained.request_id, state, reason=outcome.reason, actor=self.actor,
                    fence=functools.partial(self.leases.fence, lease=lease),
                )
            except StaleGeneration as error:
                self._stale(error)
                break
            except Conflict:
                continue  # another worker recorded the end first
            if result.released:
                stats.increment("completed" if outcome.completed else "failed")
                ended += 1
        return ended

    def _crash_point(self, name: str) -> None:
        if self._crash_at == name:
            logger.warning("worker %s: crash point %s: SIGKILL", self.worker_name, name)
            os.kill(os.getpid(), signal.SIGKILL)
