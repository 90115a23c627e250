"""Batch submit in one transaction (Ledger.submit_many, docs/decisions/224), on every backend.

The bar: a batch answers each entry exactly as single submits of the same
entries, in the same order, would — same status or error code, same rows, same
audit trail, same tokens spent — and concurrent overlapping batches record
each id once, charge its token once, and say ``created`` for it once.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate, RequestState
from quotagate.delivery.registry import TargetStore
from quotagate.errors import QuotagateError, RateLimited
from quotagate.rate.redis import RedisRateStore
from quotagate.store import schema
from quotagate.store.submission import SubmitResult
from support import workers
from support.databases import fresh_database
from support.redis_servers import RedisServer

TENANT = "team-a"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


def _setup(gate: Quotagate) -> None:
    gate.set_pool("main", {"gpu": 100})
    for tenant in ("team-a", "team-b"):
        gate.set_tenant(tenant, {"gpu": 50})
    targets = TargetStore(gate.engine)
    targets.set("open-farm", "webhook", {"url": "http://127.0.0.1:9/hooks"})
    targets.set("b-farm", "webhook", {"url": "http://127.0.0.1:9/hooks"}, tenants=["team-b"])
    gate.submit("old-1", "team-a", {"gpu": 1})
    gate.submit("theirs", "team-b", {"gpu": 1})


# Every kind of answer a single submit gives, including ids repeated inside the batch.
MIXED: list[dict[str, Any]] = [
    {"id": "new-1", "cost": {"gpu": 1}},
    {"id": "old-1", "cost": {"gpu": 1}},                       # identical replay of a stored one
    {"id": "old-1", "cost": {"gpu": 2}},                       # changed: conflict
    {"id": "new-2", "cost": {"gpu": 2}, "priority": 3, "payload": {"k": [1, 2]}},
    {"id": "new-2", "cost": {"gpu": 2}, "priority": 3, "payload": {"k": [1, 2]}},  # replay in batch
    {"id": "new-2", "cost": {"gpu": 3}, "priority": 3},        # changed in batch: conflict
    {"id": "bad-resource", "cost": {"tpu": 1}},
    {"id": "to-open", "cost": {"gpu": 1}, "target": "open-farm"},
    {"id": "to-b-only", "cost": {"gpu": 1}, "target": "b-farm"},  # not this tenant's: unknown
    {"id": "to-missing", "cost": {"gpu": 1}, "target": "missing"},
    {"id": "theirs", "cost": {"gpu": 1}},                      # another tenant's id
    {"id": "bad id!", "cost": {"gpu": 1}},
    {"id": "negative", "cost": {"gpu": -1}},
    {"id": "new-3", "cost": {"gpu": 1}},
]

RATED: list[dict[str, Any]] = [
    {"id": "r-1", "cost": {"gpu": 1}},
    {"id": "r-2", "cost": {"gpu": 1}},
    {"id": "r-1", "cost": {"gpu": 1}},                         # replay: spends no token
    {"id": "r-bad", "cost": {"tpu": 1}},                       # refused before any token
    {"id": "r-3", "cost": {"gpu": 1}},
    {"id": "r-4", "cost": {"gpu": 1}},                         # no token left: rejected, 429
    {"id": "r-4", "cost": {"gpu": 1}},                         # a rejected one again: new attempt
    {"id": "r-5", "cost": {"gpu": 1}},
]


def _answer(answer: SubmitResult | QuotagateError) -> tuple[Any, ...]:
    if isinstance(answer, QuotagateError):
        return ("error", type(answer).__name__, answer.code, answer.status)
    return ("created" if answer.created else "replayed", answer.request.id, answer.request.state,
            answer.request.reason)


def _singles(gate: Quotagate, entries: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    answers = []
    for entry in entries:
        try:
            answers.append(_answer(gate.submit(
                entry["id"], TENANT, entry["cost"], priority=entry.get("priority", 0),
                payload=entry.get("payload"), target=entry.get("target"))))
        except QuotagateError as error:
            answers.append(_answer(error))
    return answers


def _rows(gate: Quotagate) -> set[tuple[Any, ...]]:
    request = schema.request
    with gate.engine.connect() as connection:
        return {tuple(row) for row in connection.execute(sa.select(
            request.c.id, request.c.tenant, request.c.state, request.c.cost, request.c.priority,
            request.c.payload, request.c.target, request.c.reason))}


def _audit(gate: Quotagate) -> Counter[tuple[Any, ...]]:
    audit = schema.audit
    with gate.engine.connect() as connection:
        return Counter(tuple(row) for row in connection.execute(
            sa.select(audit.c.actor, audit.c.operation, audit.c.outcome, audit.c.tenant,
                      audit.c.target, audit.c.reason).where(audit.c.operation == "submit")))


def test_a_batch_answers_and_writes_what_single_submits_would(
    backend: str, db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "singles").mkdir()
    with fresh_database(backend, tmp_path / "singles") as singles_url, \
            Quotagate.connect(singles_url, clock=ManualClock()) as singles, \
            Quotagate.connect(db_url, clock=ManualClock()) as batched:
        _setup(singles)
        _setup(batched)
        expected = _singles(singles, MIXED)
        got = [_answer(answer) for answer in batched.submit_many(TENANT, MIXED)]
        assert got == expected
        assert [answer[0] for answer in got].count("created") == 4
        assert _rows(batched) == _rows(singles)
        assert _audit(batched) == _audit(singles)


@pytest.mark.parametrize("rate_store", ["ledger", "redis"])
def test_a_rate_limited_batch_spends_tokens_as_single_submits_would(
    backend: str, db_url: str, tmp_path: Path, rate_store: str, redis_server: RedisServer
) -> None:
    url = redis_server.url if rate_store == "redis" else None
    outcomes = []
    (tmp_path / "singles").mkdir()
    with fresh_database(backend, tmp_path / "singles") as singles_url:
        for database, submit in ((singles_url, "singles"), (db_url, "batch")):
            with Quotagate.connect(database, clock=ManualClock(), rate_store=url) as gate:
                if isinstance(gate.rate_store, RedisRateStore):
                    gate.rate_store.client.flushall()  # this test's own server
                _setup(gate)
                gate.set_rate(TENANT, {"capacity": 3, "refill_per_second": 0})
                if submit == "singles":
                    answers = _singles(gate, RATED)
                else:
                    answers = [_answer(answer) for answer in gate.submit_many(TENANT, RATED)]
                status = gate.rate_status(TENANT)
                assert status is not None
                outcomes.append((answers, _rows(gate), _audit(gate), status["tokens"]))
    singles, batch = outcomes
    assert batch == singles
    single_answers, _rows_left, _audit_left, tokens_left = singles
    assert tokens_left == 0
    # r-4 twice and r-5 answer 429 like single submits, recorded rejected.
    assert [answer[:3] for answer in single_answers].count(
        ("error", RateLimited.__name__, "rate_quota_exhausted")) == 3


def test_a_rejected_request_in_a_batch_is_accepted_again_after_a_top_up(gate: Quotagate) -> None:
    _setup(gate)
    gate.set_rate(TENANT, {"capacity": 1, "refill_per_second": 0})
    first = gate.submit_many(TENANT, [{"id": "a", "cost": {"gpu": 1}}, {"id": "b", "cost": {"gpu": 1}}])
    assert isinstance(first[0], SubmitResult) and first[0].created
    assert isinstance(first[1], RateLimited)
    assert gate.show("b").state == RequestState.REJECTED
    gate.add_tokens(TENANT, 1)
    (again,) = gate.submit_many(TENANT, [{"id": "b", "cost": {"gpu": 1}}])
    assert isinstance(again, SubmitResult) and again.created
    assert gate.show("b").state == RequestState.WAITING


BATCHERS = 4
IDS = 120


def test_concurrent_overlapping_batches_record_and_charge_each_id_once(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        _setup(gate)
        gate.set_rate(TENANT, {"capacity": 10_000, "refill_per_second": 0})
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ids = [f"c-{index:03d}" for index in range(IDS)]
    processes = [context.Process(target=workers.submit_in_batches,
                                 args=(db_url, TENANT, ids, seed, 16, results))
                 for seed in range(BATCHERS)]
    for process in processes:
        process.start()
    answers = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    created: Counter[str] = Counter()
    for answer in answers:
        assert answer["errors"] == []
        created.update(answer["created"])
    assert created == Counter(ids)  # each id said "created" to exactly one caller
    with Quotagate.connect(db_url) as gate:
        request = schema.request
        with gate.engine.connect() as connection:
            states = Counter(connection.execute(
                sa.select(request.c.state).where(request.c.id.like("c-%"))).scalars())
        assert states == Counter({RequestState.WAITING.value: IDS})
        status = gate.rate_status(TENANT)
        assert status is not None
        assert status["tokens"] == 10_000 - IDS  # one token per recorded request
        accepted = sum(count for key, count in _audit(gate).items()
                       if key[2] == "accepted" and str(key[4]).startswith("c-"))
        assert accepted == IDS
