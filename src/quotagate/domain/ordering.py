"""Queue order: priority plus aging, in a form a database index can serve.

A request gains one priority point per aging interval of waiting, so its
effective priority at time ``now`` is ``priority + (now - created) / interval``.
Comparing two requests at the same ``now`` cancels ``now``: the order is that of
``priority - created / interval``, a number fixed at submission. We store its
negation (``created / interval - priority``) so that the best request comes
first in an ascending index, then ties break by submission time and id.
"""

from __future__ import annotations

DEFAULT_AGING_INTERVAL = 30.0


def queue_key(priority: int, created: float, aging_interval: float) -> float:
    if aging_interval <= 0:
        raise ValueError("aging interval must be positive")
    return created / aging_interval - priority


def effective_priority(priority: int, created: float, now: float, aging_interval: float) -> float:
    return priority + max(0.0, now - created) / aging_interval
