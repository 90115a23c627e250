"""The kubernetes target through the REAL official client.

No Kubernetes API server can run on this machine, so the client talks to a
small HTTP server here that serves the custom-objects endpoints the target
uses: create (201 with a uid, 409 AlreadyExists on an existing name) and get
by name (200 / 404). Everything else about the client (serialisation, errors,
URLs) is the real thing; a real cluster is not tested here.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.naming import external_name, label_value
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.base import DeliveryFailed, DeliverySpec, IdentityMismatch
from quotagate.delivery.targets.kubernetes import KubernetesTarget
from quotagate.store import schema
from support.json_http import JsonHandler

_COLLECTION = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)$")
_ITEM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)/([^/?]+)$")


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ApiHandler)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.creates: list[tuple[str, ...]] = []
        self.drop_replies = 0
        self.lock = threading.Lock()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiHandler(JsonHandler):
    server: FakeApiServer

    def do_POST(self) -> None:
        match = _COLLECTION.match(self.path.split("?")[0])
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if match is None:
            self._reply(404, status(404, "NotFound", "no such collection"))
            return
        group, version, namespace, plural = match.groups()
        name = body["metadata"]["name"]
        key = (f"{group}/{version}/{plural}", namespace, name)
        with self.server.lock:
            self.server.creates.append((*key,))
            if key in self.server.objects:
                self._reply(409, status(409, "AlreadyExists", f'{plural} "{name}" already exists'))
                return
            body["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="1",
                                    creationTimestamp="2026-11-29T00:00:00Z")
            self.server.objects[key] = body
            if self.server.drop_replies:
                self.server.drop_replies -= 1
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
        self._reply(201, body)

    def do_GET(self) -> None:
        match = _ITEM.match(self.path.split("?")[0])
        if match is None:
            self._reply(404, status(404, "NotFound", "no such path"))
            return
        group, version, namespace, plural, name = match.groups()
        with self.server.lock:
            found = self.server.objects.get((f"{group}/{version}/{plural}", namespace, name))
        if found is None:
            self._reply(404, status(404, "NotFound", f'{plural} "{name}" not found'))
        else:
            self._reply(200, found)


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


LEDGER = "ledger-1"


def spec(request_id: str = "job:1", tenant: str = "team-a", token: int = 1) -> DeliverySpec:
    return DeliverySpec(request_id=request_id, tenant=tenant, cost={"gpu": 1},
                        payload={"model": "m"}, fencing_token=token,
                        external_name=external_name(LEDGER, tenant, request_id),
                        ledger_id=LEDGER)


def test_creates_a_model_service_with_identity_labels_and_fencing_annotation(
    api_server: FakeApiServer,
) -> None:
    target = KubernetesTarget({"host": api_server.host, "namespace": "ml"}, ledger_id=LEDGER)
    created = target.create_if_absent(spec(token=3))
    [(kind, namespace, name)] = list(api_server.objects)
    assert (kind, namespace) == ("quotagate.io/v1alpha1/modelservices", "ml")
    stored = api_server.objects[(kind, namespace, name)]
    assert stored["kind"] == "ModelService" and name == external_name(LEDGER, "team-a", "job:1")
    labels, annotations = stored["metadata"]["labels"], stored["metadata"]["annotations"]
    assert labels["quotagate.io/request-id"] == label_value("job:1")  # ':' is no label char
    assert labels["quotagate.io/tenant"] == "team-a"
    assert labels["quotagate.io/ledger"] == LEDGER
    assert annotations == {"quotagate.io/request-id": "job:1", "quotagate.io/ledger-id": LEDGER,
                           "quotagate.io/fencing-token": "3"}
    assert stored["spec"]["payload"] == {"model": "m"}
    assert created.uid == stored["metadata"]["uid"] and created.request_id == "job:1"
    assert target.read(name) is not None and target.read("absent") is None


def test_a_lost_reply_binds_the_existing_object_by_its_uid(api_server: FakeApiServer) -> None:
    target = KubernetesTarget({"host": api_server.host}, ledger_id=LEDGER)
    api_server.drop_replies = 1
    obtained = None
    for _attempt in range(3):  # a dropped reply surfaces as a failure, or the client retries
        try:
            obtained = target.create_if_absent(spec(token=2))
            break
        except DeliveryFailed:
            continue
    assert obtained is not None
    [stored] = api_server.objects.values()
    assert obtained.uid == stored["metadata"]["uid"]
    assert len(api_server.creates) >= 2  # the retry hit 409 and read the object back


def test_another_requests_object_under_the_name_fails_loudly(api_server: FakeApiServer) -> None:
    target = KubernetesTarget({"host": api_server.host}, ledger_id=LEDGER)
    theirs = spec(request_id="job:1")
    target.create_if_absent(theirs)
    impostor = DeliverySpec("job-2", "team-a", {"gpu": 1}, None, 1, theirs.external_name, LEDGER)
    with pytest.raises(IdentityMismatch) as error:
        target.create_if_absent(impostor)
    assert "job:1" in error.value.message


def test_group_version_plural_and_kind_are_configurable(api_server: FakeApiServer) -> None:
    target = KubernetesTarget({"host": api_server.host, "group": "ml.example.com",
                               "version": "v1", "plural": "inferencejobs",
                               "resource_kind": "InferenceJob"}, ledger_id=LEDGER)
    target.create_if_absent(spec())
    [(kind, namespace, _name)] = list(api_server.objects)
    assert (kind, namespace) == ("ml.example.com/v1/inferencejobs", "default")
    assert next(iter(api_server.objects.values()))["kind"] == "InferenceJob"


def test_status_phase_is_the_outcome(api_server: FakeApiServer) -> None:
    target = KubernetesTarget({"host": api_server.host}, ledger_id=LEDGER)
    created = target.create_if_absent(spec())
    assert target.outcomes([created]) == {}
    [stored] = api_server.objects.values()
    stored["status"] = {"phase": "Failed", "message": "image pull backoff"}
    outcome = target.outcomes([created]).get(created.request_id)
    assert outcome is not None and not outcome.completed
    assert outcome.reason == "image pull backoff"
    stored["status"] = {"phase": "Succeeded"}
    assert target.outcomes([created]) == {created.request_id: type(outcome)(completed=True)}


def test_dispatcher_delivers_to_kubernetes_and_completes_from_status(
    api_server: FakeApiServer, tmp_path: Path
) -> None:
    with Quotagate.connect(f"sqlite:///{tmp_path / 'ledger.db'}") as gate:
        gate.init()
        gate.set_tenant("team-a", {"gpu": 2})
        gate.set_pool("pool-1", {"gpu": 2})
        TargetStore(gate.engine).set("cluster", "kubernetes", {"host": api_server.host},
                                     default=True)
        gate.submit("job-1", "team-a", {"gpu": 2})
        gate.admit()
        dispatcher = Dispatcher(gate, worker_name="w1")
        dispatcher.run_once()
        assert gate.show("job-1").state == RequestState.DELIVERED
        [stored] = api_server.objects.values()
        with gate.engine.connect() as connection:
            binding = connection.execute(schema.binding.select()).mappings().one()
        assert binding["uid"] == stored["metadata"]["uid"]
        assert binding["external_name"] == stored["metadata"]["name"]
        stored["status"] = {"phase": "Completed"}
        dispatcher.run_once()
        assert gate.show("job-1").state == RequestState.COMPLETED
        assert gate.usage()["tenants"][0]["used"] == 0
        dispatcher.release()
