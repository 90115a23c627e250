"""The kubernetes target through the REAL official client, against the in-suite API server.

No Kubernetes API server can run on this machine; ``tests/support/kube_api``
serves the custom-objects API the way a real one does (the CRD from
deploy/crds/, validation, list/watch with resourceVersions, Status errors).
Its own fidelity is tested in test_kubernetes_api.py; here: what the target
does with it — create and adopt, outcomes from one list and a watch, deleted
objects, stops, ledgers sharing a namespace — and the dispatcher on every
SQL backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.naming import label_value
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets import kubernetes_watch
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    ExternalObject,
    IdentityMismatch,
    Outcome,
)
from quotagate.store import schema
from support.kube_api import KubeApiServer
from support.kube_api.access import load_role
from support.kube_api.store import MODEL_SERVICE_CRD, load_crd
from support.kube_api.targets import LEDGER, BuildTarget, delivery_spec, target_factory
from support.waiting import wait_for


@pytest.fixture
def targets(kube_api: KubeApiServer) -> Iterator[BuildTarget]:
    with target_factory(kube_api) as build:
        yield build


def test_creates_a_model_service_carrying_ledger_request_and_fencing_token(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    kube_api.store.namespaces.add("ml")
    target = targets(namespace="ml")
    created = target.create_if_absent(delivery_spec(token=3))
    [stored] = kube_api.model_services()
    metadata = stored["metadata"]
    assert (stored["apiVersion"], stored["kind"]) == ("quotagate.io/v1alpha1", "ModelService")
    assert metadata["namespace"] == "ml" and metadata["name"] == delivery_spec().external_name
    assert metadata["labels"] == {
        "quotagate.io/request-id": label_value("job:1"),  # ':' is no label character
        "quotagate.io/tenant": "team-a",
        "quotagate.io/ledger": LEDGER,
        "app.kubernetes.io/managed-by": "quotagate",
    }
    assert metadata["annotations"] == {"quotagate.io/request-id": "job:1",
                                       "quotagate.io/ledger-id": LEDGER,
                                       "quotagate.io/fencing-token": "3",
                                       "quotagate.io/attempt": "1"}
    assert stored["spec"] == {"requestId": "job:1", "tenant": "team-a", "cost": {"gpu": 1},
                              "payload": {"model": "m"}}
    assert created == ExternalObject(metadata["name"], metadata["uid"], "job:1",
                                     created_now=True, ledger_id=LEDGER)
    assert target.read(metadata["name"]) == ExternalObject(metadata["name"], metadata["uid"],
                                                           "job:1", ledger_id=LEDGER)
    assert target.read("absent") is None


def test_a_lost_reply_is_resolved_by_reading_back_and_binding_the_same_uid(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    kube_api.inject("create", drop_reply=True)
    with pytest.raises(DeliveryFailed):
        target.create_if_absent(delivery_spec())  # created, but the reply never came
    obtained = target.create_if_absent(delivery_spec(token=2))  # the retry: 409, read back
    [stored] = kube_api.model_services()
    assert obtained.uid == stored["metadata"]["uid"] and not obtained.created_now
    assert len(kube_api.calls_of("create")) == 2


def test_another_requests_object_under_our_name_is_never_adopted(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    theirs = delivery_spec("job:1")
    target.create_if_absent(theirs)
    impostor = dataclasses.replace(delivery_spec("job-2"), external_name=theirs.external_name)
    with pytest.raises(IdentityMismatch) as error:
        target.create_if_absent(impostor)
    assert "job:1" in error.value.message


def test_two_ledgers_in_one_namespace_never_adopt_or_see_each_others_objects(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    staging, production = targets(ledger="staging1"), targets(ledger="production1")
    ours = staging.create_if_absent(delivery_spec("job-1", ledger="staging1"))
    theirs = production.create_if_absent(delivery_spec("job-1", ledger="production1"))
    assert ours.name != theirs.name  # the ledger id is in the name's hash
    # Same request id and tenant under the other ledger's name: refused, nothing created.
    forged = dataclasses.replace(delivery_spec("job-1", ledger="production1"),
                                 external_name=ours.name)
    with pytest.raises(IdentityMismatch) as error:
        production.create_if_absent(forged)
    assert "staging1" in error.value.message
    assert len(kube_api.model_services()) == 2
    # Each ledger lists and watches only its own label.
    assert production.outcomes([theirs]) == {}
    kube_api.set_status(ours.name, phase="Completed")
    wait_for(lambda: staging.outcomes([ours]), "staging's outcome")
    assert set(staging.follower.snapshot()) == {ours.name}
    assert set(production.follower.snapshot()) == {theirs.name}
    assert sorted(call.query["labelSelector"] for call in kube_api.calls_of("list")) == [
        "quotagate.io/ledger=production1", "quotagate.io/ledger=staging1"]


def test_an_object_being_deleted_is_not_adopted_on_409_and_is_recreated_once_gone(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    first = target.create_if_absent(delivery_spec())
    kube_api.patch(first.name, {"metadata": {"finalizers": ["example.com/cleanup"]}})
    kube_api.delete(first.name)  # held by its finalizer: deletionTimestamp set
    assert kube_api.get(first.name)["metadata"]["deletionTimestamp"]
    with pytest.raises(DeliveryFailed) as error:
        target.create_if_absent(delivery_spec(token=2))
    assert error.value.code == "kubernetes_object_deleting"
    assert "being deleted" in error.value.message
    assert target.read(first.name) is not None  # it still exists (a stop must wait for it)
    kube_api.patch(first.name, {"metadata": {"finalizers": None}})  # the finalizer is done
    again = target.create_if_absent(delivery_spec(token=3))
    assert again.created_now and again.uid != first.uid


def test_group_version_plural_and_kind_come_from_the_config(
    kube_api: KubeApiServer, targets: BuildTarget, tmp_path: Path
) -> None:
    crd = tmp_path / "inferencejob.yaml"
    crd.write_text(MODEL_SERVICE_CRD.read_text()
                   .replace("modelservices.quotagate.io", "inferencejobs.ml.example.com")
                   .replace("group: quotagate.io", "group: ml.example.com")
                   .replace("ModelService", "InferenceJob").replace("modelservices", "inferencejobs")
                   .replace("modelservice", "inferencejob").replace("name: v1alpha1", "name: v1"))
    kube_api.store.serve(load_crd(crd))
    target = targets(group="ml.example.com", version="v1", plural="inferencejobs",
                     resource_kind="InferenceJob")
    target.create_if_absent(delivery_spec())
    [stored] = kube_api.model_services()
    assert (stored["apiVersion"], stored["kind"]) == ("ml.example.com/v1", "InferenceJob")


# -- outcomes ------------------------------------------------------------------------


def test_outcomes_of_many_objects_come_from_one_list_and_a_watch_not_a_get_each(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    objects = [target.create_if_absent(delivery_spec(f"job-{index}")) for index in range(20)]
    assert target.outcomes(objects) == {}  # all running
    for index, obtained in enumerate(objects[:6]):
        if index % 2:
            kube_api.set_status(obtained.name, phase="Failed", message=f"oom {index}")
        else:
            kube_api.set_status(obtained.name, phase="Succeeded")
    expected = {f"job-{index}": Outcome(completed=True) if index % 2 == 0
                else Outcome(completed=False, reason=f"oom {index}") for index in range(6)}
    assert wait_for(lambda: target.outcomes(objects) == expected and expected,
                    "the six ended objects") == expected
    assert len(kube_api.calls_of("list")) == 1 and target.follower.lists == 1
    assert kube_api.calls_of("get") == []  # not one GET per running object per pass
    [watch] = kube_api.calls_of("watch")
    assert watch.query["labelSelector"] == f"quotagate.io/ledger={LEDGER}"
    assert watch.query["allowWatchBookmarks"] == "true"


def test_a_large_ledger_is_listed_in_pages(
    kube_api: KubeApiServer, targets: BuildTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubernetes_watch, "LIST_PAGE", 3)
    target = targets()
    objects = [target.create_if_absent(delivery_spec(f"job-{index}")) for index in range(10)]
    kube_api.set_status(objects[9].name, phase="Completed")
    assert target.outcomes(objects) == {"job-9": Outcome(completed=True)}
    assert [call.query.get("limit") for call in kube_api.calls_of("list")] == ["3"] * 4
    assert len(target.follower.snapshot()) == 10 and kube_api.calls_of("get") == []


def test_the_watch_resumes_from_the_last_resource_version_and_relists_after_410(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    first = target.create_if_absent(delivery_spec("job-1"))
    target.outcomes([first])  # list + watch started
    wait_for(lambda: kube_api.open_watches == 1, "the watch")
    seen = target.follower.resource_version
    kube_api.end_watches()  # an API server restart closes the stream
    second = target.create_if_absent(delivery_spec("job-2"))
    kube_api.set_status(second.name, phase="Completed")
    wait_for(lambda: target.outcomes([first, second]) == {"job-2": Outcome(completed=True)},
             "job-2's outcome after the watch was resumed")
    resumed = [call for call in kube_api.calls_of("watch") if call.query.get("resourceVersion") == seen]
    assert resumed, "the watch was resumed from the version it had reached"
    assert target.follower.lists == 1  # resumed, not relisted

    wait_for(lambda: kube_api.open_watches == 1, "the resumed watch")
    other = targets(ledger="another1")
    other.create_if_absent(delivery_spec("job-9", ledger="another1"))  # a write we do not see
    kube_api.store.compact()
    # The resumed watch asks for a version from before the compaction: 410 Expired.
    kube_api.end_watches(bookmark=False)
    kube_api.set_status(first.name, phase="Failed", message="evicted")
    wait_for(lambda: target.follower.lists == 2, "a fresh list after 410 Expired")
    wait_for(lambda: target.outcomes([first]) == {"job-1": Outcome(False, "evicted")},
             "job-1's outcome after the relist")


def test_an_object_deleted_after_its_binding_ends_the_request_as_failed(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    deleted, replaced, running = (target.create_if_absent(delivery_spec(f"job-{index}"))
                                  for index in range(3))
    assert target.outcomes([deleted, replaced, running]) == {}
    kube_api.delete(deleted.name)
    kube_api.delete(replaced.name)
    replacement = target.create_if_absent(delivery_spec("job-1"))  # same name, new uid
    assert replacement.uid != replaced.uid
    # The watch brings the deletions in its own time; each is confirmed by a GET when seen.
    def both_ended() -> dict[str, Outcome] | None:
        found = target.outcomes([deleted, replaced, running])
        return found if len(found) == 2 else None

    ended = wait_for(both_ended, "both deleted objects' outcomes")
    assert ended == {
        "job-0": Outcome(False, f"object {deleted.name!r} was deleted after it was bound"),
        "job-1": Outcome(False, f"object {replaced.name!r} was deleted after it was bound and "
                                f"replaced by another (uid {replacement.uid}, bound {replaced.uid})"),
    }


def test_an_object_created_after_the_list_is_not_taken_for_deleted(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    target.outcomes([target.create_if_absent(delivery_spec("job-0"))])  # following
    kube_api.end_watches()
    kube_api.inject("watch", delay=3.0)  # the resumed watch is slow to deliver job-1's ADDED
    late = target.create_if_absent(delivery_spec("job-1"))
    assert late.name not in target.follower.snapshot()
    assert target.outcomes([late]) == {}  # confirmed by one GET: it exists and runs
    assert [call.name for call in kube_api.calls_of("get")] == [late.name]


def test_outcomes_say_clearly_when_the_watch_cannot_be_set_up(
    kube_api: KubeApiServer, targets: BuildTarget, tmp_path: Path
) -> None:
    kube_api.require_token("worker-token", load_role().without("list"))
    target = targets(kubeconfig=str(kube_api.kubeconfig(tmp_path / "kubeconfig", "worker-token")))
    created = target.create_if_absent(delivery_spec())
    with pytest.raises(DeliveryFailed) as error:
        target.outcomes([created])
    assert error.value.code == "kubernetes_watch_failed"
    assert "403 Forbidden" in error.value.message and "cannot list" in error.value.message


def test_outcomes_report_an_unreachable_api_server_instead_of_waiting_for_it(
    targets: BuildTarget,
) -> None:
    target = targets(host="http://127.0.0.1:9", timeout=30.0)
    obtained = ExternalObject("job-1-abc", "uid-1", "job-1", ledger_id=LEDGER)
    for _pass in range(2):
        with pytest.raises(DeliveryFailed) as error:
            target.outcomes([obtained])
        assert error.value.code == "kubernetes_watch_failed"
        assert "Connection refused" in error.value.message


# -- stop ----------------------------------------------------------------------------


def test_stop_deletes_the_object_and_confirms_only_once_it_is_gone(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    obtained = target.create_if_absent(delivery_spec(token=4))
    kube_api.patch(obtained.name, {"metadata": {"finalizers": ["example.com/drain"]}})
    first = target.stop(obtained, 5)
    assert not first.stopped and "waiting for finalizers example.com/drain" in (first.reason or "")
    assert kube_api.get(obtained.name)["metadata"]["deletionTimestamp"]
    assert not target.stop(obtained, 5).stopped  # asking again is safe: still draining
    kube_api.patch(obtained.name, {"metadata": {"finalizers": None}})
    assert target.stop(obtained, 5).stopped
    assert kube_api.model_services() == []
    assert target.stop(obtained, 5).stopped  # and stays so
    [delete, *_] = kube_api.calls_of("delete")
    assert delete.name == obtained.name


def test_a_stale_stop_changes_nothing(kube_api: KubeApiServer, targets: BuildTarget) -> None:
    target = targets()
    obtained = target.create_if_absent(delivery_spec(token=7))
    result = target.stop(obtained, 6)
    assert not result.stopped and "fencing token 7" in (result.reason or "")
    assert kube_api.calls_of("delete") == [] and len(kube_api.model_services()) == 1


def test_stop_never_deletes_a_replacement_under_the_same_name(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets()
    bound = target.create_if_absent(delivery_spec())
    kube_api.delete(bound.name)
    replacement = target.create_if_absent(delivery_spec(token=2))
    assert target.stop(bound, 3).stopped  # ours is gone
    assert kube_api.get(replacement.name)["metadata"]["uid"] == replacement.uid


def test_stop_by_suspend_waits_for_the_controller_to_confirm(
    kube_api: KubeApiServer, targets: BuildTarget
) -> None:
    target = targets(stop="suspend")
    obtained = target.create_if_absent(delivery_spec(token=1))
    kube_api.set_status(obtained.name, phase="Running", observedGeneration=1)
    asked = target.stop(obtained, 2)
    assert not asked.stopped and "waiting for the controller" in (asked.reason or "")
    stored = kube_api.get(obtained.name)
    assert stored["spec"]["suspend"] is True and stored["metadata"]["generation"] == 2
    assert stored["metadata"]["annotations"]["quotagate.io/fencing-token"] == "2"
    # A status written for the old generation does not confirm anything.
    kube_api.set_status(obtained.name, phase="Suspended", observedGeneration=1)
    assert not target.stop(obtained, 2).stopped
    kube_api.set_status(obtained.name, phase="Suspended", observedGeneration=2)
    confirmed = target.stop(obtained, 2)
    assert confirmed.stopped and "suspended" in (confirmed.reason or "")
    assert len(kube_api.model_services()) == 1  # suspended, not deleted
    assert len(kube_api.calls_of("patch")) == 1  # polling did not patch again


def test_close_ends_the_watch_at_once(kube_api: KubeApiServer, targets: BuildTarget) -> None:
    target = targets()
    target.outcomes([target.create_if_absent(delivery_spec())])
    wait_for(lambda: kube_api.open_watches == 1, "the watch")
    target.close()
    assert target.follower._thread is not None and not target.follower._thread.is_alive()
    wait_for(lambda: kube_api.open_watches == 0, "the server to see the watch end", timeout=5)


# -- through the dispatcher, on every backend -------------------------------------


def _setup(gate: Quotagate, kube_api: KubeApiServer, **config: object) -> None:
    gate.set_tenant("team-a", {"gpu": 2})
    gate.set_pool("pool-1", {"gpu": 2})
    TargetStore(gate.engine).set("cluster", "kubernetes",
                                 {"host": kube_api.host, "timeout": 2.0, **config}, default=True)


def test_dispatcher_delivers_and_completes_from_the_objects_status(
    kube_api: KubeApiServer, db_url: str
) -> None:
    with Quotagate.connect(db_url) as gate:
        _setup(gate, kube_api)
        gate.submit("job-1", "team-a", {"gpu": 2})
        gate.admit()
        dispatcher = Dispatcher(gate, worker_name="w1")
        try:
            dispatcher.run_once()
            assert gate.show("job-1").state == RequestState.DELIVERED
            [stored] = kube_api.model_services()
            assert stored["metadata"]["labels"]["quotagate.io/ledger"] == gate.ledger_id
            with gate.engine.connect() as connection:
                binding = connection.execute(schema.binding.select()).mappings().one()
            assert binding["uid"] == stored["metadata"]["uid"]
            assert binding["external_name"] == stored["metadata"]["name"]
            kube_api.set_status(stored["metadata"]["name"], phase="Completed")
            wait_for(lambda: dispatcher.run_once() or gate.show("job-1").state
                     == RequestState.COMPLETED, "job-1 completed")
            assert gate.usage()["tenants"][0]["used"] == 0
        finally:
            dispatcher.release()


def test_dispatcher_fails_a_request_whose_object_was_deleted(
    kube_api: KubeApiServer, db_url: str
) -> None:
    with Quotagate.connect(db_url) as gate:
        _setup(gate, kube_api)
        gate.submit("job-1", "team-a", {"gpu": 1})
        gate.admit()
        dispatcher = Dispatcher(gate, worker_name="w1")
        try:
            dispatcher.run_once()
            [stored] = kube_api.model_services()
            kube_api.delete(stored["metadata"]["name"])  # kubectl delete, by somebody
            wait_for(lambda: dispatcher.run_once() or gate.show("job-1").state
                     == RequestState.FAILED, "job-1 failed")
            assert gate.usage()["tenants"][0]["used"] == 0
            assert "deleted after it was bound" in (gate.show("job-1").reason or "")
        finally:
            dispatcher.release()


# -- stops through the dispatcher, on every backend ----------------------------------


def _delivered(gate: Quotagate, kube_api: KubeApiServer, **config: object) -> tuple[Dispatcher, str]:
    _setup(gate, kube_api, **config)
    gate.submit("job-1", "team-a", {"gpu": 1})
    gate.admit()
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.05)
    dispatcher.run_once()
    assert gate.show("job-1").state == RequestState.DELIVERED
    [stored] = kube_api.model_services()
    return dispatcher, stored["metadata"]["name"]


def _releases(gate: Quotagate) -> int:
    with gate.engine.connect() as connection:
        rows = connection.execute(schema.audit.select()).mappings().all()
    return sum(1 for row in rows if row["target"] == "job-1" and row["outcome"] == "released")


def test_cancelling_deletes_the_object_and_returns_the_cost_only_once_it_is_gone(
    kube_api: KubeApiServer, gate: Quotagate
) -> None:
    dispatcher, name = _delivered(gate, kube_api)
    try:
        kube_api.patch(name, {"metadata": {"finalizers": ["example.com/drain"]}})
        gate.cancel("job-1")
        wait_for(lambda: dispatcher.run_once() is not None
                 and len(kube_api.calls_of("get")) >= 4, "several stop polls")
        # Deleting, but its finalizer still drains the work: nothing comes back yet.
        assert kube_api.get(name)["metadata"]["deletionTimestamp"]
        assert gate.show("job-1").state == RequestState.CANCELLING
        assert gate.usage()["tenants"][0]["used"] == 1 and _releases(gate) == 0
        assert gate.check_invariants() == []
        assert len(kube_api.calls_of("delete")) == 1  # asked once; the polls only look
        kube_api.patch(name, {"metadata": {"finalizers": None}})
        wait_for(lambda: dispatcher.run_once() is not None
                 and gate.show("job-1").state == RequestState.CANCELLED, "the confirmed stop")
        assert gate.usage()["tenants"][0]["used"] == 0 and _releases(gate) == 1
        assert kube_api.model_services() == []
    finally:
        dispatcher.release()


def test_a_suspension_the_controller_never_confirms_keeps_the_cost_charged(
    kube_api: KubeApiServer, gate: Quotagate
) -> None:
    dispatcher, name = _delivered(gate, kube_api, stop="suspend")
    try:
        gate.cancel("job-1")
        wait_for(lambda: dispatcher.run_once() is not None
                 and len(kube_api.calls_of("get")) >= 5, "several stop polls")
        assert kube_api.get(name)["spec"]["suspend"] is True
        assert len(kube_api.calls_of("patch")) == 1
        assert gate.show("job-1").state == RequestState.CANCELLING
        assert gate.usage()["tenants"][0]["used"] == 1 and _releases(gate) == 0
        [shown] = gate.inspect()["requests"]
        assert "waiting for the controller" in shown["stop_progress"]
        assert shown["last_error"] is None
        kube_api.set_status(name, phase="Suspended",
                            observedGeneration=kube_api.get(name)["metadata"]["generation"])
        wait_for(lambda: dispatcher.run_once() is not None
                 and gate.show("job-1").state == RequestState.CANCELLED, "the confirmed stop")
        assert gate.usage()["tenants"][0]["used"] == 0 and _releases(gate) == 1
        assert len(kube_api.model_services()) == 1  # suspended, kept
    finally:
        dispatcher.release()


def test_cancelling_a_request_whose_create_reply_was_lost_deletes_the_object(
    kube_api: KubeApiServer, gate: Quotagate
) -> None:
    _setup(gate, kube_api)
    gate.submit("job-1", "team-a", {"gpu": 1})
    gate.admit()
    kube_api.inject("create", drop_reply=True)
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.05, retry_base=60)
    try:
        dispatcher.run_once()  # created, but the worker never heard: no binding
        assert gate.show("job-1").state == RequestState.RESERVED
        assert len(kube_api.model_services()) == 1
        gate.cancel("job-1")
        wait_for(lambda: dispatcher.run_once() is not None
                 and gate.show("job-1").state == RequestState.CANCELLED, "the stop")
        assert kube_api.model_services() == []  # found by its name, ours, deleted
        assert gate.usage()["tenants"][0]["used"] == 0 and _releases(gate) == 1
    finally:
        dispatcher.release()


def test_two_ledgers_delivering_into_one_namespace_each_end_only_their_own_requests(
    kube_api: KubeApiServer, db_url: str, tmp_path: Path
) -> None:
    with Quotagate.connect(db_url) as staging, \
            Quotagate.connect(f"sqlite:///{tmp_path / 'production.db'}") as production:
        production.init()
        assert staging.ledger_id != production.ledger_id
        dispatchers = []
        for gate, name in ((staging, "w-staging"), (production, "w-production")):
            _setup(gate, kube_api)
            gate.submit("job-1", "team-a", {"gpu": 1})  # the same request id in both
            gate.admit()
            dispatchers.append(Dispatcher(gate, worker_name=name))
        try:
            for dispatcher in dispatchers:
                dispatcher.run_once()
            objects = {found["metadata"]["labels"]["quotagate.io/ledger"]: found
                       for found in kube_api.model_services()}
            assert set(objects) == {staging.ledger_id, production.ledger_id}  # two, not adopted
            kube_api.set_status(objects[staging.ledger_id]["metadata"]["name"], phase="Completed")
            wait_for(lambda: dispatchers[0].run_once() is not None
                     and staging.show("job-1").state == RequestState.COMPLETED, "staging's end")
            dispatchers[1].run_once()
            assert production.show("job-1").state == RequestState.DELIVERED  # not its object
        finally:
            for dispatcher in dispatchers:
                dispatcher.release()
