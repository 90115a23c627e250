"""SQLite admission keeps its snapshot and queue heads while nobody else writes
(quotagate.store.admission_reads, docs/decisions/033): whatever another connection
commits in between, the next admission sees it, and placements are those of a ledger
that reads at every admission.

Real SQLite files; the writes in between come from another engine (its own
connections) or another process. A stale read that a conditional UPDATE would
catch shows as a rerun, so those tests also say that none was needed.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import InvalidInput, ManualClock, Quotagate
from quotagate.domain.placement import Placement
from quotagate.store import admission_stats, cohorts, statements
from quotagate.store.engine import create_engine
from quotagate.store.ledger import Ledger
from quotagate.store.steady_admission import SteadyAdmission
from support.databases import fresh_database
from support.workers import admit_count

pytestmark = pytest.mark.sqlite


@dataclass
class Side:
    """A ledger file: a facade that writes (its own engine) and a ledger that admits."""

    gate: Quotagate
    ledger: Ledger
    statements: list[str]
    reruns: int = 0  # of its admissions, for a stale snapshot

    def admit(self, limit: int) -> list[Placement]:
        before = admission_stats.snapshot().reruns["stale_snapshot"]
        placed = self.ledger.admit(limit)
        self.reruns += admission_stats.snapshot().reruns["stale_snapshot"] - before
        return placed

    def snapshot_reads(self) -> int:
        return sum(1 for sql in self.statements if "AS kind, qg_tenant_quota.tenant AS holder" in sql)


def _side(url: str, clock: ManualClock, *, reuse: bool = True, window: int = 32,
          ttl: float = 3600.0) -> Side:
    engine = create_engine(url)
    statements: list[str] = []
    sa.event.listen(engine, "connect",
                    lambda dbapi, _record: dbapi.set_trace_callback(statements.append))
    ledger = Ledger(engine, clock=clock, reuse_reads=reuse, admission_window=window, ttl=ttl)
    return Side(Quotagate.connect(url, clock=clock), ledger, statements)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def side(tmp_path: Path, clock: ManualClock) -> Iterator[Side]:
    with fresh_database("sqlite", tmp_path) as url:
        made = _side(url, clock)
        made.gate.set_pool("pool-1", {"gpu": 100, "cpu": 100})
        made.gate.set_tenant("team-a", {"gpu": 10, "cpu": 10})
        yield made
        made.ledger.close()
        made.ledger.engine.dispose()
        made.gate.close()


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    admission_stats.reset()
    yield
    admission_stats.reset()


def _ids(placements: list[Placement]) -> list[str]:
    return [placement.id for placement in placements]


def test_consecutive_admissions_read_the_snapshot_once(side: Side) -> None:
    for index in range(5):
        side.gate.submit(f"r{index}", "team-a", {"gpu": 1})
    for index in range(5):
        assert _ids(side.ledger.admit(1)) == [f"r{index}"]
    assert side.snapshot_reads() == 1
    assert side.ledger.admit(1) == []
    assert side.snapshot_reads() == 1
    assert side.gate.check_invariants() == []


def test_a_submit_by_another_connection_is_seen(side: Side) -> None:
    side.gate.submit("r0", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r0"]
    assert side.ledger.admit(1) == []  # kept: team-a's queue is known to be empty
    side.gate.submit("r1", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r1"]


def test_a_quota_raised_by_another_connection_is_seen(side: Side) -> None:
    side.gate.set_tenant("team-a", {"gpu": 1, "cpu": 10})
    for index in range(3):
        side.gate.submit(f"r{index}", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r0"]
    assert side.ledger.admit(1) == []  # at its cap, as the kept snapshot says
    side.gate.set_tenant("team-a", {"gpu": 2, "cpu": 10})
    assert _ids(side.ledger.admit(1)) == ["r1"]


def test_a_release_by_another_connection_is_seen(side: Side) -> None:
    side.gate.set_tenant("team-a", {"gpu": 1, "cpu": 10})
    side.gate.submit("r0", "team-a", {"gpu": 1})
    side.gate.submit("r1", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r0"]
    side.gate.complete("r0")
    assert _ids(side.ledger.admit(1)) == ["r1"]
    assert side.gate.check_invariants() == []


def test_a_cancel_by_another_connection_is_seen_without_a_rerun(side: Side) -> None:
    for index in range(3):
        side.gate.submit(f"r{index}", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r0"]
    side.gate.cancel("r1")  # a kept head would be planned, miss its reserve, and rerun
    assert _ids(side.ledger.admit(1)) == ["r2"]
    assert admission_stats.snapshot().reruns["stale_snapshot"] == 0


def test_an_expiry_pass_is_seen_without_a_rerun(tmp_path: Path, clock: ManualClock) -> None:
    with fresh_database("sqlite", tmp_path) as url:
        made = _side(url, clock, ttl=100.0)
        made.gate.set_pool("pool-1", {"gpu": 100})
        made.gate.set_tenant("team-a", {"gpu": 10})
        made.gate.submit("old-0", "team-a", {"gpu": 1})
        made.gate.submit("old-1", "team-a", {"gpu": 1})
        clock.advance(60)
        made.gate.submit("new", "team-a", {"gpu": 1})
        assert _ids(made.ledger.admit(1)) == ["old-0"]
        clock.advance(50)  # old-1 is past its TTL: the admission's own expiry pass ends it
        assert _ids(made.ledger.admit(1)) == ["new"]
        assert made.gate.show("old-1").state.value == "expired"
        assert admission_stats.snapshot().reruns["stale_snapshot"] == 0
        made.ledger.close()
        made.ledger.engine.dispose()
        made.gate.close()


def test_another_admitter_process_is_seen_without_a_rerun(side: Side) -> None:
    side.gate.set_tenant("team-a", {"gpu": 3, "cpu": 10})
    for index in range(5):
        side.gate.submit(f"r{index}", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r0"]
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    child = context.Process(target=admit_count, args=(str(side.gate.engine.url), 2, results))
    child.start()
    assert results.get(timeout=120) == ["r1", "r2"]
    child.join(timeout=60)
    # team-a is at its cap now: a kept snapshot would plan r3, and its charge would miss.
    assert side.ledger.admit(1) == []
    assert admission_stats.snapshot().reruns["stale_snapshot"] == 0
    assert side.gate.check_invariants() == []


def test_a_write_on_the_admissions_own_connection_is_seen(side: Side) -> None:
    """Its own commits leave ``data_version`` as it was: the kept connection lent to
    other work in between (the pool lends it when another thread kept one first) must
    still make the next admission read."""
    side.gate.set_tenant("team-a", {"gpu": 1, "cpu": 10})
    side.gate.submit("r0", "team-a", {"gpu": 1})
    side.gate.submit("r1", "team-a", {"gpu": 1})
    assert _ids(side.ledger.admit(1)) == ["r0"]
    kept = side.ledger._admission_connection
    pooled = kept.take()
    assert pooled is not None
    cursor = pooled.cursor()
    cursor.execute("UPDATE qg_tenant_quota SET cap = 2 WHERE tenant = 'team-a' AND resource = 'gpu'")
    pooled.commit()
    assert kept.keep(pooled)
    assert _ids(side.ledger.admit(1)) == ["r1"]


def test_a_wider_read_of_the_same_admission_does_not_see_what_it_reserved(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The batch was not filled from the first heads: the second, wider read comes from
    the database, which no longer lists the request reserved a moment before."""
    with fresh_database("sqlite", tmp_path) as url:
        made = _side(url, clock, window=8)
        made.gate.set_pool("pool-1", {"gpu": 100})
        made.gate.set_tenant("team-a", {"gpu": 9})
        for index, gpu in enumerate((1, 9, 9, 9, 1, 1, 1, 1, 1, 1)):
            made.gate.submit(f"a{index}", "team-a", {"gpu": gpu})
            clock.advance(1)
        made.gate.set_tenant("team-a", {"gpu": 5})  # the 9s never fit now
        assert _ids(made.ledger.admit(1)) == ["a0"]
        # Kept: a1-a3, fewer than a read of 4 asks for: team-a is read again, 8 deep.
        assert _ids(made.ledger.admit(2)) == ["a4", "a5"]
        assert admission_stats.snapshot().reruns["stale_snapshot"] == 0
        assert made.snapshot_reads() == 1
        made.ledger.close()
        made.ledger.engine.dispose()
        made.gate.close()


