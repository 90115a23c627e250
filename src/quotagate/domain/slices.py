"""Capacity slices: how a pool's cap is split over its slices, and moved between them.

Pure arithmetic over ``(used, cap)`` per slice of one pool resource; the store
(:mod:`quotagate.store.pool_slices`) locks the rows and writes what these say.
Every function keeps the sum of the slice caps equal to the pool's cap, and
never sets a slice's cap below what is in use on it when the pool has room for
that use (docs/decisions/029-capacity-slices.md).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_SLICES", "concentrate", "spread"]

# More slices than admitters only spread the room thinner; a few dozen is plenty.
MAX_SLICES = 64


def _shares(amount: int, count: int) -> list[int]:
    """``amount`` in ``count`` nearly equal whole parts, the larger ones first."""
    base, extra = divmod(amount, count)
    return [base + (1 if index < extra else 0) for index in range(count)]


def spread(cap: int, used: Sequence[int], count: int) -> list[int]:
    """The caps of ``count`` slices whose use is ``used`` (missing slices: 0), summing to ``cap``.

    The free room (cap minus use) is split evenly on top of each slice's use,
    so every slice can admit about the same. A cap below the use leaves no
    slice any room (each slice's cap at most its use): nothing fits anywhere
    until use falls, as with one slice. Splitting it evenly instead would let
    an empty slice admit while the pool is over its cap.
    """
    usage = [*used[:count], *([0] * max(0, count - len(used)))]
    free = cap - sum(usage)
    if free < 0:
        caps: list[int] = []
        left = max(cap, 0)
        for in_use in usage:
            caps.append(min(in_use, left))
            left -= caps[-1]
        return caps
    return [in_use + share for in_use, share in zip(usage, _shares(free, count), strict=True)]


def concentrate(caps: Sequence[int], used: Sequence[int], target: int, need: int) -> list[int] | None:
    """Caps that give slice ``target`` room for ``need``, or None if the pool has not that room.

    The room beyond ``need`` is spread evenly over all slices, so the other
    admitters keep some room to work in.
    """
    free = sum(caps) - sum(used)
    if need > free or need < 0:
        return None
    rest = _shares(free - need, len(caps))
    return [in_use + share + (need if index == target else 0)
            for index, (in_use, share) in enumerate(zip(used, rest, strict=True))]
