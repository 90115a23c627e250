"""Deterministic external names: the same request always maps to the same object.

This is what makes a lost reply recoverable (docs/invariants.md, 5): a retry does
not invent a new name, it finds the object the lost attempt created.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 63
_HASH_LENGTH = 10
_INVALID = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def digest(ledger_id: str, tenant: str, request_id: str, length: int = _HASH_LENGTH,
           attempt: int = 1) -> str:
    # The first attempt hashes what every name hashed before attempts existed, so the
    # objects of requests delivered before keep their names.
    key = f"{ledger_id}/{tenant}/{request_id}" + (f"/{attempt}" if attempt > 1 else "")
    return hashlib.sha256(key.encode()).hexdigest()[:length]


def external_name(ledger_id: str, tenant: str, request_id: str, attempt: int = 1) -> str:
    """A DNS-1123 label (≤ 63 characters) unique to (ledger, tenant, request id, attempt).

    The readable part is lossy (case folded, odd characters replaced, long ids
    cut), so a hash of the exact triple is always appended: ``A_1`` and ``a-1``,
    or two long ids sharing a prefix, still get different names, and two
    ledgers delivering to one place do not collide on the same request id.
    A requeued request's later attempts (``attempt`` > 1) get names of their own,
    ``…-a2-<hash>``: a new attempt never finds the stopped one's object
    (docs/decisions/720).
    """
    suffix = digest(ledger_id, tenant, request_id, attempt=attempt)
    if attempt > 1:
        suffix = f"a{attempt}-{suffix}"
    readable = _INVALID.sub("-", f"{tenant}-{request_id}".lower()).strip("-")
    readable = readable[: MAX_NAME - len(suffix) - 1].rstrip("-")
    return f"{readable}-{suffix}" if readable else f"qg-{suffix}"


def label_value(text: str) -> str:
    """``text`` itself if it is a valid Kubernetes label value, else a stable hash of it."""
    if _LABEL_VALUE.fullmatch(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]
