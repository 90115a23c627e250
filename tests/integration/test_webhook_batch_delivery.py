"""Batched webhook deliveries (``--batch-deliver N``) on every SQL backend.

A real receiver on 127.0.0.1 (tests/support/receiver.py) answers ``POST
…/_batch`` item by item; the real dispatcher claims, delivers and records
(docs/delivery.md, docs/decisions/236).
"""

from __future__ import annotations

import base64
import json
import signal
from collections import Counter
from typing import Any

import pytest

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.naming import external_name
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.base import DeliveryFailed, DeliverySpec
from quotagate.delivery.targets.webhook import WebhookTarget
from quotagate.errors import InvalidInput
from quotagate.store import schema
from support.receiver import Receiver
from support.waiting import wait_for
from support.worker_processes import finish, start_worker, stop_all, submit_and_admit, table

ITEM_KEYS = {"name", "ledger_id", "request_id", "tenant", "cost", "payload", "fencing_token",
             "attempt", "idempotency_key"}


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 1000})
    gate.set_pool("pool-1", {"gpu": 1000})
    return gate


def batched_target(gate: Quotagate, url: str, size: int) -> None:
    TargetStore(gate.engine).set("hook", "webhook", {"url": url, "batch_deliver": size},
                                 default=True)


def batch_items(receiver: Receiver) -> list[list[dict[str, Any]]]:
    return [call["body"]["deliveries"] for call in receiver.calls_of("POST")
            if call["path"].split("?", 1)[0].endswith("/_batch")]


def snapshot(gate: Quotagate) -> list[list[Any]]:
    return [sorted(map(tuple, (row.values() for row in table(gate, which))))
            for which in (schema.request, schema.outbox, schema.binding, schema.audit)]


def test_many_deliveries_go_in_one_post_each_with_its_own_identity_and_token(
    ledger: Quotagate, receiver: Receiver
) -> None:
    port = receiver.server_address[1]
    # Credentials in the URL reach the receiver as HTTP auth, never in a body.
    url = f"http://hookuser:pa55word@127.0.0.1:{port}/hooks?token=s3cret"
    batched_target(ledger, url, 16)
    ids = submit_and_admit(ledger, 40)
    dispatcher = Dispatcher(ledger, worker_name="w1", batch=64)
    try:
        wait_for(lambda: dispatcher.run_once() is not None and all(
            ledger.show(i).state == RequestState.DELIVERED for i in ids), "every delivery")
    finally:
        dispatcher.release()
    posts = receiver.calls_of("POST")
    assert all(call["path"].startswith("/hooks/_batch") for call in posts)  # no single POSTs
    batches = batch_items(receiver)
    assert sorted(len(items) for items in batches) == [8, 16, 16]
    items = [item for batch in batches for item in batch]
    assert Counter(item["request_id"] for item in items) == Counter(ids)  # each once
    bindings = {row["request_id"]: row for row in table(ledger, schema.binding)}
    for item in items:
        request_id = item["request_id"]
        assert set(item) == ITEM_KEYS
        assert item["idempotency_key"] == request_id
        assert item["attempt"] == 1  # a first attempt: the request id alone is the key
        assert item["ledger_id"] == ledger.ledger_id
        assert item["name"] == external_name(ledger.ledger_id, "team-a", request_id)
        assert item["name"] == bindings[request_id]["external_name"]
        assert item["fencing_token"] == bindings[request_id]["fencing_token"]
        assert receiver.objects[item["name"]]["id"] == bindings[request_id]["uid"]
        assert item["payload"] == {"n": request_id} and item["cost"] == {"gpu": 1}
    for call in posts:
        assert call["headers"]["Quotagate-Ledger"] == ledger.ledger_id
        assert call["headers"]["Authorization"] == "Basic " + base64.b64encode(
            b"hookuser:pa55word").decode()
        text = json.dumps(call["body"])
        for secret in ("pa55word", "s3cret", "hookuser"):
            assert secret not in text
    assert int(ledger.usage()["tenants"][0]["used"]) == 40
    assert ledger.check_invariants() == []


