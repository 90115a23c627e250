"""The one small protocol every delivery target implements.

A target creates an external object under a deterministic name if it does not
exist yet, and reads it back by name. "Already exists" is not an error but a
lost reply being resolved: the object is read back and its identity (the
request id it carries) is checked before it is bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


@dataclass(frozen=True)
class ExternalObject:
    """The identity of a delivered object, as recorded in the binding."""

    name: str
    uid: str | None
    request_id: str
    created_now: bool = False


@dataclass(frozen=True)
class Outcome:
    """What the executor says became of the work, once it knows."""

    completed: bool
    reason: str | None = None


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

    def outcome(self, obtained: ExternalObject) -> Outcome | None:
        """Completed or failed, if the executor says so; None while it runs or cannot tell."""
        ...


def check_identity(found: ExternalObject, spec: DeliverySpec) -> ExternalObject:
    if found.request_id != spec.request_id:
        raise IdentityMismatch(
            f"{spec.external_name!r} already exists for request {found.request_id!r}, "
            f"not {spec.request_id!r}; refusing to bind another request's object",
            external_name=spec.external_name,
        )
    return found
