"""The worker's defaults, apart from the dispatcher so that ``quotagate --help`` shows them
without importing it (and SQLAlchemy with it; docs/decisions/241)."""

from __future__ import annotations

DEFAULT_LEASE_TTL = 15.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_CONCURRENCY = 32
DEFAULT_BATCH = 64
# Below Kubernetes' default terminationGracePeriodSeconds (30): the worker, not the
# supervisor's SIGKILL, ends a stop that overruns (docs/decisions/906).
DEFAULT_EXIT_GRACE = 20.0
