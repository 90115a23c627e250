"""Generational leases, the pure rules (docs/invariants.md, 6).

A lease is a named ownership with a generation that grows by one at every
acquisition or takeover. The generation, not the owner's name, is what makes a
write legitimate: a worker restarted under the same name takes over with a new
generation, and the old process, should it come back, still carries the old
one. Expiry is judged by the database's clock (see ``quotagate.store.lease``);
these rules only describe what the SQL decides, so they can be tested alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quotagate.errors import InvalidInput

__all__ = [
    "Lease",
    "is_current",
    "is_free",
    "next_generation",
    "validate_lease_name",
    "validate_owner",
    "validate_ttl",
]

MIN_TTL = 0.1
MAX_TTL = 24 * 3600.0
_LEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_OWNER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Lease:
    """One lease as its holder knows it: the generation is its fencing token."""

    name: str
    owner: str | None
    generation: int
    expires_at: float

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "owner": self.owner,
            "generation": self.generation,
            "expires_at": self.expires_at,
        }


def is_free(owner: str | None, expires_at: float, now: float) -> bool:
    """May anyone take the lease at ``now``? Free when released or expired.

    The SQL condition of acquisition is this rule: ``owner IS NULL OR
    expires_at < now``. Expiry alone allows a takeover; it never proves the old
    holder's last attempt had no effect, so work done under a lease
    must still be idempotent downstream.
    """
    return owner is None or expires_at < now


def next_generation(generation: int) -> int:
    """Every acquisition, takeover by the same name included, moves the generation on."""
    return generation + 1


def is_current(lease: Lease, owner: str | None, generation: int) -> bool:
    """Does a write made as (owner, generation) still speak for this lease?

    Both must match: after a takeover by a worker of the same name only the
    generation tells the old process from the new one.
    """
    return lease.owner == owner and lease.generation == generation


def validate_lease_name(value: object) -> str:
    if not isinstance(value, str) or not _LEASE_NAME.fullmatch(value):
        raise InvalidInput(
            "lease name must be 1-128 characters of letters, digits, '.', '_', ':', '/' or '-'",
            code="invalid_lease_name",
        )
    return value


def validate_owner(value: object) -> str:
    if not isinstance(value, str) or not _OWNER_NAME.fullmatch(value):
        raise InvalidInput(
            "worker name must be 1-100 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            code="invalid_worker_name",
        )
    return value


def validate_ttl(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        MIN_TTL <= value <= MAX_TTL
    ):
        raise InvalidInput(
            f"lease ttl must be between {MIN_TTL} and {MAX_TTL} seconds", code="invalid_lease_ttl"
        )
    return float(value)
