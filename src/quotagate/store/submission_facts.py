"""What makes a submission acceptable, judged on the facts one query reads.

Shared by submit (quotagate.store.ledger) and the dry run (quotagate.store.views),
so that a dry run refuses exactly what submit would refuse, with the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping

from quotagate.domain.model import Submission
from quotagate.errors import InvalidInput, NotFound, quoted


def require_submittable(
    submission: Submission, facts: Mapping[str, set[str]], *, check_priority: bool = True
) -> None:
    """Raise what submit raises for an unknown tenant, resource or target, or a priority
    above the tenant's maximum (the dry run reports that one as a reason instead).

    ``facts`` are the rows of :func:`quotagate.store.statements.submission_facts_query`.
    """
    if "tenant" not in facts:
        raise NotFound(
            f"tenant {quoted(submission.tenant)} does not exist; create it with "
            "'quotagate tenant set'",
            code="unknown_tenant",
        )
    unknown = sorted(set(submission.cost) - facts.get("resource", set()))
    if unknown:
        raise InvalidInput(
            f"unknown resource {', '.join(map(repr, unknown))}: no pool offers it",
            code="unknown_resource",
        )
    if submission.target is not None and "target" not in facts:
        raise NotFound(f"target {quoted(submission.target)} does not exist", code="unknown_target")
    if "default_closed" in facts:
        raise NotFound(
            "the request names no target and the default target does not serve tenant "
            f"{quoted(submission.tenant)}; name a target",
            code="no_default_target",
        )
    maximum = facts.get("max_priority")
    if check_priority and maximum and submission.priority > int(next(iter(maximum))):
        raise InvalidInput(
            f"priority {submission.priority} is above tenant {quoted(submission.tenant)}'s maximum "
            f"{next(iter(maximum))}; nothing was submitted",
            code="priority_above_max",
        )
