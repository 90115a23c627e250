"""Why a waiting request is not admitted yet: the verdict, from a usage snapshot.

Pure, so that ``explain`` (one request) and the dashboard's queue view (the
head of the whole queue, from one read) give the same reason for the same state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quotagate.domain.model import Cost
from quotagate.domain.placement import blocking_resources, fits, fits_when_empty

Usage = Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class WaitingReason:
    tenant_blocked_by: list[dict[str, int | str]] = field(default_factory=list)
    pools_blocked: dict[str, list[str]] = field(default_factory=dict)
    fitting_pools: list[str] = field(default_factory=list)
    reason: str = ""


def explain_waiting(
    cost: Cost,
    tenant_usage: Usage,
    pools: Mapping[str, Usage],
    tenant_position: int,
    admission_window: int,
) -> WaitingReason:
    """The reason a request of ``cost`` still waits, given its tenant's and the pools' usage."""
    tenant_blocks: list[dict[str, int | str]] = [
        {"resource": resource, "need": cost[resource],
         "used": tenant_usage.get(resource, (0, 0))[0],
         "cap": tenant_usage.get(resource, (0, 0))[1]}
        for resource in blocking_resources(cost, tenant_usage)
    ]
    pool_blocks = {
        name: blocking_resources(cost, usage) for name, usage in sorted(pools.items())
        if not fits(cost, usage)
    }
    fitting_pools = sorted(name for name, usage in pools.items() if fits(cost, usage))
    if tenant_blocks:
        verdict = "tenant quota: " + ", ".join(_tenant_block(block) for block in tenant_blocks)
        if any(int(block["need"]) > int(block["cap"]) for block in tenant_blocks):
            # Its quota was lowered under its cost after it was accepted (docs/decisions/809).
            verdict += "; it cannot be admitted until the quota is raised"
    elif not fitting_pools:
        verdict = "no pool has room: " + "; ".join(
            f"{name} lacks {', '.join(resources)}" for name, resources in pool_blocks.items()
        ) if pool_blocks else "no pool exists"
        if pool_blocks and not any(
            fits_when_empty(cost, {resource: cap for resource, (_, cap) in usage.items()})
            for usage in pools.values()
        ):
            verdict += ("; no pool could hold it even empty: it cannot be admitted until a "
                        "pool is given more capacity")
    elif tenant_position > admission_window:
        verdict = (
            f"fits, but is number {tenant_position} in its tenant's queue; admission looks "
            f"at the first {admission_window} of each tenant"
        )
    else:
        verdict = "fits now; it will be admitted by the next admission pass"
    return WaitingReason(tenant_blocks, pool_blocks, fitting_pools, verdict)


def _tenant_block(block: Mapping[str, int | str]) -> str:
    need, used, cap = int(block["need"]), int(block["used"]), int(block["cap"])
    if need > cap:
        return f"{block['resource']} needs {need}, more than its whole quota of {cap}"
    # A cap lowered below use (allowed: docs/admission.md, Caps) leaves no room, not
    # negative room: "-1 of 1 left" read as a bug.
    text = f"{block['resource']} needs {need}, {max(0, cap - used)} of {cap} left"
    return text + (f" (used {used} is over the cap)" if used > cap else "")

