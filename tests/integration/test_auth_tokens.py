"""API tokens in the ledger database, on every backend."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.auth.tokens import TokenStore
from quotagate.errors import InvalidInput, NotFound, Unauthorized
from quotagate.store import schema


def test_a_token_is_shown_once_and_only_its_hash_is_stored(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock)
    created = tokens.create(tenant="team-a", label="ci")
    secret = created.token.split("_", 2)[2]
    with gate.engine.connect() as connection:
        stored = connection.execute(sa.select(schema.api_token)).mappings().one()
    assert secret not in str(dict(stored).values())
    assert stored["secret_hash"] != secret and len(stored["secret_hash"]) == 64
    actor = tokens.authenticate(created.token)
    assert (actor.token_id, actor.admin, actor.tenant) == (created.info.id, False, "team-a")
    assert [info.id for info in tokens.list()] == [created.info.id]


def test_wrong_unknown_and_revoked_tokens_get_the_same_refusal(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock)
    created = tokens.create(admin=True)
    token_id = created.info.id
    refusals = []
    for text in (f"qg_{token_id}_wrong", f"qg_{'f' * 16}_whatever"):
        with pytest.raises(Unauthorized) as refused:
            tokens.authenticate(text)
        refusals.append(refused.value.to_dict())
    revoked = tokens.revoke(token_id)
    assert revoked.revoked is not None
    assert tokens.revoke(token_id).revoked == revoked.revoked, "revoking twice changes nothing"
    with pytest.raises(Unauthorized) as refused:
        tokens.authenticate(created.token)
    refusals.append(refused.value.to_dict())
    assert refusals[0] == refusals[1] == refusals[2]
    with pytest.raises(NotFound):
        tokens.revoke("0" * 16)


def test_a_token_is_admin_or_scoped_never_both(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine)
    for arguments in ({}, {"admin": True, "tenant": "team-a"}):
        with pytest.raises(InvalidInput):
            tokens.create(**arguments)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        tokens.create(tenant="Not A Name")


def test_token_changes_are_audited(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock)
    created = tokens.create(tenant="team-a", actor="ops")
    tokens.revoke(created.info.id, actor="ops")
    with gate.engine.connect() as connection:
        rows = connection.execute(
            sa.select(schema.audit.c.operation, schema.audit.c.actor, schema.audit.c.tenant,
                      schema.audit.c.target).order_by(schema.audit.c.id)
        ).all()
    target = f"token/{created.info.id}"
    assert [tuple(row) for row in rows] == [
        ("token.create", "ops", "team-a", target), ("token.revoke", "ops", "team-a", target)
    ]


def test_the_audit_log_names_the_token_never_its_secret(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 1})
    gate.set_pool("pool-1", {"gpu": 1})
    tokens = TokenStore(gate.engine, clock=gate.clock)
    created = tokens.create(tenant="team-a", label="ci")
    secret = created.token.split("_", 2)[2]
    actor = tokens.authenticate(created.token)
    gate.submit("job-1", "team-a", {"gpu": 1}, actor=actor.name)
    with gate.engine.connect() as connection:
        entries = connection.execute(sa.select(schema.audit)).mappings().all()
    by_token = [entry for entry in entries if entry["operation"] == "submit"]
    assert [entry["actor"] for entry in by_token] == [f"token:{created.info.id}"]
    assert all(secret not in str(value) for entry in entries for value in entry.values())
    assert all(created.token not in str(value) for entry in entries for value in entry.values())


@pytest.mark.parametrize("label", ["ci\x00", "line\nbreak", "bad \ud800"])
def test_a_label_with_a_nul_a_control_character_or_a_surrogate_is_refused(
    gate: Quotagate, label: str
) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock)
    with pytest.raises(InvalidInput) as error:
        tokens.create(tenant="team-a", label=label)
    assert error.value.code == "invalid_label"
    assert tokens.list() == []


class Ticks:
    """A monotonic clock the test moves by hand (the cache's time, not the ledger's)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def token_reads(gate: Quotagate) -> list[object]:
    """The engine's pool checkouts from now on: one per token read while nothing else
    runs (the read runs on the driver connection, past SQLAlchemy's statement events;
    docs/decisions/315-token-read-on-the-driver.md)."""
    seen: list[object] = []

    def note(_dbapi_connection: object, record: object, _proxy: object) -> None:
        seen.append(record)

    sa.event.listen(gate.engine, "checkout", note)
    return seen


