"""The in-suite API server refuses what a real one refuses, and the target reacts as it should.

First half: the official client against ``tests/support/kube_api`` directly —
a hard-coded apiVersion, a body namespace differing from the URL's, invalid
names and labels, schema violations, unknown resources, selectors, watches
from a compacted version, credentials and RBAC — each answered with the
status and ``Status`` body a real API server sends.

Second half: every kind of error answer through the kubernetes target, and
whether the worker retries it (``DeliveryFailed``) or gives up at once
(``ObjectRejected``), with a message that says what to check.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.base import DeliveryFailed
from quotagate.delivery.targets.kubernetes import ObjectRejected
from quotagate.errors import Conflict
from quotagate.store import schema
from support.kube_api import KubeApiServer
from support.kube_api.access import load_role
from support.kube_api.store import MODEL_SERVICE_CRD, load_crd
from support.kube_api.targets import BuildTarget, delivery_spec, target_factory
from support.waiting import wait_for

GROUP, VERSION, PLURAL = "quotagate.io", "v1alpha1", "modelservices"


@pytest.fixture
def api(kube_api: KubeApiServer) -> Iterator[client.CustomObjectsApi]:
    configuration = client.Configuration()
    configuration.host = kube_api.host
    api_client = client.ApiClient(configuration)
    yield client.CustomObjectsApi(api_client)
    api_client.close()


@pytest.fixture
def targets(kube_api: KubeApiServer) -> Iterator[BuildTarget]:
    with target_factory(kube_api) as build:
        yield build


def model_service(name: str = "ms-1", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelService",
        "metadata": {"name": name, "labels": {"quotagate.io/ledger": "l1"}},
        "spec": {"requestId": "job-1", "tenant": "team-a", "cost": {"gpu": 1},
                 "payload": {"deep": {"any": ["thing"]}}},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            body[section][field] = value
        else:
            body[section] = value
    return body


def create(api: client.CustomObjectsApi, body: dict[str, Any], namespace: str = "default") -> Any:
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def refused(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as error:
        call()
    return error.value.status, json.loads(error.value.body)


# -- what the server refuses ---------------------------------------------------------


def test_a_hard_coded_api_version_is_refused(api: client.CustomObjectsApi) -> None:
    code, body = refused(lambda: create(api, model_service(apiVersion="quotagate.io/v1")))
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"] == ("the API version in the data (quotagate.io/v1) does not match "
                               "the expected API version (quotagate.io/v1alpha1)")
    code, body = refused(lambda: create(api, model_service(kind="InferenceJob")))
    assert code == 400 and "kind in the data (InferenceJob)" in body["message"]


def test_a_body_namespace_differing_from_the_urls_is_refused(
    api: client.CustomObjectsApi, kube_api: KubeApiServer
) -> None:
    kube_api.store.namespaces.add("ml")
    code, body = refused(lambda: create(api, model_service(metadata__namespace="ml")))
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"] == ("the namespace of the provided object does not match the "
                               "namespace sent on the request")
    assert kube_api.model_services() == []


@pytest.mark.parametrize(("labels", "wrong"), [
    ({"quotagate.io/request-id": "job:1"}, "job:1"),  # ':' is no label character
    ({"quotagate.io/tenant": "x" * 64}, "x" * 64),  # longer than 63
    ({"quotagate.io/tenant": "-team"}, "-team"),  # must start alphanumeric
    ({"Quotagate.IO/tenant": "a"}, "Quotagate.IO/tenant"),  # the prefix is a DNS subdomain
    ({"quotagate.io/a/b": "a"}, "quotagate.io/a/b"),
])
def test_an_invalid_label_is_refused_as_invalid(
    api: client.CustomObjectsApi, labels: dict[str, str], wrong: str
) -> None:
    code, body = refused(lambda: create(api, model_service(metadata__labels=labels)))
    assert (code, body["reason"]) == (422, "Invalid")
    [cause] = body["details"]["causes"]
    assert cause["field"] == "metadata.labels" and f'"{wrong}"' in cause["message"]
    assert body["details"]["kind"] == "ModelService" and body["details"]["group"] == GROUP


@pytest.mark.parametrize("name", ["Job-1", "job_1", "-job", "a" * 254, ""])
def test_a_name_that_is_no_dns_subdomain_is_refused(api: client.CustomObjectsApi, name: str) -> None:
    code, body = refused(lambda: create(api, model_service(name)))
    assert (code, body["reason"]) == (422, "Invalid")
    assert {cause["field"] for cause in body["details"]["causes"]} == {"metadata.name"}


def test_the_crds_schema_is_enforced_and_unknown_fields_are_pruned(
    api: client.CustomObjectsApi,
) -> None:
    spec = {"requestId": "job-1", "cost": {"gpu": "one"}}
    code, body = refused(lambda: create(api, model_service(spec=spec)))
    assert code == 422
    assert {(cause["field"], cause["reason"]) for cause in body["details"]["causes"]} == {
        ("spec.cost.gpu", "FieldValueTypeInvalid"), ("spec.tenant", "FieldValueRequired")}
    created = create(api, model_service(spec__surprise=1))
    assert "surprise" not in created["spec"]  # pruned, as a structural schema prunes
    assert created["spec"]["payload"] == {"deep": {"any": ["thing"]}}  # preserved
    code, body = refused(lambda: api.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "ms-1", {"status": {"phase": "Exploded"}}))
    assert code == 422 and body["details"]["causes"][0]["reason"] == "FieldValueNotSupported"


def test_status_is_a_subresource(api: client.CustomObjectsApi) -> None:
    created = create(api, model_service(status={"phase": "Completed"}))
    assert "status" not in created  # create ignores status
    patched = api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ms-1",
                                                 {"status": {"phase": "Failed"}})
    assert "status" not in patched  # so does a patch of the main resource
    patched = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "ms-1",
        {"status": {"phase": "Running"}, "spec": {"tenant": "team-b"}})
    assert patched["status"] == {"phase": "Running"} and patched["spec"]["tenant"] == "team-a"
    assert patched["metadata"]["generation"] == 1  # a status change is no new generation


def test_missing_resources_and_namespaces_answer_404_as_a_real_server_does(
    api: client.CustomObjectsApi,
) -> None:
    code, body = refused(lambda: api.list_namespaced_custom_object(GROUP, VERSION, "default",
                                                                   "inferencejobs"))
    assert (code, body["message"]) == (404, "the server could not find the requested resource")
    with pytest.raises(ApiException) as error:  # a group nobody serves: not even a Status
        api.list_namespaced_custom_object("ml.example.com", "v1", "default", "inferencejobs")
    assert error.value.status == 404 and error.value.body.strip() == "404 page not found"
    code, body = refused(lambda: create(api, model_service(), namespace="ml"))
    assert (code, body["message"]) == (404, 'namespaces "ml" not found')
    code, body = refused(lambda: api.get_namespaced_custom_object(GROUP, VERSION, "default",
                                                                  PLURAL, "absent"))
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": 'modelservices.quotagate.io "absent" not found',
                    "reason": "NotFound", "code": 404,
                    "details": {"name": "absent", "group": GROUP, "kind": PLURAL}}


def test_already_exists_is_a_409_with_the_real_status_body(api: client.CustomObjectsApi) -> None:
    create(api, model_service())
    code, body = refused(lambda: create(api, model_service()))
    assert code == 409
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": 'modelservices.quotagate.io "ms-1" already exists',
                    "reason": "AlreadyExists", "code": 409,
                    "details": {"name": "ms-1", "group": GROUP, "kind": PLURAL}}


def test_delete_preconditions_are_checked(api: client.CustomObjectsApi) -> None:
    create(api, model_service())
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-its-uid"))
    code, body = refused(lambda: api.delete_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "ms-1", body=options))
    assert (code, body["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID in precondition: not-its-uid" in body["message"]


@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=gold", ["a"]), ("tier==gold", ["a"]), ("tier!=gold", ["b", "c"]),
    ("tier in (gold,silver)", ["a", "b"]), ("tier notin (gold)", ["b", "c"]),
    ("tier", ["a", "b"]), ("!tier", ["c"]), ("tier=gold,zone=eu", ["a"]), ("tier=gold,zone=us", []),
])
def test_list_filters_by_label_selector(
    api: client.CustomObjectsApi, selector: str, expected: list[str]
) -> None:
    for name, labels in (("a", {"tier": "gold", "zone": "eu"}), ("b", {"tier": "silver"}),
                         ("c", {})):
        create(api, model_service(name, metadata__labels=labels))
    found = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                              label_selector=selector)
    assert [item["metadata"]["name"] for item in found["items"]] == expected
    assert found["kind"] == "ModelServiceList"


def test_a_list_is_paged_from_one_snapshot(api: client.CustomObjectsApi) -> None:
    for index in range(5):
        create(api, model_service(f"ms-{index}"))
    first = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, limit=2)
    create(api, model_service("ms-late"))  # after the snapshot: on no page
    pages = [first]
    while pages[-1]["metadata"].get("continue"):
        pages.append(api.list_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, limit=2, _continue=pages[-1]["metadata"]["continue"]))
    assert [[item["metadata"]["name"] for item in page["items"]] for page in pages] == [
        ["ms-0", "ms-1"], ["ms-2", "ms-3"], ["ms-4"]]
    assert {page["metadata"]["resourceVersion"] for page in pages} == {
        first["metadata"]["resourceVersion"]}
    code, body = refused(lambda: api.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, limit=2, _continue=first["metadata"]["continue"]))
    assert (code, body["reason"]) == (410, "Expired")  # a continue token is used once here


@pytest.mark.parametrize("selector", ["tier gold", "tier in gold", "Bad Key=1", "tier=a b",
                                      "tier=job:1"])
def test_an_invalid_label_selector_is_refused(api: client.CustomObjectsApi, selector: str) -> None:
    code, body = refused(lambda: api.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, label_selector=selector))
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"].startswith("unable to parse requirement")


def test_every_write_moves_the_resource_version_and_a_watch_replays_what_came_after(
    api: client.CustomObjectsApi, kube_api: KubeApiServer
) -> None:
    create(api, model_service("before"))
    listed = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    since = listed["metadata"]["resourceVersion"]
    created = create(api, model_service("ms-1"))
    patched = api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "ms-1",
                                                        {"status": {"phase": "Running"}})
    api.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ms-1")
    versions = [int(since), int(created["metadata"]["resourceVersion"]),
                int(patched["metadata"]["resourceVersion"])]
    assert versions == sorted(set(versions))  # strictly increasing
    events = [(event["type"], event["raw_object"]["metadata"]["name"],
               int(event["raw_object"]["metadata"]["resourceVersion"]))
              for event in watch.Watch().stream(
                  api.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                  resource_version=since, timeout_seconds=1)]
    assert [(kind, name) for kind, name, _ in events] == [
        ("ADDED", "ms-1"), ("MODIFIED", "ms-1"), ("DELETED", "ms-1")]
    assert [version for _, _, version in events] == sorted({version for _, _, version in events})
    kube_api.store.compact()
    with pytest.raises(ApiException) as error:
        list(watch.Watch().stream(api.list_namespaced_custom_object, GROUP, VERSION, "default",
                                  PLURAL, resource_version=since, timeout_seconds=1))
    assert error.value.status == 410 and "too old resource version" in str(error.value.reason)


def test_a_watch_only_sees_objects_its_selector_selects(
    api: client.CustomObjectsApi,
) -> None:
    since = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["metadata"][
        "resourceVersion"]
    create(api, model_service("ours", metadata__labels={"quotagate.io/ledger": "l1"}))
    create(api, model_service("theirs", metadata__labels={"quotagate.io/ledger": "l2"}))
    api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ours",
                                       {"metadata": {"labels": {"quotagate.io/ledger": "l3"}}})
    events = [(event["type"], event["raw_object"]["metadata"]["name"])
              for event in watch.Watch().stream(
                  api.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                  label_selector="quotagate.io/ledger=l1", resource_version=since,
                  timeout_seconds=1)]
    assert events == [("ADDED", "ours"), ("DELETED", "ours")]  # relabelled out of the selection


def test_credentials_and_rbac_are_enforced(kube_api: KubeApiServer, tmp_path: Path) -> None:
    role = load_role()
    kube_api.require_token("worker-token", role.without("delete"))
    configuration = client.Configuration()
    configuration.host = kube_api.host
    anonymous = client.CustomObjectsApi(client.ApiClient(configuration))
    code, body = refused(lambda: create(anonymous, model_service()))
    assert (code, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
    configuration.api_key = {"BearerToken": "Bearer worker-token"}
    worker = client.CustomObjectsApi(client.ApiClient(configuration))
    create(worker, model_service())
    code, body = refused(lambda: worker.delete_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "ms-1"))
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"] == (
        'modelservices.quotagate.io "ms-1" is forbidden: User '
        '"system:serviceaccount:default:quotagate-worker" cannot delete resource "modelservices" '
        'in API group "quotagate.io" in the namespace "default"')
    kube_api.store.namespaces.add("ml")
    code, body = refused(lambda: create(worker, model_service(), namespace="ml"))
    assert code == 403  # the Role is for namespace default only
    anonymous.api_client.close()
    worker.api_client.close()


# -- how the target reacts to each answer --------------------------------------------


def test_the_shipped_role_allows_everything_the_target_does(
    kube_api: KubeApiServer, targets: BuildTarget, tmp_path: Path
) -> None:
    kube_api.require_token("worker-token", load_role())
    kubeconfig = str(kube_api.kubeconfig(tmp_path / "kubeconfig", "worker-token"))
    deleting, suspending = targets(kubeconfig=kubeconfig), targets(kubeconfig=kubeconfig,
                                                                   stop="suspend")
    first = deleting.create_if_absent(delivery_spec("job-1"))
    second = suspending.create_if_absent(delivery_spec("job-2"))
    assert deleting.create_if_absent(delivery_spec("job-1")).uid == first.uid  # 409, read back
    kube_api.set_status(first.name, phase="Completed")
    wait_for(lambda: deleting.outcomes([first, second]), "an outcome through list and watch")
    assert not suspending.stop(second, 2).stopped  # patched spec.suspend
    assert deleting.stop(first, 2).stopped  # deleted
    assert {call.verb for call in kube_api.calls} == {"create", "get", "list", "watch", "patch",
                                                      "delete"}


@pytest.mark.parametrize("verb", ["create", "get", "delete", "patch"])
def test_a_verb_missing_from_the_role_is_a_clear_retryable_error(
    kube_api: KubeApiServer, targets: BuildTarget, tmp_path: Path, verb: str
) -> None:
    kube_api.require_token("worker-token", load_role().without(verb))
    target = targets(kubeconfig=str(kube_api.kubeconfig(tmp_path / "kubeconfig", "worker-token")),
                     stop="suspend" if verb == "patch" else "delete")
    if verb == "create":
        with pytest.raises(DeliveryFailed) as error:
            target.create_if_absent(delivery_spec())
        message = error.value.message
        assert error.value.code == "kubernetes_forbidden"
    elif verb == "get":
        with pytest.raises(DeliveryFailed) as error:
            target.read("ms-1")
        message = error.value.message
    else:
        obtained = target.create_if_absent(delivery_spec())
        result = target.stop(obtained, 2)
        assert not result.stopped and len(kube_api.model_services()) == 1
        message = result.reason or ""
    assert "403 Forbidden" in message and f"cannot {verb} resource" in message
    assert f"needs {verb!r}" in message and "deploy/rbac/worker-role.yaml" in message


def test_refused_credentials_are_a_clear_retryable_error(
    kube_api: KubeApiServer, targets: BuildTarget, tmp_path: Path
) -> None:
    kube_api.require_token("the-real-token")
    target = targets(kubeconfig=str(kube_api.kubeconfig(tmp_path / "kubeconfig", "a-stale-token")))
    with pytest.raises(DeliveryFailed) as error:
        target.create_if_absent(delivery_spec())
    assert not isinstance(error.value, ObjectRejected)
    assert error.value.code == "kubernetes_unauthorized" and "401 Unauthorized" in error.value.message
    assert "token" in error.value.message and "a-stale-token" not in error.value.message


@pytest.mark.parametrize(("config", "expected"), [
    ({"plural": "inferencejobs", "resource_kind": "InferenceJob"},
     "the server could not find the requested resource"),
    ({"group": "ml.example.com"}, "404 page not found"),
    ({"namespace": "ml"}, 'namespaces "ml" not found'),
])
def test_a_missing_crd_or_namespace_is_a_clear_retryable_error(
    targets: BuildTarget, config: dict[str, str], expected: str
) -> None:
    target = targets(**config)
    with pytest.raises(DeliveryFailed) as error:
        target.create_if_absent(delivery_spec())
    assert error.value.code == "kubernetes_not_found"
    assert expected in error.value.message and "deploy/crds/modelservice.yaml" in error.value.message
    with pytest.raises(DeliveryFailed):
        target.read("anything")  # not taken for "no such object"


def test_an_object_the_crd_refuses_is_rejected_without_retrying(
    kube_api: KubeApiServer, targets: BuildTarget, tmp_path: Path
) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text(MODEL_SERVICE_CRD.read_text().replace(
        "required: [requestId, tenant]", "required: [requestId, tenant, model]"))
    kube_api.store.serve(load_crd(strict))
    with pytest.raises(ObjectRejected) as error:
        targets().create_if_absent(delivery_spec())
    assert isinstance(error.value, Conflict)  # the worker fails the request at once
    assert "422 Invalid" in error.value.message and "spec.model: Required value" in error.value.message
    assert error.value.fields["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.model"}]


@pytest.mark.parametrize("code", [500, 503, 504])
def test_server_errors_are_retryable(kube_api: KubeApiServer, targets: BuildTarget,
                                     code: int) -> None:
    target = targets()
    kube_api.inject("create", code)
    with pytest.raises(DeliveryFailed) as error:
        target.create_if_absent(delivery_spec())
    assert error.value.code == "kubernetes_unavailable" and f"{code} " in error.value.message
    assert target.create_if_absent(delivery_spec()).created_now  # the retry goes through


def test_throttling_is_retryable_and_keeps_retry_after(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    kube_api.inject("create", 429, retry_after=3)
    with pytest.raises(DeliveryFailed) as error:
        targets().create_if_absent(delivery_spec())
    assert error.value.code == "kubernetes_throttled" and error.value.fields["retry_after"] == 3
    assert "429 TooManyRequests" in error.value.message and "retry after 3s" in error.value.message


def test_a_timeout_is_retryable_and_the_late_create_is_adopted(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets(timeout=0.3)
    kube_api.inject("create", delay=1.0)  # the server acts, but only after the client gave up
    with pytest.raises(DeliveryFailed) as error:
        target.create_if_absent(delivery_spec())
    assert error.value.code == "kubernetes_timeout" and "within 0.3s" in error.value.message
    wait_for(kube_api.model_services, "the late create to land")
    obtained = target.create_if_absent(delivery_spec(token=2))
    [stored] = kube_api.model_services()
    assert obtained.uid == stored["metadata"]["uid"] and not obtained.created_now


def test_an_unreachable_api_server_is_retryable_and_shows_no_credentials(
    targets: BuildTarget,
) -> None:
    target = targets(host="http://admin:s3cret@127.0.0.1:9")
    with pytest.raises(DeliveryFailed) as error:
        target.create_if_absent(delivery_spec())
    assert error.value.code == "kubernetes_unreachable"
    assert "127.0.0.1:9" in error.value.message and "s3cret" not in error.value.message


def _gate(gate: Quotagate, kube_api: KubeApiServer) -> Dispatcher:
    gate.set_tenant("team-a", {"gpu": 2})
    gate.set_pool("pool-1", {"gpu": 2})
    TargetStore(gate.engine).set("cluster", "kubernetes", {"host": kube_api.host, "timeout": 2.0},
                                 default=True)
    gate.submit("job-1", "team-a", {"gpu": 1})
    gate.admit()
    return Dispatcher(gate, worker_name="w1", retry_base=0.05, max_attempts=5)


def _outbox(gate: Quotagate) -> Any:
    with gate.engine.connect() as connection:
        return connection.execute(schema.outbox.select()).mappings().one()


def test_the_worker_gives_up_at_once_on_a_rejected_object(
    kube_api: KubeApiServer, db_url: str, tmp_path: Path
) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text(MODEL_SERVICE_CRD.read_text().replace(
        "required: [requestId, tenant]", "required: [requestId, tenant, model]"))
    kube_api.store.serve(load_crd(strict))
    with Quotagate.connect(db_url) as gate:
        dispatcher = _gate(gate, kube_api)
        try:
            dispatcher.run_once()
            assert gate.show("job-1").state == RequestState.FAILED
            assert len(kube_api.calls_of("create")) == 1  # not retried
            assert gate.usage()["tenants"][0]["used"] == 0
        finally:
            dispatcher.release()


def test_the_worker_retries_a_throttled_delivery_and_then_delivers(
    kube_api: KubeApiServer, db_url: str
) -> None:
    kube_api.inject("create", 429, retry_after=1)
    with Quotagate.connect(db_url) as gate:
        dispatcher = _gate(gate, kube_api)
        try:
            dispatcher.run_once()
            assert gate.show("job-1").state == RequestState.RESERVED
            row = _outbox(gate)
            assert row["attempts"] == 1 and "429" in row["last_error"]
            wait_for(lambda: dispatcher.run_once() or gate.show("job-1").state
                     == RequestState.DELIVERED, "the retried delivery")
            assert len(kube_api.model_services()) == 1
        finally:
            dispatcher.release()
