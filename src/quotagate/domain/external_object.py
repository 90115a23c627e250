"""The identity of a delivered object: what a target returns and the binding records.

Pure data, here so that the outbox store (``quotagate.store.outbox``) and the
targets (``quotagate.delivery.targets``) speak of the same thing without the
store importing delivery.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExternalObject:
    """The identity of a delivered object, as recorded in the binding."""

    name: str
    uid: str | None
    request_id: str
    created_now: bool = False
    ledger_id: str | None = None
