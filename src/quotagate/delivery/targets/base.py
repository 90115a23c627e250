"""The one small protocol every delivery target implements.

A target creates an external object under a deterministic name if it does not
exist yet, and reads it back by name. "Already exists" is not an error but a
lost reply being resolved: the object is read back and its identity (the
ledger id and request id it carries) is checked before it is bound.

A target also reports how many objects ended in one call (``outcomes``) and
asks its executor to stop one (``stop``, idempotent: asking again is how a
worker polls until the stop is confirmed). A worker builds each target once
and calls ``close`` when it shuts down or the target's configuration changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from quotagate.domain.external_object import ExternalObject as ExternalObject  # what targets return
from quotagate.errors import Conflict, QuotagateError


@dataclass(frozen=True)
class DeliverySpec:
    """What a target receives for one delivery attempt."""

    request_id: str
    tenant: str
    cost: Mapping[str, int]
    payload: Any
    fencing_token: int
    external_name: str
    ledger_id: str
    # 1, or the later attempt of a requeued request (its name differs: docs/decisions/720).
    attempt: int = 1


@dataclass(frozen=True)
class Outcome:
    """What the executor says became of the work, once it knows."""

    completed: bool
    reason: str | None = None


@dataclass(frozen=True)
class StopResult:
    """What a stop request achieved so far."""

    stopped: bool  # True only once the executor confirms the work no longer runs, or it is gone
    reason: str | None = None  # why not yet, or how it ended
    # Not stopped because asking failed (refused, unreachable, not allowed), as opposed
    # to a stop under way: only a failure is the outbox's ``last_error`` (docs/decisions/823).
    failed: bool = False


class DeliveryFailed(QuotagateError):
    """The target refused or could not be reached; the delivery will be retried."""

    status = 502
    default_code = "delivery_failed"


class IdentityMismatch(Conflict):
    """An object with our deterministic name belongs to another request.

    Retrying cannot help, so the request fails at once, loudly.
    """

    default_code = "external_identity_mismatch"


class Target(Protocol):
    kind: str

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        """Create the object named ``spec.external_name``, or bind the existing one."""
        ...

    def read(self, name: str) -> ExternalObject | None:
        """The object by name, or None if it does not exist."""
        ...

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        """The outcomes of those ``objects`` that ended, keyed by request id.

        Objects still running (or whose executor cannot tell yet) are absent; an
        object that disappeared after it was bound is ``Outcome(completed=False)``.
        """
        ...

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        """Ask the executor to stop the work; idempotent, so asking again polls."""
        ...

    def close(self) -> None:
        """Release clients and pools."""
        ...


@runtime_checkable
class ForgetsEnded(Protocol):
    """A target that keeps a record of ended objects for ``outcomes`` (the process target's
    ``.exited`` index) and can drop it once their ends are committed in the ledger."""

    def forget_ended(self, objects: Sequence[ExternalObject]) -> None:
        """Drop what ``outcomes`` kept about ``objects``; their ends are recorded."""
        ...


@runtime_checkable
class CreatesMany(Protocol):
    """A target that can create many objects in one call (the webhook target's
    ``--batch-deliver``). ``batch_size`` 1 means it does not, as configured."""

    batch_size: int

    def create_many(self, specs: Sequence[DeliverySpec]) -> list[ExternalObject | Exception]:
        """``create_if_absent`` of every spec, in order: each its object or its own error."""
        ...


class TargetBuilder(Protocol):
    def __call__(self, config: Mapping[str, Any], *, ledger_id: str) -> Target: ...


@dataclass(frozen=True)
class TargetKind:
    """A target plugin (``delivery.targets.TARGET_KINDS``): check a stored config, build a target."""

    validate_config: Callable[[Mapping[str, Any]], dict[str, Any]]
    build: TargetBuilder
    # The configuration keys it reads: any other is refused when the target is set, where a
    # kind's own check would ignore it (``--url`` on a spark target was dropped without a
    # word). None: a plugin that does not say, not checked.
    options: frozenset[str] | None = None


def check_identity(found: ExternalObject, spec: DeliverySpec) -> ExternalObject:
    """``found`` if it is this ledger's object for this request; IdentityMismatch otherwise."""
    if found.request_id != spec.request_id or found.ledger_id != spec.ledger_id:
        raise IdentityMismatch(
            f"{spec.external_name!r} already exists for request {found.request_id!r} of "
            f"ledger {found.ledger_id!r}, not request {spec.request_id!r} of ledger "
            f"{spec.ledger_id!r}; refusing to bind another request's object",
            external_name=spec.external_name,
        )
    return found
