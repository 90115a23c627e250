"""Crash tests for Kubernetes deliveries: real `quotagate worker` processes, real SIGKILL.

As tests/integration/test_crash_delivery.py does for the process target, on
SQLite, PostgreSQL and MariaDB: a worker delivering to the in-suite API server
is killed (a) after its claim, before the create; (b) after the create, before
the binding is recorded (the lost reply); (c) once the batch's bindings and
``delivered`` marks committed (one transaction). A restarted worker — of the
same name, or of another once the dead one's lease expired — then finishes,
and every request must have exactly one object ever created (one successful create, not just one object
left), bound by its UID, completed from its status, its cost charged and
returned once. A randomized run kills two workers at random moments.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from quotagate import Quotagate, RequestState
from quotagate.delivery.naming import external_name
from quotagate.delivery.registry import TargetStore
from quotagate.store import schema
from support.kube_api import KubeApiServer
from support.kube_api.controller import controller
from support.waiting import wait_for
from support.worker_processes import finish, start_crash_worker, submit_and_admit, table


@pytest.fixture
def gate(db_url: str, kube_api: KubeApiServer) -> Iterator[Quotagate]:
    with Quotagate.connect(db_url) as quotagate:
        quotagate.set_tenant("team-a", {"gpu": 1000})
        quotagate.set_pool("pool-1", {"gpu": 1000})
        TargetStore(quotagate.engine).set("cluster", "kubernetes",
                                          {"host": kube_api.host, "timeout": 5.0}, default=True)
        yield quotagate


def assert_exactly_once(gate: Quotagate, kube_api: KubeApiServer, ids: list[str]) -> None:
    """Every request completed, from one object created once, bound by its UID, charged once."""
    states = {request_id: gate.show(request_id).state for request_id in ids}
    assert set(states.values()) == {RequestState.COMPLETED}, states
    names = {request_id: external_name(gate.ledger_id, "team-a", request_id) for request_id in ids}
    assert Counter(kube_api.store.created) == Counter(names.values()), "an object was created twice"
    objects = {found["metadata"]["name"]: found for found in kube_api.model_services()}
    assert sorted(objects) == sorted(names.values())
    bindings = {row["request_id"]: row for row in table(gate, schema.binding)}
    assert sorted(bindings) == ids
    for request_id, binding in bindings.items():
        stored = objects[names[request_id]]
        assert binding["external_name"] == stored["metadata"]["name"]
        assert binding["uid"] == stored["metadata"]["uid"]  # bound to the object that exists
        assert stored["metadata"]["annotations"]["quotagate.io/request-id"] == request_id
        assert stored["metadata"]["labels"]["quotagate.io/ledger"] == gate.ledger_id
    audit = table(gate, schema.audit)
    releases = Counter(row["target"] for row in audit if row["outcome"] == "released")
    admissions = Counter(row["target"] for row in audit if row["operation"] == "admit")
    assert releases == Counter(ids) and admissions == Counter(ids)  # charged once, returned once
    assert gate.usage()["tenants"][0]["used"] == 0
    assert gate.check_invariants() == []


@pytest.mark.parametrize(("crash_at", "successor"), [
    ("after_claim", "w1"), ("after_create", "w1"), ("after_binding", "w1"),
    ("after_create", "w2"),  # any worker takes the dead one's claims once its lease expired
])
def test_a_worker_killed_at_each_step_is_replaced_and_creates_each_object_once(
    gate: Quotagate, kube_api: KubeApiServer, db_url: str, crash_at: str, successor: str
) -> None:
    ids = submit_and_admit(gate, 2)
    with controller(kube_api):
        assert finish(start_crash_worker(db_url, "w1", "--batch", "1", crash_at=crash_at)) \
            == -signal.SIGKILL
        [claimed] = [row for row in table(gate, schema.outbox) if row["claimed_by"] == "w1"]
        bindings = table(gate, schema.binding)
        if crash_at == "after_claim":
            assert kube_api.store.created == [] and bindings == []
        elif crash_at == "after_create":
            assert len(kube_api.store.created) == 1 and bindings == []  # the reply was "lost"
        else:
            # Binding and delivered mark are one transaction per batch; it committed.
            assert len(kube_api.store.created) == 1 and len(bindings) == 1
        assert claimed["delivered"] == (crash_at == "after_binding")
        # A restarted worker takes over once the dead one's lease expired.
        assert finish(start_crash_worker(db_url, successor, "--until-idle")) == 0
    assert_exactly_once(gate, kube_api, ids)
    if crash_at == "after_create":
        # The restarted worker met the object on create (409) and adopted it by read-back.
        assert [call.name for call in kube_api.calls_of("get")].count(
            external_name(gate.ledger_id, "team-a", claimed["request_id"])) >= 1


@pytest.mark.slow
def test_workers_killed_at_random_moments_still_create_each_object_once(
    gate: Quotagate, kube_api: KubeApiServer, db_url: str
) -> None:
    ids = submit_and_admit(gate, 30)
    seed = int(os.environ.get("QUOTAGATE_CRASH_SEED", random.randrange(1 << 30)))
    generator = random.Random(seed)
    with controller(kube_api):
        workers = {name: start_crash_worker(db_url, name, "--batch", "2") for name in ("w1", "w2")}
        generations = {"w1": 0, "w2": 0}
        try:
            for _round in range(4):
                name = generator.choice(sorted(workers))
                # Kill it after it started working (a new lease generation), not while importing.
                generations[name] = wait_for(
                    lambda worker=name: next((row["generation"] for row in table(gate, schema.lease)
                                              if row["name"] == f"worker/{worker}"
                                              and row["generation"] > generations[worker]), None),
                    f"worker {name} taking its lease", timeout=60)
                time.sleep(generator.uniform(0.0, 0.4))  # a random moment to kill, not a wait
                workers[name].send_signal(signal.SIGKILL)
                assert finish(workers[name]) == -signal.SIGKILL
                workers[name] = start_crash_worker(db_url, name, "--batch", "2")
            wait_for(lambda: all(gate.show(request_id).state == RequestState.COMPLETED
                                 for request_id in ids), "every request completed", timeout=120)
            for worker in workers.values():
                worker.send_signal(signal.SIGTERM)
                finish(worker, allowed=(0, -signal.SIGTERM))
        finally:
            for worker in workers.values():
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    try:
        assert_exactly_once(gate, kube_api, ids)
    except AssertionError as error:
        raise AssertionError(f"{error} (rerun with QUOTAGATE_CRASH_SEED={seed})") from error
