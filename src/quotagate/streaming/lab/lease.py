"""Lease: a real holder SIGKILLed, a takeover under the *same* name, the stale write refused.

The owner name cannot tell the dead holder from its successor; only the
generation can (docs/delivery.md, leases and fencing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from quotagate.domain.lease import Lease
from quotagate.errors import StaleGeneration
from quotagate.store import migrate
from quotagate.store.engine import create_engine
from quotagate.store.lease import LeaseStore
from quotagate.streaming.lab import lease_holder
from quotagate.streaming.lab.observations import Observation

NAME = "lab-lease"
OWNER = "worker-a"
TTL = 2.0
TAKEOVER_DEADLINE = 60.0


def run(url: str, _workdir: Path) -> list[Observation]:
    engine = create_engine(url)
    try:
        migrate.upgrade(engine)
        store = LeaseStore(engine)
        holder = subprocess.Popen(
            [sys.executable, "-m", lease_holder.__name__, NAME, OWNER, str(TTL)],
            env={**os.environ, lease_holder.DB_VARIABLE: url},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )
        try:
            assert holder.stdout is not None
            said = json.loads(holder.stdout.readline() or '{"acquired": false}')
            if not said.get("acquired"):
                raise RuntimeError(f"the lease holder could not take lease {NAME!r}")
            acquired = store.get(NAME)
            holder.send_signal(signal.SIGKILL)
            status = holder.wait(timeout=30)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
        killed_by = signal.Signals(-status).name if status < 0 else f"exit {status}"
        stale = Lease(NAME, OWNER, int(said["generation"]), acquired.expires_at)

        # The same name comes back and takes over once the dead holder's lease expires.
        deadline = time.monotonic() + TAKEOVER_DEADLINE
        takeover = store.acquire(NAME, OWNER, 60.0)
        while takeover is None and time.monotonic() < deadline:
            time.sleep(0.1)
            takeover = store.acquire(NAME, OWNER, 60.0)
        if takeover is None:
            raise RuntimeError(f"lease {NAME!r} was not taken over within {TAKEOVER_DEADLINE:.0f}s")
        _now, leases = store.list()
        owner_only = sum(1 for lease in leases if lease.name == NAME and lease.owner == OWNER)

        # The killed holder's late write, conditioned on its generation, affects nothing.
        try:
            store.renew(stale, 60.0)
            stale_affected = 1
        except StaleGeneration:
            stale_affected = 0
        final = store.get(NAME)
    finally:
        engine.dispose()
    return [
        Observation("leaseAcquire", {"holder": acquired.owner, "generation": acquired.generation},
                    {"holderPid": said["pid"]}),
        Observation("leaseHolderKilled", {"signal": killed_by}),
        Observation("leaseTakeover", {"owner": takeover.owner, "affected": int(takeover is not None),
                                       "generation": takeover.generation}),
        Observation("leaseOwnerOnlyMatches", {"owner": OWNER, "count": owner_only}),
        Observation("leaseStaleWrite", {"owner": stale.owner, "generation": stale.generation,
                                        "affected": stale_affected}),
        Observation("leaseFinal", {"owner": final.owner, "generation": final.generation}),
    ]