def test_a_cached_token_is_believed_without_its_row_until_the_ttl_passes(gate: Quotagate) -> None:
    ticks = Ticks()
    tokens = TokenStore(gate.engine, clock=gate.clock, cache_ttl=2.0, monotonic=ticks)
    created = tokens.create(tenant="team-a")
    reads = token_reads(gate)
    first = tokens.authenticate(created.token)
    assert len(reads) == 1
    assert tokens.authenticate(created.token) == first and len(reads) == 1  # from the cache
    # Revoked elsewhere (the CLI, another serve): believed until the ttl passes, then refused.
    TokenStore(gate.engine, clock=gate.clock).revoke(created.info.id)
    ticks.now = 1.9
    assert tokens.authenticate(created.token) == first
    ticks.now = 2.0
    with pytest.raises(Unauthorized):
        tokens.authenticate(created.token)


def test_a_revocation_through_the_caching_store_counts_at_once(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock, cache_ttl=60.0, monotonic=Ticks())
    created = tokens.create(admin=True)
    other = tokens.create(admin=True)
    tokens.authenticate(created.token)
    tokens.authenticate(other.token)
    tokens.revoke(created.info.id)
    with pytest.raises(Unauthorized):
        tokens.authenticate(created.token)
    assert tokens.authenticate(other.token).token_id == other.info.id  # still cached


def test_only_the_exact_verified_token_hits_the_cache(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock, cache_ttl=60.0, monotonic=Ticks())
    created = tokens.create(tenant="team-a")
    tokens.authenticate(created.token)
    for text in (f"qg_{created.info.id}_wrong", created.token + "x"):
        with pytest.raises(Unauthorized):
            tokens.authenticate(text)
    with pytest.raises(InvalidInput, match="token cache"):
        TokenStore(gate.engine, cache_ttl=-1.0)


def test_a_caller_shares_only_a_token_read_that_began_after_it_arrived(gate: Quotagate) -> None:
    """docs/decisions/316: callbacks that arrived together share one row read; a caller
    arriving later reads the row again, so a revocation made elsewhere refuses it."""
    tokens = TokenStore(gate.engine, clock=gate.clock)
    created = tokens.create(tenant="team-a")
    reads = token_reads(gate)
    arrived = time.monotonic()
    first = tokens.authenticate(created.token, read_since=arrived)
    assert tokens.authenticate(created.token, read_since=arrived) == first
    assert len(reads) == 1, "a caller that arrived before the read shares it"
    TokenStore(gate.engine, clock=gate.clock).revoke(created.info.id)  # elsewhere
    reads.clear()
    with pytest.raises(Unauthorized):
        tokens.authenticate(created.token, read_since=time.monotonic())
    assert len(reads) == 1, "a caller that arrived after the read reads the row again"
    with pytest.raises(Unauthorized):
        tokens.authenticate(created.token)  # without read_since: the row, every time


def test_a_shared_read_never_stands_for_another_secret(gate: Quotagate) -> None:
    tokens = TokenStore(gate.engine, clock=gate.clock)
    created = tokens.create(tenant="team-a")
    arrived = time.monotonic()
    tokens.authenticate(created.token, read_since=arrived)
    with pytest.raises(Unauthorized):
        tokens.authenticate(f"qg_{created.info.id}_wrong", read_since=arrived)
    tokens.revoke(created.info.id)  # through this store: forgotten at once
    with pytest.raises(Unauthorized):
        tokens.authenticate(created.token, read_since=arrived)
