"""``serve --prune-older-than``: retention as a background loop (off by default).

Every pass prunes at most a few batches, then yields: one server's retention
never holds the ledger for long, and several servers pruning the same ledger
only share the work (each batch locks its own candidate rows).
"""

from __future__ import annotations

import logging
import threading

from quotagate.app import Quotagate
from quotagate.errors import StoreUnavailable

log = logging.getLogger("quotagate.serve")

# Batches per pass, and the pause between passes while there is a backlog.
BATCHES_PER_PASS = 4
BACKLOG_PAUSE = 1.0


class PruneLoop:
    def __init__(self, gate: Quotagate, older_than: float, *, interval: float = 600.0) -> None:
        self.gate = gate
        self.older_than = older_than
        self.interval = interval

    def run_once(self) -> bool:
        """One pass; True when nothing past retention is left."""
        totals = self.gate.prune(self.older_than, max_batches=BATCHES_PER_PASS)
        if totals.requests or totals.audit_entries:
            log.info("pruned %d requests and %d audit entries past retention",
                     totals.requests, totals.audit_entries)
        return totals.done

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                done = self.run_once()
            except StoreUnavailable:
                log.warning("retention: the ledger database cannot be reached; retrying")
                done = True
            except Exception:
                # Keep serving: a failed prune pass only delays retention.
                log.exception("retention pass failed")
                done = True
            stop.wait(self.interval if done else BACKLOG_PAUSE)
