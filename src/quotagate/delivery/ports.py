"""What the dispatcher needs from the app that runs it (``Quotagate`` provides it).

The port lives with its caller, so delivery never imports the app above it
(docs/architecture.md).
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.engine import Engine

from quotagate.domain.clock import Clock
from quotagate.store.counters import Counters
from quotagate.store.ledger import Ledger

__all__ = ["DeliveryHost"]


class DeliveryHost(Protocol):
    @property
    def engine(self) -> Engine: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def ledger(self) -> Ledger:
        """Where delivered requests are released (completed, failed, cancelled)."""
        ...

    @property
    def ledger_id(self) -> str:
        """This ledger's identity, written into every external object."""
        ...

    @property
    def delivery_counters(self) -> Counters:
        """The delivery counters the app's metrics export."""
        ...

    def admit_until_idle(self, batch: int = 16) -> int: ...