def test_items_refused_inside_a_batch_are_handled_one_by_one(
    ledger: Quotagate, receiver: Receiver
) -> None:
    batched_target(ledger, receiver.url, 10)
    ids = submit_and_admit(ledger, 10)
    busy, also_busy, taken = ids[2], ids[7], ids[5]
    receiver.refuse_items = {busy: (503, 1), also_busy: (500, 1)}
    # Another ledger's object already holds one request's name: that item answers 409
    # and reads back an identity that is not ours.
    name = external_name(ledger.ledger_id, "team-a", taken)
    receiver.objects[name] = {"id": "x", "name": name, "request_id": taken,
                              "ledger_id": "another-ledger", "state": "running"}
    dispatcher = Dispatcher(ledger, worker_name="w1", retry_base=0.05)
    try:
        dispatcher.run_once()
        assert len(batch_items(receiver)) == 1
        states = {request_id: ledger.show(request_id).state for request_id in ids}
        assert states[taken] == RequestState.FAILED  # an identity mismatch is final
        assert states[busy] == states[also_busy] == RequestState.RESERVED  # to be retried
        assert [i for i in ids if states[i] == RequestState.DELIVERED] == [
            i for i in ids if i not in (busy, also_busy, taken)]
        errors = {row["id"]: row["last_error"] for row in ledger.inspect()["requests"]
                  if row["id"] in (busy, also_busy)}
        assert "answered 503" in errors[busy] and "answered 500" in errors[also_busy]
        wait_for(lambda: dispatcher.run_once() is not None
                 and ledger.show(busy).state == ledger.show(also_busy).state
                 == RequestState.DELIVERED, "the retried items")
    finally:
        dispatcher.release()
    retried = [item["request_id"] for batch in batch_items(receiver)[1:] for item in batch]
    assert sorted(retried) == sorted([busy, also_busy])  # only the refused ones again
    assert ledger.show(taken).reason is not None
    assert receiver.objects[name]["ledger_id"] == "another-ledger"  # never adopted
    assert int(ledger.usage()["tenants"][0]["used"]) == 9  # the failed one's cost came back
    assert ledger.check_invariants() == []


def test_a_stale_generations_batched_delivery_writes_nothing(
    ledger: Quotagate, receiver: Receiver
) -> None:
    batched_target(ledger, receiver.url, 8)
    ids = submit_and_admit(ledger, 5)
    old = Dispatcher(ledger, worker_name="w1", lease_ttl=0.3)
    assert old._hold_lease() and old.lease is not None
    old.built.refresh()
    claims = old.outbox.claim(old.lease, 10)
    assert len(claims) == 5
    # The old process stalls; a new process of the same name takes the lease over.
    new = Dispatcher(ledger, worker_name="w1")
    wait_for(new._hold_lease, "the takeover")
    before = snapshot(ledger)
    created, failed = old._create_all(claims)  # the receiver gets the stale batch
    assert failed == 0 and len(created) == 5 and len(batch_items(receiver)) == 1
    assert old._write_batch(old.lease, created) == 0
    assert snapshot(ledger) == before  # no binding, no mark, no audit entry
    # The current generation delivers: the names exist, are read back and bound
    # with the new, larger fencing tokens.
    try:
        wait_for(lambda: new.run_once() is not None and all(
            ledger.show(i).state == RequestState.DELIVERED for i in ids), "the new delivery")
    finally:
        new.release()
    stale_tokens = {claim.request_id: claim.fencing_token for claim in claims}
    for row in table(ledger, schema.binding):
        assert row["fencing_token"] > stale_tokens[row["request_id"]]
    assert len(receiver.objects) == 5 and ledger.check_invariants() == []


