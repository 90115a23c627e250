"""A queue head row as admission plans on it: the candidate, built once per request.

Rows of :func:`quotagate.store.statements.head_query` become *head entries*
``(queue_key, created, id, candidate, target, token_floor)``: as plain tuples
they sort in queue order (the id is unique, so the candidate is never
compared), and kept between SQLite admissions
(:mod:`quotagate.store.admission_reads`) they are converted once, not at every
admission that finds them again (docs/decisions/055-sqlite-keeps-head-candidates.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any

from quotagate.domain.placement import Candidate
from quotagate.store.rows import decode_cost

__all__ = ["QUEUE_ORDER", "HeadEntry", "candidate", "cost_items", "head_entries"]

# A head row's place in queue order (queue key, created, id: quotagate.domain.ordering).
QUEUE_ORDER = itemgetter(3, 4, 0)

# (queue_key, created, id, candidate, target, token_floor)
HeadEntry = tuple[Any, Any, str, Candidate, "str | None", Any]


@lru_cache(maxsize=4096)
def cost_items(text: str) -> tuple[tuple[str, int], ...]:
    """A stored cost, decoded once per distinct text: queues repeat a few shapes endlessly,
    and decoding every candidate's JSON was a tenth of an admission's CPU."""
    return tuple(decode_cost(text).items())


@lru_cache(maxsize=4096)
def candidate(request_id: str, tenant: str, cost: str, runtime: int | None) -> Candidate:
    """The candidate of a head row, built once per request: consecutive admissions read
    the same heads of the queues again (all but what they admitted). A Candidate is
    frozen and nothing changes its cost, so one instance serves every read."""
    return Candidate(request_id, tenant, dict(cost_items(cost)), runtime)


def head_entries(rows: Iterable[Sequence[Any]]) -> list[HeadEntry]:
    """``head_query``'s rows as head entries (above), in the rows' order."""
    return [
        (queue_key, created, request_id, candidate(request_id, tenant, cost, runtime),
         target, floor)
        for request_id, tenant, cost, queue_key, created, target, runtime, floor in rows
    ]
