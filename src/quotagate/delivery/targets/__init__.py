"""Delivery targets by kind, built from their stored configuration.

Every kind is one entry of :data:`TARGET_KINDS` (the plugin scheme of
``quotagate.plugins``): a :class:`TargetKind` that checks a stored
configuration and builds the target. Built-in kinds are imported on demand:
the kubernetes client is heavy, and a worker that only runs processes should
not pay for it (or need it installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    IdentityMismatch,
    Outcome,
    StopResult,
    Target,
    TargetKind,
)
from quotagate.errors import InvalidInput, quoted
from quotagate.plugins import Plugins

TARGET_KINDS: Plugins[TargetKind] = Plugins({
    kind: f"quotagate.delivery.targets.{kind}:KIND" for kind in ("process", "webhook", "kubernetes", "spark")
})
KINDS = TARGET_KINDS.names()

__all__ = [
    "KINDS",
    "TARGET_KINDS",
    "DeliveryFailed",
    "DeliverySpec",
    "ExternalObject",
    "IdentityMismatch",
    "Outcome",
    "StopResult",
    "Target",
    "TargetKind",
    "build_target",
    "validate_config",
]


def target_kind(kind: str) -> TargetKind:
    found = TARGET_KINDS.get(kind)
    if found is None:
        raise InvalidInput(
            f"target kind {quoted(kind)} is not one of {', '.join(TARGET_KINDS.names())}",
            code="invalid_target_kind",
        )
    return found


def validate_config(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    found = target_kind(kind)
    unknown = sorted(set(config) - found.options) if found.options is not None else []
    if unknown:
        raise InvalidInput(
            f"a {kind} target has no option {', '.join(quoted(key) for key in unknown)} "
            f"(its options: {', '.join(sorted(found.options or ()))}); nothing was changed",
            code="invalid_target_config",
        )
    return found.validate_config(config)


def build_target(kind: str, config: Mapping[str, Any], *, ledger_id: str) -> Target:
    """A target of ``kind``; ``ledger_id`` goes into every object it creates."""
    return target_kind(kind).build(config, ledger_id=ledger_id)
