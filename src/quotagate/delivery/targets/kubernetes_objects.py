"""What a kubernetes target's objects look like, and what they say: pure functions, no I/O.

The body created per delivery (labels and annotations carrying the ledger id,
the request id and the fencing token), the identity read back from an object,
and what its status means: ended (completed or failed), suspended, or
replaced by another object of the same name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quotagate.delivery.naming import label_value
from quotagate.delivery.targets.base import DeliverySpec, ExternalObject, Outcome

LABEL_REQUEST_ID = "quotagate.io/request-id"
LABEL_TENANT = "quotagate.io/tenant"
LABEL_LEDGER = "quotagate.io/ledger"
ANNOTATION_LEDGER_ID = "quotagate.io/ledger-id"
ANNOTATION_REQUEST_ID = "quotagate.io/request-id"
ANNOTATION_FENCING_TOKEN = "quotagate.io/fencing-token"
# The delivery attempt of a requeued request (docs/decisions/720); 1 for most.
ANNOTATION_ATTEMPT = "quotagate.io/attempt"
COMPLETED_PHASES = frozenset({"Completed", "Succeeded"})
FAILED_PHASES = frozenset({"Failed"})
ENDED_PHASES = COMPLETED_PHASES | FAILED_PHASES
SUSPENDED_PHASE = "Suspended"


def body(spec: DeliverySpec, config: Mapping[str, Any]) -> dict[str, Any]:
    """The object created for one delivery: identity in labels and annotations, the work in spec."""
    return {
        "apiVersion": f"{config['group']}/{config['version']}",
        "kind": config["resource_kind"],
        "metadata": {
            "name": spec.external_name,
            "namespace": config["namespace"],
            "labels": {
                LABEL_REQUEST_ID: label_value(spec.request_id),
                LABEL_TENANT: label_value(spec.tenant),
                LABEL_LEDGER: label_value(spec.ledger_id),
                "app.kubernetes.io/managed-by": "quotagate",
            },
            "annotations": {
                ANNOTATION_REQUEST_ID: spec.request_id,
                ANNOTATION_LEDGER_ID: spec.ledger_id,
                ANNOTATION_FENCING_TOKEN: str(spec.fencing_token),
                ANNOTATION_ATTEMPT: str(spec.attempt),
            },
        },
        "spec": {
            "requestId": spec.request_id,
            "tenant": spec.tenant,
            "cost": dict(spec.cost),
            "payload": spec.payload,
        },
    }


def identity(found: Mapping[str, Any]) -> ExternalObject:
    """Whose object this is, as its labels and annotations say (both must agree)."""
    metadata = found.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    request_id = annotations.get(ANNOTATION_REQUEST_ID) or labels.get(LABEL_REQUEST_ID) or ""
    if labels.get(LABEL_REQUEST_ID) != label_value(str(request_id)):
        request_id = f"(label {labels.get(LABEL_REQUEST_ID)!r})"
    ledger_id = annotations.get(ANNOTATION_LEDGER_ID)
    if ledger_id is not None and labels.get(LABEL_LEDGER) != label_value(str(ledger_id)):
        ledger_id = f"(label {labels.get(LABEL_LEDGER)!r})"
    return ExternalObject(name=str(metadata.get("name")), uid=metadata.get("uid"),
                          request_id=str(request_id), ledger_id=ledger_id)


def same(found: Mapping[str, Any], obtained: ExternalObject) -> bool:
    """Is ``found`` the very object that was bound (same UID), not a later one of that name?"""
    uid = (found.get("metadata") or {}).get("uid")
    return obtained.uid is None or uid == obtained.uid


def gone_reason(found: Mapping[str, Any] | None, obtained: ExternalObject) -> str:
    if found is None:
        return f"object {obtained.name!r} was deleted after it was bound"
    return (f"object {obtained.name!r} was deleted after it was bound and replaced by another "
            f"(uid {(found.get('metadata') or {}).get('uid')}, bound {obtained.uid})")


def phase_outcome(found: Mapping[str, Any]) -> Outcome | None:
    status = found.get("status") or {}
    phase = status.get("phase")
    if phase in COMPLETED_PHASES:
        return Outcome(completed=True)
    if phase in FAILED_PHASES:
        return Outcome(completed=False, reason=str(status.get("message") or "object failed"))
    return None


def suspension_confirmed(found: Mapping[str, Any]) -> bool:
    """status.phase Suspended, reported for the generation that asked for it (if it says)."""
    status, metadata = found.get("status") or {}, found.get("metadata") or {}
    if status.get("phase") != SUSPENDED_PHASE or (found.get("spec") or {}).get("suspend") is not True:
        return False
    observed, generation = status.get("observedGeneration"), metadata.get("generation")
    return observed is None or generation is None or int(observed) >= int(generation)


def fencing_token(metadata: Mapping[str, Any]) -> int | None:
    try:
        return int((metadata.get("annotations") or {})[ANNOTATION_FENCING_TOKEN])
    except (KeyError, TypeError, ValueError):
        return None
