"""What one dispatcher pass did, in words: ``quotagate worker --once`` prints it.

A pass's ``run_once`` returns one number (how much moved, so a loop knows
whether to wait); a person wants to know what moved. The delivery counters
already count each kind of step as it happens (``store.counters``), so the
report is their difference over the pass, plus what admission placed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PassReport"]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun if count == 1 else noun + 's'}"


@dataclass(frozen=True)
class PassReport:
    lease: str
    # False: another live worker holds the lease, so the pass did nothing.
    lease_held: bool = True
    # None: the worker does not admit (no --admit).
    admitted: int | None = None
    delivered: int = 0
    # Failed delivery attempts to be tried again, and requests delivery gave up on.
    retrying: int = 0
    failed: int = 0
    stops_confirmed: int = 0
    # Stops sent that the target has not confirmed yet; tried again next pass.
    stops_pending: int = 0
    # Stops begun because work ran past its max-runtime (docs/decisions/714).
    overruns: int = 0
    completed: int = 0
    executor_failed: int = 0

    @classmethod
    def between(cls, lease: str, before: Mapping[str, int], after: Mapping[str, int],
                admitted: int | None) -> PassReport:
        """The report of a pass from the delivery counters before and after it."""
        def delta(name: str) -> int:
            return after.get(name, 0) - before.get(name, 0)

        # "retried" counts every row freed to be tried again: failed deliveries and
        # stops not confirmed yet, which "stops_pending" counts on their own.
        return cls(lease, True, admitted, delivered=delta("delivered"),
                   retrying=max(0, delta("retried") - delta("stops_pending")),
                   failed=delta("given_up"),
                   stops_confirmed=delta("stopped"), stops_pending=delta("stops_pending"),
                   overruns=delta("overruns"),
                   completed=delta("executor_completed"),
                   executor_failed=delta("executor_failed"))

    def sentence(self) -> str:
        """``delivered 3 requests, 0 failed, 1 stop confirmed``; what is zero and rare is left out."""
        if not self.lease_held:
            return (f"did nothing: lease {self.lease} is held by another live worker "
                    "(each live worker needs its own --name; a dead one's lease expires)")
        parts = [] if self.admitted is None else [f"admitted {_plural(self.admitted, 'request')}"]
        parts += [f"delivered {_plural(self.delivered, 'request')}", f"{self.failed} failed"]
        if self.retrying:
            parts.append(f"{self.retrying} to retry")
        if self.overruns:
            parts.append(f"{_plural(self.overruns, 'stop')} begun at the max-runtime")
        parts.append(f"{_plural(self.stops_confirmed, 'stop')} confirmed")
        if self.stops_pending:
            parts.append(f"{_plural(self.stops_pending, 'stop')} awaiting the target")
        if self.completed or self.executor_failed:
            parts.append(f"{self.completed} completed and {self.executor_failed} failed "
                         "by their executor")
        return ", ".join(parts)
