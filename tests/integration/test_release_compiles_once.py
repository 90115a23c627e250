"""A group release compiles its statements once per group size, on every backend.

The release path's statements are built once and compiled once per dialect by the
driver (docs/decisions/246); a statement built anew at every call is compiled anew
at every call, which in ``serve``'s callback mode was the largest part of the group
release's CPU (docs/decisions/321).
"""

from __future__ import annotations

from quotagate import Quotagate, RequestState
from quotagate.store import driver
from quotagate.store.release import End


def _compilations() -> int:
    return driver._compile.cache_info().misses + driver._numbered.cache_info().misses


def _reserved(gate: Quotagate, prefix: str, count: int) -> list[str]:
    ids = [f"{prefix}-{index}" for index in range(count)]
    for request_id in ids:
        gate.submit(request_id, "team-a", {"gpu": 1})
    assert gate.admit_until_idle(batch=16) == count
    return ids


def test_a_second_release_of_the_same_size_compiles_nothing(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 100})
    gate.set_pool("pool-1", {"gpu": 100})
    first = _reserved(gate, "first", 3)
    second = _reserved(gate, "second", 3)

    def end_all(ids: list[str]) -> None:
        results = gate.release_many([End(request_id, RequestState.COMPLETED) for request_id in ids])
        assert [getattr(result, "released", result) for result in results] == [{"gpu": 1}] * 3

    end_all(first)
    before = _compilations()
    end_all(second)
    assert _compilations() == before
    assert gate.check_invariants() == []
