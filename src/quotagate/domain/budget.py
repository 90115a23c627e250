"""Budgets: resource-hours per rolling window, pure (docs/fair-sharing.md#budgets).

A budget ``gpu=100h/30d`` lets a tenant's running work hold, over any 30 days,
100 GPU-hours: cost * seconds held, from admission to release. Usage is kept in
hour buckets (docs/decisions/710): the window counts every bucket that overlaps
it whole, so the check can only over-count, by at most the oldest hour.

Admission asks, per budgeted resource, that what the window has spent, plus
what running work has reserved (cost * its max-runtime), plus the new
request's reservation, stays within the budget (:meth:`Budgets.fits`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from quotagate.errors import InvalidInput, quoted

# A request's cost, as quotagate.domain.model has it (not imported: model imports this).
Cost = Mapping[str, int]

# The width of a usage bucket, seconds (docs/decisions/710).
BUCKET = 3600
# What a request without a max-runtime needs left: one resource-second.
SOMETHING_LEFT = 1
# The longest max-runtime accepted: a year.
MAX_RUNTIME = 366 * 86400
# The longest grace past a max-runtime before its stop begins: a week. Longer is no
# limit at all, and a typo (seconds meant as minutes) should be refused, not kept.
MAX_GRACE = 7 * 86400
# The longest budget window: 10,000 hours (416 days).
MAX_WINDOW = 10_000 * 3600
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# What a CLI duration, a budget's amount and its window look like; the HTTP API
# states the same patterns (quotagate.http.models).
DURATION_PATTERN = "[1-9][0-9]{0,5}[smhd]"
WINDOW_PATTERN = "(?:[1-9][0-9]{0,3}h|[1-9][0-9]?d|[1-3][0-9]{2}d|40[0-9]d|41[0-6]d)"
BUDGET_PATTERN = f"{DURATION_PATTERN}/{WINDOW_PATTERN}"
_DURATION = re.compile(DURATION_PATTERN)
# Whole seconds as the CLI passes them ("3600"); ASCII digits only, and few enough that
# int() never meets Python's limit on digits (a ValueError, not a refusal).
_WHOLE_SECONDS = re.compile("[0-9]{1,12}")
_BUDGET = re.compile(f"({DURATION_PATTERN})/({WINDOW_PATTERN})")


def _seconds(text: str) -> int:
    return int(text[:-1]) * _UNITS[text[-1]]


def parse_duration(value: object, *, what: str) -> int:
    """A max-runtime: ``90s``, ``30m``, ``2h``, ``1d``, or whole seconds; 1 s to 366 days."""
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str) and _WHOLE_SECONDS.fullmatch(value):
        seconds = int(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value):
        seconds = _seconds(value)
    else:
        raise InvalidInput(
            f"{what} must be a duration like 90s, 30m or 2h, or whole seconds, got {quoted(value)}",
            code=f"invalid_{what}")
    if seconds < 1 or seconds > MAX_RUNTIME:
        raise InvalidInput(f"{what} must be between 1 second and 366 days, got {quoted(value)}",
                           code=f"invalid_{what}")
    return seconds


def parse_grace(value: object) -> int:
    """A tenant's grace past the max-runtime (docs/decisions/715): whole seconds (``0``:
    none, ``300``) or a duration (``5m``), at most a week."""
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str) and _WHOLE_SECONDS.fullmatch(value):
        seconds = int(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value):
        seconds = _seconds(value)
    else:
        raise InvalidInput(
            f"max_runtime_grace must be whole seconds, 0 or more (0: none), or a duration "
            f"like 90s or 5m, got {quoted(value)}", code="invalid_max_runtime_grace")
    if seconds < 0 or seconds > MAX_GRACE:
        raise InvalidInput(f"max_runtime_grace must be between 0 and {MAX_GRACE} seconds "
                           f"(a week), got {quoted(value)}", code="invalid_max_runtime_grace")
    return seconds


@dataclass(frozen=True)
class BudgetLimit:
    """``amount`` resource-seconds per rolling ``window`` seconds."""

    amount: int
    window: int

    def describe(self) -> str:
        return f"{format_duration(self.amount)}/{format_duration(self.window)}"


def parse_budget(text: object) -> BudgetLimit:
    """``100h/30d``: resource-time (s, m, h, d) per window of whole hours or days (≤ 416 d)."""
    match = _BUDGET.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(
            f"budget must look like 100h/30d (an amount in s, m, h or d per a window in h or "
            f"d, at most 416d), got {quoted(text)}", code="invalid_budget")
    return BudgetLimit(_seconds(match.group(1)), _seconds(match.group(2)))


def format_duration(seconds: float) -> str:
    """The largest unit that divides ``seconds`` exactly: ``100h``, ``30d``, ``90s``."""
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    for unit in ("d", "h", "m"):
        if whole and whole % _UNITS[unit] == 0:
            return f"{whole // _UNITS[unit]}{unit}"
    return f"{whole}s"


def buckets(start: float, end: float) -> Iterator[tuple[int, float]]:
    """The hour buckets ``[start, end)`` overlaps, with the seconds it spends in each.

    Released usage is stored per bucket as ``ceil(cost * seconds)``: whole
    resource-seconds, rounded up (at most one per bucket more than held).
    """
    if end <= start:
        return
    bucket = math.floor(start / BUCKET) * BUCKET
    while bucket < end:
        seconds = min(end, bucket + BUCKET) - max(start, bucket)
        if seconds > 0:
            yield bucket, seconds
        bucket += BUCKET


def window_start(now: float, window: int) -> int:
    """The first bucket the window ``[now - window, now]`` counts (it counts it whole)."""
    return math.floor((now - window) / BUCKET) * BUCKET


# The bucket that carries the usage of every bucket folded away (docs/decisions/713):
# far before any window, so no window counts it, while the buckets' total still
# equals ``accrued``.
CARRIED = -(2**62)


def fold_before(now: float, window: int) -> int:
    """The buckets before this one no window of ``window`` counts any more, now or later.

    One bucket earlier than the window's first, so a process whose clock runs an
    hour behind this one's still finds every bucket it counts.
    """
    return window_start(now, window) - BUCKET


def reservation(cost: Cost, runtime: int | None) -> dict[str, int]:
    """What running work reserves per resource: cost * its max-runtime (none: nothing)."""
    if not runtime:
        return {}
    return {resource: amount * runtime for resource, amount in cost.items()}


def overrun_reason(runtime: int, grace: int = 0) -> str:
    """Why work stopped at its max-runtime is stopped (state ``timing_out``/``timed_out``).

    Seconds, spelled as the HTTP API's ``max_runtime`` is, so the reason names
    the very number the request (or its tenant's default) declared, and the
    tenant's grace past it when it had one (docs/decisions/715).
    """
    if grace:
        return f"max_runtime {runtime}s exceeded (grace {grace}s)"
    return f"max_runtime {runtime}s exceeded"


@dataclass(frozen=True)
class BudgetState:
    """One (tenant, resource) budget as admission sees it.

    ``spent``: closed usage in the window's buckets; ``accrued``: all closed
    usage ever, which the charge compares with the row's to count releases
    committed since this was read (quotagate.store.budgets).
    """

    amount: int
    window: int
    reserved: int
    spent: int
    accrued: int

    @property
    def left(self) -> int:
        return self.amount - self.spent - self.reserved


@dataclass(frozen=True)
class BudgetBlock:
    resource: str
    needed: int
    available: int


class Budgets:
    """The budgets of one snapshot, charged as a plan places requests (a copy per plan)."""

    def __init__(self, states: Mapping[tuple[str, str], BudgetState] | None = None) -> None:
        self.states: dict[tuple[str, str], BudgetState] = dict(states or {})
        self.tenants = {tenant for tenant, _resource in self.states}

    def copy(self) -> Budgets:
        return Budgets(self.states)

    def __bool__(self) -> bool:
        return bool(self.states)

    def blocking(self, tenant: str, cost: Cost, runtime: int | None) -> list[BudgetBlock]:
        """The budgeted resources the request's reservation does not fit in.

        A request without a max-runtime reserves nothing ahead and needs only
        that something is left (docs/decisions/711).
        """
        if tenant not in self.tenants:
            return []
        needs = reservation(cost, runtime)
        blocks = []
        for resource in cost:
            state = self.states.get((tenant, resource))
            if state is None:
                continue
            needed = needs.get(resource, 0)
            left = state.left
            # The same integer condition the budget row's UPDATE checks (store.budgets).
            if left < max(needed, SOMETHING_LEFT):
                blocks.append(BudgetBlock(resource, needed, max(0, left)))
        return blocks

    def fits(self, tenant: str, cost: Cost, runtime: int | None) -> bool:
        return tenant not in self.tenants or not self.blocking(tenant, cost, runtime)

    def charge(self, tenant: str, cost: Cost, runtime: int | None) -> None:
        if tenant not in self.tenants:
            return
        for resource, amount in reservation(cost, runtime).items():
            state = self.states.get((tenant, resource))
            if state is not None:
                self.states[tenant, resource] = replace(state, reserved=state.reserved + amount)
