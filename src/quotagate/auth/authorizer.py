"""The one authorization decision: may this actor do this operation for this tenant?

The authorizer is handed a ``(tenant, actor, operation)`` triple, the shape
multi-tenant control planes commonly give a pluggable authorizer, so a deployment can replace the
rule (groups from its identity provider, read-only tokens, …) without touching
the HTTP layer. Authentication (which token is this?) is separate and happens
before: the authorizer only ever sees an authenticated :class:`Actor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Operations, named "<area>.<verb>". The HTTP layer asks about exactly these.
TENANT_SET = "tenant.set"
TENANT_READ = "tenant.read"
POOL_SET = "pool.set"
POOL_READ = "pool.read"
COHORT_SET = "cohort.set"
COHORT_READ = "cohort.read"
FAIR_SHARE_SET = "fair_share.set"
FAIR_SHARE_READ = "fair_share.read"
USAGE_READ = "usage.read"
REQUEST_SUBMIT = "request.submit"
REQUEST_READ = "request.read"
REQUEST_LIST = "request.list"
REQUEST_CANCEL = "request.cancel"
REQUEST_COMPLETE = "request.complete"
REQUEST_FAIL = "request.fail"
AUDIT_READ = "audit.read"
TOPIC_CREATE = "topic.create"
TOPIC_READ = "topic.read"
TOPIC_DELETE = "topic.delete"
STREAM_PRODUCE = "stream.produce"
STREAM_READ = "stream.read"

ADMIN_OPERATIONS = frozenset({TENANT_SET, POOL_SET, POOL_READ, COHORT_SET, COHORT_READ,
                              FAIR_SHARE_SET, FAIR_SHARE_READ})
OPERATIONS = frozenset(
    {
        TENANT_SET, TENANT_READ, POOL_SET, POOL_READ, USAGE_READ, REQUEST_SUBMIT, REQUEST_READ,
        REQUEST_LIST, REQUEST_CANCEL, REQUEST_COMPLETE, REQUEST_FAIL, AUDIT_READ,
        TOPIC_CREATE, TOPIC_READ, TOPIC_DELETE, STREAM_PRODUCE, STREAM_READ,
        COHORT_SET, COHORT_READ, FAIR_SHARE_SET, FAIR_SHARE_READ,
    }
)
# Operations on one request: refusing them says "not found", so a tenant cannot
# learn that another tenant's request id exists.
REQUEST_OPERATIONS = frozenset({REQUEST_READ, REQUEST_CANCEL, REQUEST_COMPLETE, REQUEST_FAIL})
# Operations on one topic: refused as "not found" for the same reason (docs/streams.md).
TOPIC_OPERATIONS = frozenset({TOPIC_CREATE, TOPIC_READ, TOPIC_DELETE, STREAM_PRODUCE, STREAM_READ})


# The only operations an executor token may ask for (docs/decisions/310-*).
EXECUTOR_OPERATIONS = frozenset({REQUEST_COMPLETE, REQUEST_FAIL})


@dataclass(frozen=True)
class Actor:
    """An authenticated caller: an admin, a token scoped to one tenant, or an executor.

    An executor token (``executor_target`` set) stands for the executor behind
    one delivery target: it may end work delivered to that target and nothing else.
    """

    token_id: str
    admin: bool
    tenant: str | None = None
    label: str | None = None
    executor_target: str | None = None

    @property
    def executor(self) -> bool:
        return self.executor_target is not None

    @property
    def name(self) -> str:
        """How the audit log names this caller (never the secret)."""
        return f"token:{self.token_id}"


# (tenant the operation concerns or None for platform-wide ones, actor, operation) → allowed?
Authorizer = Callable[[str | None, Actor, str], bool]


def default_authorizer(tenant: str | None, actor: Actor, operation: str) -> bool:
    """Admins may do everything; a tenant token acts on its own tenant only.

    Platform-wide reads (``tenant`` is None, e.g. usage or audit) are allowed to
    tenant tokens because the HTTP layer narrows them to the actor's tenant.
    An executor token may only complete or fail requests.
    """
    if actor.admin:
        return True
    if actor.executor:
        # Which requests it may end is decided in the release transaction, from
        # the request's binding (quotagate.store.authority).
        return operation in EXECUTOR_OPERATIONS
    if operation in ADMIN_OPERATIONS:
        return False
    if tenant is None:
        return operation in (USAGE_READ, AUDIT_READ)
    return actor.tenant == tenant
