"""The lab's observation lines: a name and measured fields, printed in a fixed order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Observation:
    """One line such as ``quotaRemaining tenantA=2 tenantB=2 requestedEach=3``."""

    name: str
    fields: dict[str, Any]
    # Measured too, but only in --json: they would lengthen the lines the docs quote.
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return " ".join([self.name, *(f"{key}={_text(value)}" for key, value in self.fields.items())])

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, **self.details}


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
