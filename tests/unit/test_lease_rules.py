"""Pure lease rules: free/expired, generations, validation."""

from __future__ import annotations

import pytest

from quotagate import InvalidInput
from quotagate.domain.lease import (
    Lease,
    is_current,
    is_free,
    next_generation,
    validate_lease_name,
    validate_owner,
    validate_ttl,
)


def test_a_released_lease_is_free_whatever_its_expiry() -> None:
    assert is_free(None, expires_at=1e12, now=0.0)


def test_a_held_lease_is_free_only_after_it_expires() -> None:
    assert not is_free("worker-a", expires_at=10.0, now=9.0)
    assert not is_free("worker-a", expires_at=10.0, now=10.0)
    assert is_free("worker-a", expires_at=10.0, now=10.001)


def test_every_acquisition_moves_the_generation_on() -> None:
    assert next_generation(0) == 1
    assert next_generation(41) == 42


def test_a_write_is_current_only_with_owner_and_generation() -> None:
    lease = Lease("worker/a", "worker-a", 2, 100.0)
    assert is_current(lease, "worker-a", 2)
    # Same name, older generation: a revived old process.
    assert not is_current(lease, "worker-a", 1)
    assert not is_current(lease, "worker-b", 2)


@pytest.mark.parametrize("name", ["", "-x", "a" * 129, "has space", "ümlaut"])
def test_bad_lease_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput):
        validate_lease_name(name)


@pytest.mark.parametrize("owner", ["", "a/b", "a" * 101, "x y"])
def test_bad_worker_names_are_refused(owner: str) -> None:
    with pytest.raises(InvalidInput) as error:
        validate_owner(owner)
    assert error.value.code == "invalid_worker_name"


@pytest.mark.parametrize("ttl", [0, -1, 0.01, 10**9, True, "5"])
def test_bad_ttls_are_refused(ttl: object) -> None:
    with pytest.raises(InvalidInput):
        validate_ttl(ttl)


def test_good_values_pass_through() -> None:
    assert validate_lease_name("worker/host-1.example") == "worker/host-1.example"
    assert validate_owner("host-1.example") == "host-1.example"
    assert validate_ttl(15) == 15.0