def _head_read_depths(side: Side) -> list[int]:
    """The LIMIT of each head read the side's ledger sent, in order."""
    return [int(limit) for sql in side.statements if "qg_request.token_floor" in sql
            for limit in re.findall(r"LIMIT (\d+)", sql)[:1]]


def test_a_tenant_short_of_kept_heads_is_read_twice_as_deep_as_last_time(
    tmp_path: Path, clock: ManualClock
) -> None:
    """After a fresh read (here: the first; with several admitters, after another's commit)
    each tenant is known 4 deep, and the lock may change hands again within a few
    admissions: the tenant that runs short is read 8, then 16, then the window deep, not
    the whole window at once (docs/decisions/059)."""
    with fresh_database("sqlite", tmp_path) as url:
        made = _side(url, clock)
        made.gate.set_pool("pool-1", {"gpu": 1000})
        made.gate.set_tenant("team-a", {"gpu": 1000})
        for index in range(80):
            made.gate.submit(f"a{index:02d}", "team-a", {"gpu": 1})
            clock.advance(1)
        placed = [_ids(made.admit(1)) for _ in range(30)]
        assert placed == [[f"a{index:02d}"] for index in range(30)]
        # 4 (the first read), then short after 1, 1 + 8 - 4 = 5 and 5 + 16 - 4 = 17
        # admissions; at 17 + 32 - 4 = 45 the next, the window's 32 again.
        assert _head_read_depths(made) == [4, 8, 16, 32]
        assert made.snapshot_reads() == 1 and made.reruns == 0
        made.ledger.close()
        made.ledger.engine.dispose()
        made.gate.close()


