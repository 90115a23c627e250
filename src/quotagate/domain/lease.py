"""Generational leases: the lease as its holder knows it, and input validation.

A lease is a named ownership with a generation that grows by one at every
acquisition or takeover. The generation, not the owner's name, is what makes a
write legitimate: a worker restarted under the same name takes over with a new
generation, and the old process, should it come back, still carries the old
one. Free, expired and current are decided by the statements themselves —
SQL in ``quotagate.store.lease`` on the database's clock, Lua in
``quotagate.streams.scripts`` on Redis's — and tested there; this module holds
the lease as its holder knows it and the validation of what a caller gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quotagate.errors import InvalidInput

__all__ = [
    "Lease",
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
