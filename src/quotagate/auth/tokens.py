"""API tokens: shown once at creation, stored only as a hash, revocable.

A token reads ``qg_<id>_<secret>``. The id is public (it names the token in
listings and the audit log) and finds the row; the secret is 256 random bits of
which only the SHA-256 is stored. A plain hash is enough here, unlike for
passwords: the secret is random and long, so there is nothing to guess.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.auth.authorizer import Actor
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import validate_name
from quotagate.errors import InvalidInput, NotFound, Unauthorized, quoted
from quotagate.store import api_tokens
from quotagate.store.api_tokens import TokenRow
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import run_transaction

PREFIX = "qg"
_ID_BYTES = 8
_SECRET_BYTES = 32
_MAX_LABEL = 128
# Compared against when the id is unknown, so both paths do the same work.
_TOKEN_ID = re.compile(r"[0-9a-f]{1,32}")
_DUMMY_HASH = hashlib.sha256(b"no such token").hexdigest()


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(text: str) -> tuple[str, str]:
    """``qg_<id>_<secret>`` → ``(id, secret)``, or Unauthorized."""
    prefix, _, rest = text.partition("_")
    token_id, _, secret = rest.partition("_")
    if (
        prefix != PREFIX or not secret or len(secret) > 256
        or not _TOKEN_ID.fullmatch(token_id)
    ):
        raise Unauthorized("the token is not a quotagate token", code="invalid_token")
    return token_id, secret


@dataclass(frozen=True)
class TokenInfo:
    id: str
    admin: bool
    tenant: str | None
    label: str | None
    created: float
    revoked: float | None
    executor_target: str | None = None

    @property
    def scope(self) -> str:
        if self.admin:
            return "admin"
        if self.executor_target is not None:
            return f"executor={self.executor_target}"
        return f"tenant={self.tenant}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "admin": self.admin, "tenant": self.tenant,
            "executor_target": self.executor_target, "label": self.label,
            "created": self.created, "revoked": self.revoked,
        }


@dataclass(frozen=True)
class CreatedToken:
    info: TokenInfo
    # The only time the full token exists outside the caller's hands.
    token: str


def _info(row: TokenRow) -> TokenInfo:
    return TokenInfo(
        id=row["id"], admin=bool(row["admin"]), tenant=row["tenant"], label=row["label"],
        created=row["created"], revoked=row["revoked"], executor_target=row["executor_target"],
    )


class ActorCache:
    """Tokens that authenticated recently -> their actor, for ``ttl`` seconds.

    Keyed by the SHA-256 of the whole token text, so only the exact token that
    was verified hits (a wrong secret for a known id never does); nothing but
    successes is kept. A revocation through the same store drops the token at
    once; one made elsewhere (the CLI, another process) takes effect here within
    ``ttl`` (docs/decisions/237). Bounded: when full it starts afresh.
    """

    MAX_ENTRIES = 10_000

    def __init__(self, ttl: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl < 0:
            raise InvalidInput("the token cache time must be 0 or more seconds",
                               code="invalid_token_cache_ttl")
        self.ttl = ttl
        self._monotonic = monotonic
        self._entries: dict[str, tuple[Actor, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Actor | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[1] <= self._monotonic():
                del self._entries[key]
                return None
            return entry[0]

    def put(self, key: str, actor: Actor) -> None:
        with self._lock:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = (actor, self._monotonic() + self.ttl)

    def forget(self, token_id: str) -> None:
        with self._lock:
            self._entries = {key: entry for key, entry in self._entries.items()
                             if entry[0].token_id != token_id}


class RecentReads:
    """Tokens verified by a row read, with when that read began (``time.monotonic()``).

    Not a cache with a lifetime: a caller that arrived at ``since`` may take a
    verification only if its read began at or after ``since``, so it is judged on a
    row read after it arrived, as if it had read the row itself
    (docs/decisions/316). Many callbacks that arrive together share one read;
    nothing is believed that was read before a caller came. Only successes are
    kept; bounded: when full it starts afresh.
    """

    MAX_ENTRIES = 1_024

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Actor, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, since: float) -> Actor | None:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry[1] < since:
            return None
        return entry[0]

    def put(self, key: str, actor: Actor, read_began: float) -> None:
        with self._lock:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            current = self._entries.get(key)
            if current is None or current[1] < read_began:
                self._entries[key] = (actor, read_began)

    def forget(self, token_id: str) -> None:
        with self._lock:
            self._entries = {key: entry for key, entry in self._entries.items()
                             if entry[0].token_id != token_id}


class TokenStore:
    def __init__(self, engine: Engine, *, clock: Clock | None = None,
                 cache_ttl: float = 0.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        # 0: every call reads the token's row (revocation from anywhere counts at once).
        self.cache: ActorCache | None = ActorCache(cache_ttl, monotonic) if cache_ttl else None
        self.recent = RecentReads()

    def create(
        self,
        *,
        admin: bool = False,
        tenant: str | None = None,
        executor_target: str | None = None,
        label: str | None = None,
        actor: str = "cli",
    ) -> CreatedToken:
        """A new admin token, one scoped to ``tenant``, or an executor token for the
        target ``executor_target`` (exactly one of the three)."""
        if [admin, tenant is not None, executor_target is not None].count(True) != 1:
            raise InvalidInput(
                "a token is an admin token, scoped to one tenant, or an executor token "
                "for one target",
                code="invalid_token_scope",
            )
        if tenant is not None:
            validate_name(tenant, "tenant")
        if executor_target is not None:
            validate_name(executor_target, "target")
        if label is not None and len(label) > _MAX_LABEL:
            raise InvalidInput(f"label is longer than {_MAX_LABEL} characters",
                               code="invalid_label")
        if label is not None and ("\x00" in label or not label.isprintable()):
            raise InvalidInput("label must be printable text (no NUL or control characters)",
                               code="invalid_label")
        token_id = secrets.token_hex(_ID_BYTES)
        secret = secrets.token_urlsafe(_SECRET_BYTES)

        def work(connection: sa.Connection) -> TokenInfo:
            if executor_target is not None and not api_tokens.target_exists(connection, executor_target):
                raise NotFound(f"target {quoted(executor_target)} does not exist",
                               code="unknown_target")
            now = self.clock.now()
            row = TokenRow(
                id=token_id, secret_hash=hash_secret(secret), tenant=tenant, admin=admin,
                executor_target=executor_target, label=label, created=now, revoked=None,
            )
            api_tokens.insert(connection, row)
            info = _info(row)
            record(connection, now, AuditEntry(actor, "token.create", "ok", tenant,
                                               f"token/{token_id}", info.scope))
            return info

        info = run_transaction(self.engine, work)
        return CreatedToken(info, f"{PREFIX}_{token_id}_{secret}")

    def list(self, *, include_revoked: bool = True) -> list[TokenInfo]:
        return [_info(row) for row in api_tokens.list_rows(self.engine, include_revoked=include_revoked)]

    def revoke(self, token_id: str, *, actor: str = "cli") -> TokenInfo:
        """Revoke a token; it is refused from the next request on. Revoking twice is a no-op."""

        def work(connection: sa.Connection) -> TokenInfo:
            row = api_tokens.lock(connection, token_id)
            if row is None:
                raise NotFound(f"token {quoted(token_id)} does not exist", code="unknown_token")
            if row["revoked"] is not None:
                return _info(row)
            now = self.clock.now()
            api_tokens.mark_revoked(connection, token_id, now)
            record(connection, now, AuditEntry(actor, "token.revoke", "ok", row["tenant"],
                                               f"token/{token_id}"))
            return _info({**row, "revoked": now})

        revoked = run_transaction(self.engine, work)
        if self.cache is not None:
            self.cache.forget(token_id)
        self.recent.forget(token_id)
        return revoked

    def authenticate(self, text: str, *, read_since: float | None = None) -> Actor:
        """The actor a bearer token stands for, or Unauthorized (the same for every failure).

        ``read_since`` (a ``time.monotonic()`` reading, the caller's arrival): a
        verification of the same token whose row read began at or after it is
        taken instead of reading the row again (:class:`RecentReads`).
        """
        if self.cache is None and read_since is None:
            return self._authenticate(text)
        key = hashlib.sha256(text.encode()).hexdigest()
        actor = self.cache.get(key) if self.cache is not None else None
        if actor is None and read_since is not None:
            actor = self.recent.get(key, read_since)
        if actor is None:
            read_began = time.monotonic()
            actor = self._authenticate(text)
            self.recent.put(key, actor, read_began)
            if self.cache is not None:
                self.cache.put(key, actor)
        return actor

    def _authenticate(self, text: str) -> Actor:
        token_id, secret = parse_token(text)
        row = api_tokens.find(self.engine, token_id)
        stored = row["secret_hash"] if row is not None else _DUMMY_HASH
        matches = hmac.compare_digest(stored, hash_secret(secret))
        if row is None or not matches or row["revoked"] is not None:
            # One answer for unknown, wrong and revoked: a caller learns nothing.
            raise Unauthorized("the token is unknown, wrong or revoked", code="invalid_token")
        return Actor(token_id=row["id"], admin=bool(row["admin"]), tenant=row["tenant"],
                     label=row["label"], executor_target=row["executor_target"])
