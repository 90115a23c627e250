"""``--hold-seconds`` (and $QUOTAGATE_HOLD_SECONDS): how long freed room waits for its
preemptor (docs/fair-sharing.md), set on the commands that admit."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate import InvalidInput, Quotagate
from quotagate.cli.ledger import admit
from quotagate.cli.server import serve
from quotagate.cli.worker import worker
from quotagate.store import holds, schema
from support.cli import run

ADMITTING = {
    "admit": ("admit", "--once"),
    "worker": ("worker", "--admit", "--once", "--name", "w1"),
}


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A ledger where the next admission pass preempts: ``high`` outranks running ``low``."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Quotagate.connect(url) as gate:
        gate.init()
        gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority")
        gate.set_pool("pool-1", {"gpu": 2})
        gate.submit("low", "team-a", {"gpu": 2}, priority=0)
        assert [placement.id for placement in gate.admit()] == ["low"]
        gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    return url


def held_for(db: str) -> list[tuple[str, float]]:
    """(preemptor, seconds its hold lasts) of every hold row."""
    with Quotagate.connect(db) as gate, gate.engine.connect() as connection:
        return [(row.request_id, row.expires - row.created) for row in connection.execute(
            sa.select(schema.hold.c.request_id, schema.hold.c.created, schema.hold.c.expires))]


@pytest.mark.parametrize("command", sorted(ADMITTING))
def test_the_option_sets_how_long_the_freed_room_is_held(
    command: str, db: str, tmp_path: Path
) -> None:
    run(*ADMITTING[command], "--hold-seconds", "5", db=db, cwd=tmp_path)
    assert held_for(db) == [("high", 5.0)]


def test_the_environment_variable_sets_it_too(db: str, tmp_path: Path) -> None:
    run(*ADMITTING["admit"], db=db, cwd=tmp_path, env={"QUOTAGATE_HOLD_SECONDS": "7.5"})
    assert held_for(db) == [("high", 7.5)]


def test_without_it_the_hold_lasts_the_default(db: str, tmp_path: Path) -> None:
    run(*ADMITTING["admit"], db=db, cwd=tmp_path)
    assert held_for(db) == [("high", holds.DEFAULT_HOLD_SECONDS)]


def test_zero_keeps_nothing_for_the_preemptor(db: str, tmp_path: Path) -> None:
    run(*ADMITTING["admit"], "--hold-seconds", "0", db=db, cwd=tmp_path)
    with Quotagate.connect(db) as gate, gate.engine.connect() as connection:
        assert holds.holders(connection, gate.now()) == []


def test_a_negative_time_is_refused(db: str, tmp_path: Path) -> None:
    refused = run(*ADMITTING["admit"], "--hold-seconds", "-1", db=db, cwd=tmp_path, expect=2)
    assert "--hold-seconds" in refused.stderr
    assert held_for(db) == []
    with pytest.raises(InvalidInput) as raised:
        Quotagate.connect(db, hold_seconds=-1)
    assert raised.value.code == "invalid_hold_seconds"


def test_every_admitting_command_has_it_with_the_stores_default() -> None:
    # Written out in the CLI so that no command imports the store to build its options.
    for command in (admit, worker, serve):
        [option] = [parameter for parameter in command.params if parameter.name == "hold_seconds"]
        assert option.default == holds.DEFAULT_HOLD_SECONDS, command.name
