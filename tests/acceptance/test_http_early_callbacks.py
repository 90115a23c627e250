"""An executor that calls back while its delivery is still in flight, on every SQL backend.

The receiver here ends the request over HTTP *inside* its answer to the
delivery POST, so the callback always arrives before the worker can record the
delivery: the race of decision 225, made certain instead of left to timing.
The real dispatcher delivers; the real application answers over HTTP.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest
import sqlalchemy as sa

from quotagate import Quotagate, RequestState
from quotagate.auth.tokens import TokenStore
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.http import create_app
from quotagate.store import schema
from quotagate.store.listing import read_binding
from support.executors import webhook_receiver, webhook_target
from support.http_servers import serving
from support.json_http import JsonHandler
from support.waiting import wait_for


@dataclass
class CallingBack:
    """What the receiver does with each delivery: call back with the delivery's token
    plus ``offset``, with ``authorization``; ``answers`` keeps what quotagate said."""

    api: str = ""
    authorization: str = ""
    offset: int = 0
    answers: list[httpx.Response] = field(default_factory=list)


@contextmanager
def calling_back_receiver(behaviour: CallingBack) -> Iterator[str]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            token = int(self.headers["Quotagate-Fencing-Token"]) + behaviour.offset
            request_id = body["request_id"]
            behaviour.answers.append(httpx.post(
                f"{behaviour.api}/v1/tenants/team-a/requests/{request_id}/complete",
                headers={"Authorization": behaviour.authorization},
                json={"fencing_token": token, "reason": "done before the reply"}, timeout=30))
            self._reply(201, {"id": uuid.uuid4().hex, "request_id": request_id,
                              "state": "completed"})

        def do_GET(self) -> None:
            self._reply(200, {"request_id": "", "state": "running"})

    with webhook_receiver(Handler) as url:
        yield url


@dataclass
class Platform:
    gate: Quotagate
    behaviour: CallingBack
    executor: dict[str, str]   # hooks-a's executor token
    other: dict[str, str]      # hooks-b's


@pytest.fixture
def platform(db_url: str) -> Iterator[Platform]:
    behaviour = CallingBack()
    with Quotagate.connect(db_url) as gate, calling_back_receiver(behaviour) as receiver:
        gate.set_pool("main", {"gpu": 8})
        gate.set_tenant("team-a", {"gpu": 4})
        webhook_target(gate, "hooks-a", receiver, default=True)
        webhook_target(gate, "hooks-b", receiver)
        tokens = TokenStore(gate.engine)
        executor = {"Authorization": f"Bearer {tokens.create(executor_target='hooks-a').token}"}
        other = {"Authorization": f"Bearer {tokens.create(executor_target='hooks-b').token}"}
        with serving(create_app(gate)) as url:
            behaviour.api = url
            behaviour.authorization = executor["Authorization"]
            yield Platform(gate, behaviour, executor, other)


def _run_until(gate: Quotagate, request_id: str, wanted: RequestState) -> None:
    dispatcher = Dispatcher(gate, worker_name=f"test-{uuid.uuid4().hex[:8]}")
    try:
        def reached() -> bool:
            dispatcher.run_once()
            return gate.show(request_id).state == wanted

        wait_for(reached, f"{request_id} {wanted.value}")
    finally:
        dispatcher.release()


def _used(gate: Quotagate) -> int:
    return int(next(row["used"] for row in gate.usage()["tenants"]
                    if row["tenant"] == "team-a" and row["resource"] == "gpu"))


def _audit(gate: Quotagate, request_id: str) -> list[tuple[str, str]]:
    audit = schema.audit
    with gate.engine.connect() as connection:
        return [(row.operation, row.outcome) for row in connection.execute(
            sa.select(audit.c.operation, audit.c.outcome)
            .where(audit.c.target == request_id).order_by(audit.c.id))]


def _outbox_rows(gate: Quotagate, request_id: str) -> int:
    with gate.engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(schema.outbox)
            .where(schema.outbox.c.request_id == request_id)).scalar_one())


@pytest.mark.parametrize("named_target", ["hooks-a", None])
def test_an_end_with_the_in_flight_token_is_accepted_and_the_delivered_mark_writes_nothing(
    platform: Platform, named_target: str | None,
) -> None:
    gate = platform.gate
    gate.submit("job-1", "team-a", {"gpu": 2}, target=named_target)  # None: the default target
    assert gate.admit(1)
    assert _used(gate) == 2
    _run_until(gate, "job-1", RequestState.COMPLETED)
    (answer,) = platform.behaviour.answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "completed"
    assert answer.json()["released"] == {"gpu": 2}
    assert _used(gate) == 0
    # The worker's later delivery record found it ended: no binding, no delivered mark.
    assert read_binding(gate.engine, "job-1") is None
    assert _outbox_rows(gate, "job-1") == 0
    assert _audit(gate, "job-1") == [("submit", "accepted"), ("admit", "reserved"),
                                     ("completed", "released")]
    assert gate.show("job-1").reason == "done before the reply"


@pytest.mark.parametrize(("offset", "code"), [(-1, "stale_fencing_token"), (1, "not_delivered")])
def test_an_end_with_another_token_during_delivery_changes_nothing(
    platform: Platform, offset: int, code: str,
) -> None:
    gate = platform.gate
    platform.behaviour.offset = offset
    gate.submit("job-2", "team-a", {"gpu": 1}, target="hooks-a")
    assert gate.admit(1)
    _run_until(gate, "job-2", RequestState.DELIVERED)
    (answer,) = platform.behaviour.answers
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == code
    assert _used(gate) == 1
    binding = read_binding(gate.engine, "job-2")
    assert binding is not None and binding["fencing_token"] == 1


def test_another_targets_executor_is_told_the_request_does_not_exist(platform: Platform) -> None:
    gate = platform.gate
    platform.behaviour.authorization = platform.other["Authorization"]
    gate.submit("job-3", "team-a", {"gpu": 1})  # to the default target, hooks-a
    assert gate.admit(1)
    _run_until(gate, "job-3", RequestState.DELIVERED)
    (answer,) = platform.behaviour.answers
    assert answer.status_code == 404, answer.text
    assert answer.json()["code"] == "unknown_request"
    assert _used(gate) == 1
