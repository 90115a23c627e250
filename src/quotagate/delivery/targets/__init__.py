"""Delivery targets by kind, built from their stored configuration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    IdentityMismatch,
    Outcome,
    StopResult,
    Target,
)
from quotagate.errors import InvalidInput

KINDS = ("process", "webhook", "kubernetes", "spark")

__all__ = [
    "KINDS",
    "DeliveryFailed",
    "DeliverySpec",
    "ExternalObject",
    "IdentityMismatch",
    "Outcome",
    "StopResult",
    "Target",
    "build_target",
    "validate_config",
]


def _module(kind: str) -> Any:
    # Imported on demand: the kubernetes client is heavy, and a worker that
    # only runs processes should not pay for it (or need it installed).
    if kind == "process":
        from quotagate.delivery.targets import process
        return process
    if kind == "webhook":
        from quotagate.delivery.targets import webhook
        return webhook
    if kind == "kubernetes":
        from quotagate.delivery.targets import kubernetes
        return kubernetes
    if kind == "spark":
        from quotagate.delivery.targets import spark
        return spark
    raise InvalidInput(
        f"target kind {kind!r} is not one of {', '.join(KINDS)}", code="invalid_target_kind"
    )


def validate_config(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    validate: Callable[[Mapping[str, Any]], dict[str, Any]] = _module(kind).validate_config
    return validate(config)


def build_target(kind: str, config: Mapping[str, Any], *, ledger_id: str) -> Target:
    """A target of ``kind``; ``ledger_id`` goes into every object it creates."""
    module = _module(kind)
    classes: dict[str, Any] = {
        "process": "ProcessTarget", "webhook": "WebhookTarget", "kubernetes": "KubernetesTarget",
        "spark": "SparkTarget",
    }
    target: Target = getattr(module, classes[kind])(config, ledger_id=ledger_id)
    return target
