"""What the preemption tests read and do: a request's state, a tenant's use, a confirmed stop."""

from __future__ import annotations

from quotagate import Quotagate
from quotagate.domain.model import RequestState


def state(gate: Quotagate, request_id: str) -> str:
    return gate.show(request_id).state.value


def used(gate: Quotagate, tenant: str) -> int:
    return next(row["used"] for row in gate.usage()["tenants"] if row["tenant"] == tenant)


def confirm(gate: Quotagate, request_id: str) -> dict[str, int]:
    """The worker's confirmed stop (quotagate.delivery.dispatcher._stopped)."""
    return gate.ledger.release(request_id, RequestState.CANCELLED, stopped=True).released
