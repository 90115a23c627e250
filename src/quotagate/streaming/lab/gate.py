"""Gate: a submission refused at zero tokens leaves a rejected row and no business row;
after a top-up the same request is accepted, runs, and writes its one row.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from quotagate.app import Quotagate
from quotagate.domain.model import RequestState
from quotagate.errors import RateLimited
from quotagate.streaming.lab.observations import Observation
from quotagate.streaming.sink_store import SinkStore

TENANT = "tenant-a"
CAPACITY = 3
REQUEST = "gated-job"
BUSINESS_TABLE = "lab_business"
KEYS = ["request_id"]


def run(url: str, _workdir: Path) -> list[Observation]:
    with Quotagate.connect(url) as gate, SinkStore(url) as business:
        gate.init()
        gate.set_pool("lab-pool", {"slots": 100})
        gate.set_tenant(TENANT, {"slots": 100})
        gate.set_rate(TENANT, {"capacity": CAPACITY, "refill_per_second": 0})
        # Earlier work of the tenant spends its tokens.
        for index in range(CAPACITY):
            gate.submit(f"earlier-job-{index}", TENANT, {"slots": 1})
        with contextlib.suppress(RateLimited):  # the refusal is read back from the ledger below
            gate.submit(REQUEST, TENANT, {"slots": 1})
        blocked = gate.show(REQUEST).state
        tokens_at_block = _tokens(gate)
        # The executor only ever sees admitted work; nothing was admitted for it.
        _execute_admitted(gate, business)
        rows_blocked = _business_rows(business)

        gate.add_tokens(TENANT, CAPACITY)
        gate.submit(REQUEST, TENANT, {"slots": 1})
        recovered = gate.show(REQUEST).state
        tokens_after = _tokens(gate)
        _execute_admitted(gate, business)
        rows_accepted = _business_rows(business)
        final = gate.show(REQUEST).state
    return [
        Observation("quotaGate", {"blockedStatus": _status(blocked), "tokensAtBlock": tokens_at_block,
                                  "businessRowsBlocked": rows_blocked}, {"state": blocked.value}),
        Observation("quotaGate", {"recoveredStatus": _status(recovered), "tokensAfter": tokens_after,
                                  "businessRowsAccepted": rows_accepted},
                    {"state": recovered.value, "finalState": final.value}),
    ]


def _status(state: RequestState) -> str:
    return "REJECTED" if state == RequestState.REJECTED else "ACCEPTED"


def _tokens(gate: Quotagate) -> float:
    status = gate.rate_status(TENANT)
    if status is None:
        raise AssertionError(f"tenant {TENANT!r} lost its bucket during the lab")
    return float(status["tokens"])


def _execute_admitted(gate: Quotagate, business: SinkStore) -> None:
    """Admit what fits and run only the request under study: one business row, then complete."""
    gate.admit_until_idle()
    if gate.show(REQUEST).state != RequestState.RESERVED:
        return
    table = business.business_table(BUSINESS_TABLE, KEYS, _columns)
    business.write_batch(f"lab-gate/{REQUEST}", 0, table, KEYS, lambda: [{"request_id": REQUEST, "tenant": TENANT}])
    gate.complete(REQUEST)


def _columns() -> list[sa.Column[Any]]:
    return [sa.Column("request_id", sa.String(128), nullable=False), sa.Column("tenant", sa.String(63))]


def _business_rows(business: SinkStore) -> int:
    return business.count_rows(BUSINESS_TABLE)
