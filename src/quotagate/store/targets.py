"""The rows behind delivery targets (``qg_target``, ``qg_target_tenant``), one of them the default.

The configuration written here is already checked by its kind
(``quotagate.delivery.registry.TargetStore`` does that, with the target plugins).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import validate_name
from quotagate.errors import NotFound, quoted
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import reading, run_transaction

__all__ = ["TargetConfig", "TargetRecords"]

_target = schema.delivery_target
_target_tenant = schema.target_tenant


@dataclass(frozen=True)
class TargetConfig:
    name: str
    kind: str
    config: dict[str, Any]
    is_default: bool
    # The only tenants that may name this target; empty: every tenant.
    tenants: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "config": self.config,
                "default": self.is_default, "tenants": list(self.tenants) or None}


def _from_row(row: Any, tenants: Sequence[str] = ()) -> TargetConfig:
    return TargetConfig(row.name, row.kind, json.loads(row.config), bool(row.is_default),
                        tuple(sorted(tenants)))


def _tenants_of(connection: sa.Connection, names: Sequence[str]) -> dict[str, list[str]]:
    rows = connection.execute(
        sa.select(_target_tenant.c.target, _target_tenant.c.tenant)
        .where(_target_tenant.c.target.in_(names))
    ).all()
    found: dict[str, list[str]] = {}
    for target, tenant in rows:
        found.setdefault(target, []).append(tenant)
    return found


class TargetRecords:
    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()

    def write(
        self,
        name: str,
        kind: str,
        checked: dict[str, Any],
        *,
        default: bool = False,
        tenants: Sequence[str] | None = None,
        actor: str = "admin",
    ) -> TargetConfig:
        """Create or replace a target whose ``checked`` configuration its kind accepted.

        ``default`` makes it the only default.

        A target that is the default stays so when replaced without ``default``.
        ``tenants`` limits the target to those tenants (an empty sequence: every
        tenant again); None keeps what the target had, so replacing its
        configuration never opens a limited target to everyone
        (docs/decisions/311-target-tenants.md).
        """
        validate_name(name, "target")
        text = json.dumps(checked, sort_keys=True)
        wanted = None
        if tenants is not None:
            wanted = sorted(set(tenants))
            for tenant in wanted:
                validate_name(tenant, "tenant")

        def work(connection: sa.Connection) -> TargetConfig:
            existing = connection.execute(
                sa.select(_target).where(_target.c.name == name).with_for_update()
            ).first()
            is_default = default or bool(existing is not None and existing.is_default)
            if default:
                connection.execute(
                    _target.update().where(_target.c.name != name).values(is_default=False)
                )
            values = {"kind": kind, "config": text, "is_default": is_default}
            if existing is None:
                connection.execute(_target.insert().values(name=name, **values))
            else:
                connection.execute(_target.update().where(_target.c.name == name).values(**values))
            if wanted is not None:
                connection.execute(_target_tenant.delete().where(_target_tenant.c.target == name))
                if wanted:
                    connection.execute(_target_tenant.insert(),
                                       [{"target": name, "tenant": tenant} for tenant in wanted])
                kept = wanted
            else:
                kept = _tenants_of(connection, [name]).get(name, [])
            scope = f" tenants={','.join(kept)}" if kept else ""
            record(connection, self.clock.now(), AuditEntry(
                actor, "target.set", "ok", None, f"target/{name}",
                f"kind={kind} default={is_default}{scope}",
            ))
            return TargetConfig(name, kind, checked, is_default, tuple(kept))

        return run_transaction(self.engine, work)

    def list(self) -> list[TargetConfig]:
        with reading(self.engine) as connection:
            rows = connection.execute(sa.select(_target).order_by(_target.c.name)).all()
            tenants = _tenants_of(connection, [row.name for row in rows]) if rows else {}
        return [_from_row(row, tenants.get(row.name, ())) for row in rows]

    def resolve(self, name: str | None) -> TargetConfig:
        """The named target, or the default one when the request named none."""
        with reading(self.engine) as connection:
            if name is None:
                row = connection.execute(
                    sa.select(_target).where(_target.c.is_default == sa.true())
                    .order_by(_target.c.name).limit(1)
                ).first()
                if row is None:
                    raise NotFound(
                        "the request names no target and no default target is configured; "
                        "set one with 'quotagate target set NAME --kind … --default'",
                        code="no_default_target",
                    )
            else:
                row = connection.execute(sa.select(_target).where(_target.c.name == name)).first()
                if row is None:
                    raise NotFound(f"target {quoted(name)} does not exist", code="unknown_target")
            tenants = _tenants_of(connection, [row.name]).get(row.name, ())
        return _from_row(row, tenants)
