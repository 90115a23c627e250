"""The port the ledger's submit path calls for rate quotas (``RateQuotas`` implements it).

The ledger asks for a decision after it has validated a submission and before
it records it as waiting: the quota is decided *before* the request enters the
queue. A refusal is recorded as a ``rejected`` request with the reason from
:mod:`quotagate.domain.rate_refusal`. The port lives here, with its caller, so
the store never imports the rate package above it (docs/architecture.md).
"""

from __future__ import annotations

from typing import Protocol

import sqlalchemy as sa

from quotagate.domain.bucket import Decision

__all__ = ["RateGate"]


class RateGate(Protocol):
    @property
    def in_transaction(self) -> bool:
        """True when a take rolls back with the submission's transaction."""
        ...

    def take_for_submission(
        self, connection: sa.Connection, tenant: str, amount: int = 1
    ) -> Decision:
        """Take tokens for one submission of ``tenant`` in its transaction (``in_transaction``
        stores only; unlimited if it has no bucket)."""
        ...

    def take_outside(self, tenant: str, amount: int = 1) -> Decision:
        """Take tokens with no ledger transaction open (a store that is not the ledger's)."""
        ...

    def refund(self, tenant: str, amount: int = 1) -> None:
        """Give back tokens taken outside a transaction that then did not commit."""
        ...
