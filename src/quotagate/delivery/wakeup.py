"""A doorbell from ``serve``'s admission loop to the dispatcher beside it.

The dispatcher learns of new work by looking: after a pass that moved nothing it
waits ``poll_interval`` (0.5 s) before the next look, so a burst admitted just
after an empty pass waited up to that long for its first delivery. In one
process the admission loop knows the moment it reserved something; it rings, and
a dispatcher waiting idle looks at once (docs/decisions/258). An idle database is
still looked at once per ``poll_interval`` only: the bell rings on admissions,
never on a timer.
"""

from __future__ import annotations

import threading

__all__ = ["Wakeup"]


class Wakeup:
    """Rung after work was committed; waited on by the idle dispatcher."""

    def __init__(self) -> None:
        self._rung = threading.Event()

    def ring(self) -> None:
        """Work is there (committed before this call), or the waiter should stop waiting."""
        self._rung.set()

    def wait(self, timeout: float) -> None:
        """Until rung or ``timeout`` seconds passed; a ring during the last pass counts.

        The bell is cleared once this returns, before the next pass reads: a ring that
        comes after the clear is for work the next pass may not see, and it stays set
        for the wait after that pass.
        """
        self._rung.wait(timeout)
        self._rung.clear()
