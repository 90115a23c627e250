"""Fair share between tenants: who is offered the next admission (docs/fair-sharing.md).

Priority (with aging) orders a tenant's own queue only. Between tenants the next
candidate comes from the tenant with the lowest *weighted dominant share*: its
largest use-to-nominal ratio over its resources (DRF, dominant resource
fairness), divided by its weight. Ties go to the tenant whose head is first in
queue order. So a tenant cannot buy its way ahead of others with a high
priority, and two saturating tenants of weights 1 and 2 settle at use 1:2.

With a half-life (``--fair-share-half-life``, docs/decisions/712) the share is
blended with the tenant's *past* use: released work's resource-seconds, decayed
exponentially, as an average share over the recent past (:func:`past_share`).
A tenant that used much lately then yields to one that did not, as Slurm's
fairshare and Kueue's Admission Fair Sharing do.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

Usage = Mapping[str, tuple[int, int]]


class Queued(Protocol):
    """What fair ordering needs of a candidate (quotagate.domain.placement.Candidate)."""

    @property
    def id(self) -> str: ...

    @property
    def tenant(self) -> str: ...


T = TypeVar("T", bound=Queued)


def dominant_share(usage: Usage, weight: int = 1) -> float:
    """The largest ``used / nominal`` over a tenant's resources, divided by its weight.

    A resource with a nominal of 0 that is used anyway (borrowed) counts as if
    its nominal were 1: using what one was not given weighs more than using
    what one was.
    """
    # Comparisons, not max(): asked for every tenant at every admission.
    share = 0.0
    for used, nominal in usage.values():
        if used > 0:
            ratio = used / nominal if nominal > 1 else float(used)
            if ratio > share:
                share = ratio
    return share / weight if weight > 1 else share


def fair_share(usage: Usage, weight: int, past: float | None) -> float:
    """A tenant's place in the fair order: its weighted dominant share, plus its past share
    (:func:`past_share`, with a half-life) over its weight. Lowest goes first."""
    share = dominant_share(usage, weight)
    return share + past / max(weight, 1) if past else share


def decayed(value: float, since: float | None, now: float, half_life: float) -> float:
    """``value`` recorded at ``since``, decayed to ``now``: halved every ``half_life``."""
    if since is None or value == 0:
        return 0.0
    return value * math.pow(2.0, -max(0.0, now - since) / half_life)


def held_decayed(amount: int, held: float, half_life: float) -> float:
    """What ``amount`` held for ``held`` seconds, ending now, adds to decayed past use.

    The integral of ``amount * 2^(-(now - s) / half_life)`` over the time held:
    recent seconds weigh fully, older ones less, exactly as if the use had been
    added second by second and decayed since.
    """
    if held <= 0:
        return 0.0
    mean_life = half_life / math.log(2)
    return amount * mean_life * (1.0 - math.pow(2.0, -held / half_life))


def past_share(
    decayed_use: Mapping[str, tuple[float, float | None]], usage: Usage, half_life: float,
    now: float,
) -> float:
    """The dominant share of a tenant's decayed past use: per resource, its decayed
    resource-seconds over what its nominal held all along would have decayed to
    (``nominal * half_life / ln 2``), the largest over its resources."""
    mean_life = half_life / math.log(2)
    share = 0.0
    for resource, (value, since) in decayed_use.items():
        past = decayed(value, since, now, half_life)
        if past > 0:
            _used, nominal = usage.get(resource, (0, 0))
            share = max(share, past / (max(nominal, 1) * mean_life))
    return share


class FairOrder(Generic[T]):
    """Hands out candidates tenant by tenant, lowest weighted dominant share first.

    ``candidates`` come in global queue order; each tenant's stay in that order,
    and a candidate's place in it breaks ties between tenants of equal share.
    ``history``: each tenant's past share (:func:`past_share`), blended in.
    After each candidate handed out, :meth:`considered` is told its tenant's
    usage (changed if it was placed), and the tenant goes back in line.
    """

    def __init__(
        self, candidates: Iterable[T], usage: Mapping[str, Usage], weights: Mapping[str, int],
        history: Mapping[str, float] | None = None,
    ) -> None:
        # Only each tenant's first place is looked up here: admission hands in a
        # few candidates per tenant and often places the first one it is handed,
        # so the tenants' queues are linked up (:meth:`_following`) only when a
        # tenant goes back in line.
        self._candidates = candidates if isinstance(candidates, list) else list(candidates)
        self._first: dict[str, int] = {}
        for index, candidate in enumerate(self._candidates):
            if candidate.tenant not in self._first:
                self._first[candidate.tenant] = index
        self._after: list[int] | None = None
        self._weights = weights
        # Past shares (a half-life is set), added to the current share before the weight.
        self._history = history or {}
        self._heap: list[tuple[float, int, str]] = []
        self._current = ""
        self._position = 0
        empty: Usage = {}
        for tenant, position in self._first.items():
            self._push(tenant, position, usage.get(tenant, empty))

    def _push(self, tenant: str, position: int, usage: Usage) -> None:
        if position < len(self._candidates):
            share = fair_share(usage, self._weights.get(tenant, 1), self._history.get(tenant))
            heapq.heappush(self._heap, (share, position, tenant))

    def _following(self) -> list[int]:
        """Per place in the global order, the place of the same tenant's next candidate
        (past the end: none), linked in one pass the first time it is needed."""
        if self._after is None:
            count = len(self._candidates)
            after = [count] * count
            last: dict[str, int] = {}
            for index, candidate in enumerate(self._candidates):
                previous = last.get(candidate.tenant)
                if previous is not None:
                    after[previous] = index
                last[candidate.tenant] = index
            self._after = after
        return self._after

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if not self._heap:
            raise StopIteration
        _share, self._position, self._current = heapq.heappop(self._heap)
        return self._candidates[self._position]

    def considered(self, usage: Usage) -> None:
        """The tenant of the candidate just handed out goes back in line with this usage."""
        self._push(self._current, self._following()[self._position], usage)
