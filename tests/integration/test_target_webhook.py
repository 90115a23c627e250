"""The webhook target against a real HTTP server on 127.0.0.1 (not a mock).

The server behaves like an idempotent receiver: objects keyed by name, 409 on
a second POST of a name, ``GET /hooks/<name>`` to read back, and it can drop
a reply after acting on the request (a lost reply: docs/delivery.md).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    IdentityMismatch,
    Outcome,
)
from quotagate.delivery.targets.webhook import WebhookTarget
from quotagate.errors import InvalidInput
from quotagate.store import schema
from support.json_http import JsonHandler


class Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.objects: dict[str, dict[str, Any]] = {}
        self.posts: list[dict[str, Any]] = []
        # What each POST was answered (0: acted on, reply dropped) and each GET asked for.
        self.answers: list[int] = []
        self.reads: list[str] = []
        self.batch_reads: list[list[str]] = []
        self.fail_posts = 0
        self.drop_replies = 0
        self.redirect_posts = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks"


class Handler(JsonHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/_read"):
            with self.server.lock:
                self.server.batch_reads.append(body["names"])
                found = {name: self.server.objects[name] for name in body["names"]
                         if name in self.server.objects}
            self._reply(200, {"objects": found})
            return
        with self.server.lock:
            self.server.posts.append({"body": body, "headers": dict(self.headers)})
            if self.server.redirect_posts:
                self.server.redirect_posts -= 1
                self.server.answers.append(307)
                self.send_response(307)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.server.fail_posts:
                self.server.fail_posts -= 1
                self.server.answers.append(500)
                self._reply(500, {"error": "busy"})
                return
            name = body["name"]
            if name in self.server.objects:
                self.server.answers.append(409)
                self._reply(409, {"error": "exists"})
                return
            stored = {"id": uuid.uuid4().hex, "name": name, "request_id": body["request_id"],
                      "ledger_id": body["ledger_id"],
                      "fencing_token": body["fencing_token"], "state": "running"}
            self.server.objects[name] = stored
            if self.server.drop_replies:
                self.server.drop_replies -= 1
                self.server.answers.append(0)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)  # acted, but the reply is lost
                return
            self.server.answers.append(201)
        self._reply(201, stored)

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        with self.server.lock:
            self.server.reads.append(name)
            found = self.server.objects.get(name)
        if found is None:
            self._reply(404, {"error": "not found"})
        else:
            self._reply(200, found)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


LEDGER = "ledger-1"


def spec(request_id: str = "job-1", token: int = 1, name: str = "team-a-job-1-0") -> DeliverySpec:
    return DeliverySpec(request_id=request_id, tenant="team-a", cost={"gpu": 1},
                        payload={"model": "m"}, fencing_token=token, external_name=name,
                        ledger_id=LEDGER)


def test_create_sends_idempotency_key_and_fencing_token(receiver: Receiver) -> None:
    target = WebhookTarget({"url": receiver.url}, ledger_id=LEDGER)
    created = target.create_if_absent(spec(token=7))
    [post] = receiver.posts
    assert post["headers"]["Idempotency-Key"] == "job-1"
    assert post["headers"]["Quotagate-Fencing-Token"] == "7"
    assert post["body"]["payload"] == {"model": "m"} and post["body"]["tenant"] == "team-a"
    assert created.uid == receiver.objects["team-a-job-1-0"]["id"] and created.created_now
    assert post["headers"]["Quotagate-Ledger"] == LEDGER and post["body"]["ledger_id"] == LEDGER
    assert target.read("team-a-job-1-0") == created.__class__(created.name, created.uid, "job-1",
                                                              ledger_id=LEDGER)
    assert target.read("absent") is None


def test_credentials_in_the_url_go_as_basic_auth_and_not_in_the_url(receiver: Receiver) -> None:
    port = receiver.server_address[1]
    url = f"http://hook%40user:pa55%3Aword@127.0.0.1:{port}/hooks"
    target = WebhookTarget({"url": url}, ledger_id=LEDGER)
    target.create_if_absent(spec())
    [post] = receiver.posts
    expected = base64.b64encode(b"hook@user:pa55:word").decode()
    assert post["headers"]["Authorization"] == f"Basic {expected}"
    assert "pa55" not in json.dumps(post["body"]) and "pa55" not in target.url


def test_a_lost_reply_is_resolved_by_reading_back_not_by_creating_again(
    receiver: Receiver,
) -> None:
    target = WebhookTarget({"url": receiver.url, "timeout": 5}, ledger_id=LEDGER)
    receiver.drop_replies = 1
    with pytest.raises(DeliveryFailed):
        target.create_if_absent(spec())
    again = target.create_if_absent(spec(token=2))  # the retry: 409, then GET
    # The first POST acted (its reply lost); the retry was refused as a duplicate
    # and resolved by reading the object back by its name.
    assert receiver.answers == [0, 409]
    assert receiver.reads == ["team-a-job-1-0"]
    assert again.uid == receiver.objects["team-a-job-1-0"]["id"]
    assert not again.created_now


def test_an_object_of_another_request_under_the_name_is_refused(receiver: Receiver) -> None:
    target = WebhookTarget({"url": receiver.url}, ledger_id=LEDGER)
    target.create_if_absent(spec(request_id="other"))
    with pytest.raises(IdentityMismatch) as error:
        target.create_if_absent(spec(request_id="job-1"))
    assert "other" in error.value.message


def test_outcome_follows_the_state_the_receiver_reports(receiver: Receiver) -> None:
    target = WebhookTarget({"url": receiver.url}, ledger_id=LEDGER)
    created = target.create_if_absent(spec())
    assert target.outcomes([created]) == {}
    receiver.objects[created.name]["state"] = "failed"
    receiver.objects[created.name]["reason"] = "out of memory"
    outcome = target.outcomes([created]).get(created.request_id)
    assert outcome is not None and not outcome.completed and outcome.reason == "out of memory"


def test_poll_every_reads_each_object_at_most_once_per_interval(receiver: Receiver) -> None:
    now = [100.0]
    target = WebhookTarget({"url": receiver.url, "poll_every": 30}, ledger_id=LEDGER,
                           monotonic=lambda: now[0])
    first = target.create_if_absent(spec())
    second = target.create_if_absent(spec("job-2", name="team-a-job-2-0"))
    receiver.objects[first.name]["state"] = "completed"
    assert target.outcomes([first, second]) == {}  # just seen: the first read is 30 s away
    now[0] += 29
    assert target.outcomes([first, second]) == {} and receiver.reads == []
    now[0] += 1
    assert target.outcomes([first, second]) == {"job-1": Outcome(completed=True)}
    assert sorted(receiver.reads) == [first.name, second.name]
    now[0] += 10
    assert target.outcomes([second]) == {} and len(receiver.reads) == 2  # read 10 s ago
    now[0] += 20
    del receiver.objects[second.name]
    assert target.outcomes([second]) == {
        "job-2": Outcome(completed=False, reason="the webhook object disappeared")}


def test_batch_read_reads_many_outcomes_in_one_call(receiver: Receiver) -> None:
    target = WebhookTarget({"url": receiver.url, "batch_read": True}, ledger_id=LEDGER)
    objects = [target.create_if_absent(spec(f"job-{n}", name=f"team-a-job-{n}-0"))
               for n in range(3)]
    receiver.objects[objects[0].name]["state"] = "completed"
    receiver.objects[objects[1].name].update(state="failed", reason="evicted")
    del receiver.objects[objects[2].name]
    assert target.outcomes(objects) == {
        "job-0": Outcome(completed=True),
        "job-1": Outcome(completed=False, reason="evicted"),
        "job-2": Outcome(completed=False, reason="the webhook object disappeared"),
    }
    assert receiver.batch_reads == [[obtained.name for obtained in objects]]
    assert receiver.reads == []


def test_poll_every_must_not_be_negative() -> None:
    with pytest.raises(InvalidInput):
        WebhookTarget({"url": "http://127.0.0.1:9/hooks", "poll_every": -1}, ledger_id=LEDGER)


def test_an_unreachable_receiver_is_a_retryable_failure_that_names_no_secret() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = WebhookTarget({"url": f"http://127.0.0.1:{port}/hooks?key=s3cret", "timeout": 2},
                           ledger_id=LEDGER)
    with pytest.raises(DeliveryFailed) as failed:
        target.create_if_absent(spec())
    assert "unreachable" in failed.value.fields["public"]
    assert "s3cret" not in str(failed.value)
    assert "s3cret" not in str(failed.value.fields)


def test_a_redirect_is_not_followed_nor_the_post_sent_again(receiver: Receiver) -> None:
    target = WebhookTarget({"url": receiver.url, "timeout": 5}, ledger_id=LEDGER)
    receiver.redirect_posts = 1
    with pytest.raises(DeliveryFailed, match="answered 307"):
        target.create_if_absent(spec())
    assert receiver.answers == [307]
    assert [post["body"]["request_id"] for post in receiver.posts] == ["job-1"]


def test_dispatcher_delivers_through_the_webhook_and_retries_after_a_500(
    receiver: Receiver, tmp_path: Path
) -> None:
    with Quotagate.connect(f"sqlite:///{tmp_path / 'ledger.db'}") as gate:
        gate.init()
        gate.set_tenant("team-a", {"gpu": 2})
        gate.set_pool("pool-1", {"gpu": 2})
        TargetStore(gate.engine).set("hook", "webhook", {"url": receiver.url}, default=True)
        gate.submit("job-1", "team-a", {"gpu": 1})
        gate.admit()
        receiver.fail_posts = 1
        dispatcher = Dispatcher(gate, worker_name="w1", retry_base=0.2)
        dispatcher.run_once()
        assert gate.show("job-1").state == RequestState.RESERVED
        deadline = time.monotonic() + 20
        while gate.show("job-1").state == RequestState.RESERVED and time.monotonic() < deadline:
            dispatcher.run_once()
            time.sleep(0.05)
        assert gate.show("job-1").state == RequestState.DELIVERED
        stored = next(iter(receiver.objects.values()))
        with gate.engine.connect() as connection:
            binding = connection.execute(schema.binding.select()).mappings().one()
        assert binding["uid"] == stored["id"]
        assert binding["fencing_token"] == stored["fencing_token"] == 2  # second claim
        stored["state"] = "completed"
        dispatcher.run_once()
        assert gate.show("job-1").state == RequestState.COMPLETED
        # One refused POST, one that created the object; then only reads.
        assert receiver.answers == [500, 201]
        assert gate.check_invariants() == []
        dispatcher.release()
