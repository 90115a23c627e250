"""Lease names, worker names and TTLs: what a caller gives is validated before any statement runs."""

from __future__ import annotations

import pytest

from quotagate import InvalidInput
from quotagate.domain.lease import validate_lease_name, validate_owner, validate_ttl


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
