"""The lab's lease holder: takes the lease, says its generation, renews until killed.

``python -m quotagate.streaming.lab.lease_holder NAME OWNER TTL`` with the
database URL in ``$QUOTAGATE_LAB_LEASE_DB`` (kept off the command line).
"""

from __future__ import annotations

import json
import os
import sys
import time

from quotagate.store.engine import create_engine
from quotagate.store.lease import LeaseStore

DB_VARIABLE = "QUOTAGATE_LAB_LEASE_DB"


def main() -> None:
    name, owner, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    store = LeaseStore(create_engine(os.environ[DB_VARIABLE]))
    lease = store.acquire(name, owner, ttl)
    if lease is None:
        print(json.dumps({"acquired": False}), flush=True)
        sys.exit(1)
    print(json.dumps({"acquired": True, "generation": lease.generation, "pid": os.getpid()}), flush=True)
    # A live holder renews, as a delivery worker does; only SIGKILL stops it here.
    while True:
        lease = store.renew(lease, ttl)
        time.sleep(ttl / 4)


if __name__ == "__main__":
    main()
