"""How often a refused authorization is written to the audit log.

Every 403 used to write one audit row: a token hammering an operation it may not
do could grow the ledger without bound. The refusal is still counted every time
(``quotagate_auth_refusals``) and still answered the same way, but the audit
log gets at most one row per actor and operation per window; the row written
after a quiet spell says how many refusals it stands for
(docs/decisions/803-bounded-refusals.md).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["DEFAULT_WINDOW", "RefusalThrottle", "refusal_reason"]

DEFAULT_WINDOW = 60.0
# Actors are authenticated tokens, operations a fixed list: this many keys is
# far more than a real installation has, and caps the memory if not.
MAX_KEYS = 10_000


class RefusalThrottle:
    def __init__(self, window: float = DEFAULT_WINDOW, *, max_keys: int = MAX_KEYS) -> None:
        self.window = window
        self.max_keys = max_keys
        # (actor, operation) -> (time of the last row written, refusals not written since)
        self._seen: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, actor: str, operation: str, now: float) -> int | None:
        """None: only count this refusal. Otherwise write a row standing for this many."""
        key = (actor, operation)
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.window:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            self._seen[key] = (now, 0)
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
            return 1 + (last[1] if last is not None else 0)


def refusal_reason(count: int, window: float) -> str:
    if count == 1:
        return "not authorized"
    return (f"not authorized ({count} refusals: {count - 1} more of this operation by this "
            f"actor since its last entry, within {window:g}s windows)")