# -- the same placements as a ledger that reads at every admission ------------------


def _configure(gate: Quotagate, *, plain: bool = False) -> None:
    """Cohort members and a sliced pool; or (``plain``) plain tenants with weights and a
    fair-share half-life, where admit(1) is decided by the steady admission
    (quotagate.store.steady_admission)."""
    if plain:  # roomier, so that most admissions place something
        gate.set_pool("pool-1", {"gpu": 16, "cpu": 30})
        gate.set_pool("pool-2", {"gpu": 8, "cpu": 50})
        gate.set_tenant("team-a", {"gpu": 3, "cpu": 8})
        gate.set_tenant("team-b", {"gpu": 8, "cpu": 20}, weight=2)
        gate.set_tenant("team-c", {"gpu": 6, "cpu": 12})
        gate.set_tenant("team-d", {"gpu": 4, "cpu": 12}, weight=3)
        gate.set_fair_share(half_life="30s")
        return
    gate.set_pool("pool-1", {"gpu": 6, "cpu": 12}, slices=2)
    gate.set_pool("pool-2", {"gpu": 3, "cpu": 20})
    gate.set_tenant("team-a", {"gpu": 3, "cpu": 8})
    gate.set_tenant("team-b", {"gpu": 2, "cpu": 6}, weight=2)
    gate.set_cohort("shared")
    gate.set_tenant("team-c", {"gpu": 2, "cpu": 4}, cohort="shared", borrowing_limit={"gpu": 2})
    gate.set_tenant("team-d", {"gpu": 1, "cpu": 4}, cohort="shared")


TEAMS = ("team-a", "team-b", "team-c", "team-d")
COSTS = ({"gpu": 1}, {"gpu": 1, "cpu": 2}, {"cpu": 3}, {"gpu": 2, "cpu": 1})


def _step(generator: random.Random, sides: list[Side], state: dict[str, Any],
          clock: ManualClock) -> list[list[Placement]] | None:
    """One random step on every side alike; the placements of an admission, or None."""
    choice = generator.random()
    if choice < 0.5:  # admissions in a row: the kept reads serve them
        limit = generator.choice((1, 1, 1, 2, 3))
        return [side.admit(limit) for side in sides]
    if choice < 0.7:
        tenant, cost = generator.choice(TEAMS), generator.choice(COSTS)
        priority, name = generator.randint(0, 2), f"q{state['next']}"
        state["next"] += 1
        answers = []
        for side in sides:
            try:
                side.gate.submit(name, tenant, cost, priority=priority)
                answers.append("waiting")
            except InvalidInput as error:  # above team-a's lowered cap: refused at submit
                answers.append(error.code)
        assert len(set(answers)) == 1 and answers[0] in ("waiting", "cost_above_quota")
        if answers[0] != "waiting":
            state["refused"].add(name)
    elif choice < 0.82 and state["reserved"]:
        name = state["reserved"].pop(generator.randrange(len(state["reserved"])))
        for side in sides:
            side.gate.complete(name)
    elif choice < 0.88 and state["next"]:
        name = f"q{generator.randrange(state['next'])}"
        if name in state["refused"]:
            return None
        states = {side.gate.show(name).state.value for side in sides}
        assert len(states) == 1
        if states == {"waiting"}:  # a reserved one's cancel is a stop, left to a worker
            for side in sides:
                side.gate.cancel(name)
    elif choice < 0.94:
        cap = generator.randint(1, 4)
        for side in sides:
            side.gate.set_tenant("team-a", {"gpu": cap, "cpu": 8})
    else:
        clock.advance(generator.choice((0.5, 5.0)))
    return None


