"""Delivery targets configured by name, one of them the default; each configuration checked by its kind.

The rows live in the store (``quotagate.store.targets``); what a kind accepts is
the target plugin's to say (``quotagate.delivery.targets.TARGET_KINDS``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from quotagate.delivery.targets import validate_config
from quotagate.domain.clock import Clock
from quotagate.domain.model import validate_name
from quotagate.store.targets import TargetConfig, TargetRecords

__all__ = ["TargetConfig", "TargetStore"]


class TargetStore:
    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.records = TargetRecords(engine, clock=clock)

    def set(
        self,
        name: str,
        kind: str,
        config: Mapping[str, Any],
        *,
        default: bool = False,
        tenants: Sequence[str] | None = None,
        actor: str = "admin",
    ) -> TargetConfig:
        """Create or replace a target; ``default`` makes it the only default.

        A target that is the default stays so when replaced without ``default``.
        ``tenants`` limits the target to those tenants (an empty sequence: every
        tenant again); None keeps what the target had, so replacing its
        configuration never opens a limited target to everyone
        (docs/decisions/311-target-tenants.md). A configuration its kind refuses
        changes nothing.
        """
        validate_name(name, "target")
        checked = validate_config(kind, config)
        return self.records.write(name, kind, checked, default=default, tenants=tenants, actor=actor)

    def list(self) -> list[TargetConfig]:
        return self.records.list()

    def resolve(self, name: str | None) -> TargetConfig:
        """The named target, or the default one when the request named none."""
        return self.records.resolve(name)