@pytest.mark.parametrize("crash_at", ["after_claim", "after_create", "after_binding"])
def test_a_worker_killed_at_each_step_of_a_batched_delivery_is_replaced_exactly_once(
    ledger: Quotagate, db_url: str, receiver: Receiver, crash_at: str
) -> None:
    receiver.initial_state = "completed"
    batched_target(ledger, receiver.url, 4)
    ids = submit_and_admit(ledger, 6)
    assert finish(start_worker(db_url, "w1", "--batch", "4", crash_at=crash_at)) == (
        -signal.SIGKILL)
    bindings = table(ledger, schema.binding)
    if crash_at == "after_claim":
        assert receiver.objects == {} and bindings == []
    elif crash_at == "after_create":
        assert len(receiver.objects) == 4 and bindings == []  # the chunk's reply was "lost"
    else:
        assert len(receiver.objects) == len(bindings) == 4
    assert finish(start_worker(db_url, "w1", "--until-idle")) == 0
    assert {ledger.show(i).state for i in ids} == {RequestState.COMPLETED}
    bindings = table(ledger, schema.binding)
    assert sorted(receiver.objects) == sorted(b["external_name"] for b in bindings)
    assert {b["uid"] for b in bindings} == {o["id"] for o in receiver.objects.values()}
    assert Counter(o["request_id"] for o in receiver.objects.values()) == Counter(ids)
    assert int(ledger.usage()["tenants"][0]["used"]) == 0 and ledger.check_invariants() == []


def test_concurrent_workers_with_batched_deliveries_never_deliver_one_request_twice_at_once(
    ledger: Quotagate, db_url: str, receiver: Receiver
) -> None:
    receiver.initial_state = "completed"
    receiver.post_delay = 0.01  # per item: long enough for concurrent chunks to overlap
    batched_target(ledger, receiver.url, 4)
    ids = submit_and_admit(ledger, 48)
    workers = [start_worker(db_url, f"w{n}", "--concurrency", "4", "--batch", "8",
                            "--lease-ttl", "10") for n in range(3)]
    try:
        wait_for(lambda: all(ledger.show(i).state == RequestState.COMPLETED for i in ids),
                 "every request to complete", timeout=120)
    finally:
        stop_all(workers)
    assert set(receiver.most_in_flight.values()) == {1}
    items = Counter(item["idempotency_key"] for batch in batch_items(receiver) for item in batch)
    assert items == Counter(ids)  # each request in exactly one delivered item
    assert int(ledger.usage()["tenants"][0]["used"]) == 0 and ledger.check_invariants() == []


# -- the target alone ------------------------------------------------------------------


def spec(number: int) -> DeliverySpec:
    return DeliverySpec(request_id=f"job-{number}", tenant="team-a", cost={"gpu": 1},
                        payload=None, fencing_token=number, external_name=f"team-a-job-{number}",
                        ledger_id="ledger-1")


@pytest.mark.parametrize("size", [0, -1, 501, 2.5, True, "8"])
def test_batch_deliver_must_be_a_whole_number_from_1_to_500(size: Any) -> None:
    with pytest.raises(InvalidInput, match="batch-deliver"):
        WebhookTarget({"url": "http://127.0.0.1:9/hooks", "batch_deliver": size},
                      ledger_id="ledger-1")


def test_an_answer_without_one_result_per_item_fails_every_item(receiver: Receiver) -> None:
    receiver.batch_answer = {"results": [{"status": 201, "object": {"id": "1"}}]}
    target = WebhookTarget({"url": receiver.url, "batch_deliver": 4}, ledger_id="ledger-1")
    try:
        results = target.create_many([spec(number) for number in range(1, 4)])
    finally:
        target.close()
    assert len(results) == 3
    assert all(isinstance(result, DeliveryFailed) for result in results)
    assert "one result per delivery" in str(results[0])


def test_more_specs_than_the_batch_size_go_in_several_calls(receiver: Receiver) -> None:
    target = WebhookTarget({"url": receiver.url, "batch_deliver": 2}, ledger_id="ledger-1")
    try:
        results = target.create_many([spec(number) for number in range(1, 6)])
    finally:
        target.close()
    assert [len(items) for items in batch_items(receiver)] == [2, 2, 1]
    assert [getattr(result, "request_id", None) for result in results] == [
        f"job-{number}" for number in range(1, 6)]
