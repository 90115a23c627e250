"""The arithmetic of capacity slices (quotagate.domain.slices): sums kept, use never squeezed."""

from __future__ import annotations

import pytest

from quotagate.domain.slices import concentrate, spread


@pytest.mark.parametrize(("cap", "used", "count", "expected"), [
    (10, [], 4, [3, 3, 2, 2]),
    (8, [2], 4, [4, 2, 1, 1]),
    (8, [2, 0, 0, 0], 1, [8]),
    (7, [1, 3], 2, [3, 4]),
])
def test_spread_puts_the_free_room_evenly_on_top_of_each_slices_use(
    cap: int, used: list[int], count: int, expected: list[int],
) -> None:
    assert spread(cap, used, count) == expected
    assert sum(expected) == cap


def test_a_cap_below_the_use_leaves_no_slice_any_room() -> None:
    caps = spread(4, [3, 2, 0, 0], 4)
    assert sum(caps) == 4
    assert all(cap <= used for cap, used in zip(caps, [3, 2, 0, 0], strict=True))


def test_concentrate_gives_one_slice_the_need_and_spreads_the_rest() -> None:
    caps = concentrate([2, 2, 2, 2], [1, 1, 1, 1], target=2, need=3)
    assert caps is not None
    assert sum(caps) == 8
    assert caps[2] - 1 >= 3  # room for the need on the target
    assert all(cap >= 1 for cap in caps)  # no slice below its use


def test_concentrate_refuses_what_the_pool_has_not_got() -> None:
    assert concentrate([2, 2], [1, 2], target=0, need=2) is None