@pytest.fixture
def steady_decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids the steady admission placed on kept reads alone (else the general one did)."""
    decided: list[str] = []
    decide = SteadyAdmission._admit_on

    def counted(self: SteadyAdmission, *arguments: Any) -> list[Placement] | None:
        placed = decide(self, *arguments)
        decided.extend(_ids(placed or []))
        return placed

    monkeypatch.setattr(SteadyAdmission, "_admit_on", counted)
    return decided


@pytest.mark.parametrize("plain", [False, True], ids=["cohorts-and-slices", "plain-tenants"])
@pytest.mark.parametrize("seed", range(3))
def test_placements_are_those_of_a_ledger_that_reads_every_time(
    tmp_path: Path, clock: ManualClock, seed: int, plain: bool, steady_decisions: list[str],
) -> None:
    generator = random.Random(seed)
    (tmp_path / "kept").mkdir()
    (tmp_path / "fresh").mkdir()
    with fresh_database("sqlite", tmp_path / "kept") as kept_url, \
            fresh_database("sqlite", tmp_path / "fresh") as fresh_url:
        sides = [_side(kept_url, clock, window=6), _side(fresh_url, clock, reuse=False, window=6)]
        for side in sides:
            _configure(side.gate, plain=plain)
        state: dict[str, Any] = {"next": 0, "reserved": [], "refused": set()}
        if plain:  # a backlog, so that admissions in a row place something
            for index in range(120):
                tenant, cost = generator.choice(TEAMS[1:]), generator.choice(COSTS)
                for side in sides:
                    side.gate.submit(f"backlog-{index}", tenant, cost)
        admissions = placed = 0
        for _ in range(400):
            placed_now = _step(generator, sides, state, clock)
            if placed_now is None:
                continue
            # Plain tenants: admit(1) three more times in a row, on reads kept since.
            for kept, fresh in [placed_now, *([side.admit(1) for side in sides]
                                              for _ in range(3 if plain else 0))]:
                assert kept == fresh
                admissions += 1
                placed += len(kept)
                state["reserved"] += _ids(kept)
        for side in sides:
            # Usage may stand above team-a's cap, lowered at random: not a violation.
            assert side.gate.check_ledger().violations == []
        # No stale read either (a conditional UPDATE would have caught it: a rerun).
        assert sides[0].reruns == sides[1].reruns
        # The kept reads were used (else this compared a ledger with itself).
        assert sides[1].snapshot_reads() >= admissions
        assert sides[0].snapshot_reads() < admissions * 3 // 4
        # Plain tenants: the steady admission decided many (cohorts and slices: none).
        assert len(steady_decisions) > placed // 4 if plain else steady_decisions == []
        for side in sides:
            side.ledger.close()
            side.ledger.engine.dispose()
            side.gate.close()


def test_the_kept_snapshot_equals_a_fresh_read(tmp_path: Path, clock: ManualClock) -> None:
    """After admissions on kept reads, the kept snapshot is what the database says."""
    with fresh_database("sqlite", tmp_path) as url:
        side = _side(url, clock, window=6)
        _configure(side.gate)
        generator = random.Random(7)
        for index in range(30):
            side.gate.submit(f"r{index}", generator.choice(TEAMS), generator.choice(COSTS))
        for _ in range(12):
            side.ledger.admit(generator.choice((1, 2)))
        assert side.snapshot_reads() == 1
        kept = side.ledger._reads._kept[0].snapshot
        with side.gate.engine.connect() as connection:
            fresh = cohorts.snapshot_from_rows(
                connection.execute(statements.admission_snapshot_query()).all())
        # Budgets has no equality; there are none here (a budget is never kept).
        assert kept is not None and not kept.budgeted
        assert _fields(kept) == _fields(fresh)


def _fields(snapshot: cohorts.Snapshot) -> dict[str, Any]:
    return {field.name: getattr(snapshot, field.name)
            for field in dataclasses.fields(snapshot) if field.name != "budgets"}
