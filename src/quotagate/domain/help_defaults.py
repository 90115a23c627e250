"""Names and defaults the CLI prints in its help, free of imports.

Their owners (``store.listing``, ``store.retention``, ``rate.stores``, ``streams.connection``)
import them from here, so that ``quotagate --help`` can show them without importing those
packages and SQLAlchemy with them (docs/decisions/241).
"""

from __future__ import annotations

# The most items one page of a listing holds (store.listing).
MAX_PAGE = 500
# Finished requests deleted per transaction by a prune (store.retention).
PRUNE_BATCH = 500
# Where token buckets live, if not in the ledger database (rate.stores).
RATE_STORE_VARIABLE = "QUOTAGATE_RATE_STORE"
# The shared Redis of the streams (streams.connection).
REDIS_VARIABLE = "QUOTAGATE_REDIS"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
