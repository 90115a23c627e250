"""The shipped CRD and Role agree with what the kubernetes target does by default."""

from __future__ import annotations

from pathlib import Path

import yaml

from quotagate.delivery.targets.kubernetes import DEFAULTS

CRD = Path(__file__).parents[2] / "deploy" / "crds" / "modelservice.yaml"
ROLE = Path(__file__).parents[2] / "deploy" / "rbac" / "worker-role.yaml"


def test_the_crd_serves_what_the_target_creates_by_default() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{DEFAULTS['plural']}.{DEFAULTS['group']}"
    assert spec["group"] == DEFAULTS["group"]
    assert spec["names"]["plural"] == DEFAULTS["plural"]
    assert spec["names"]["kind"] == DEFAULTS["resource_kind"]
    assert spec["scope"] == "Namespaced"
    [version] = spec["versions"]
    assert version["name"] == DEFAULTS["version"] and version["served"] and version["storage"]
    properties = version["schema"]["openAPIV3Schema"]["properties"]
    # The fields the target writes, and the status phases a worker reads.
    assert {"requestId", "tenant", "cost", "payload"} <= set(properties["spec"]["properties"])
    assert {"Completed", "Succeeded", "Failed", "Suspended"} <= set(
        properties["status"]["properties"]["phase"]["enum"]
    )
    # What ``stop: suspend`` sets, and what confirms it.
    assert properties["spec"]["properties"]["suspend"]["type"] == "boolean"
    assert properties["status"]["properties"]["observedGeneration"]["type"] == "integer"
    assert "status" in version["subresources"]


def test_the_worker_role_grants_every_verb_the_target_uses() -> None:
    role = next(document for document in yaml.safe_load_all(ROLE.read_text())
                if document["kind"] == "Role")
    [rule] = role["rules"]
    assert rule["apiGroups"] == [DEFAULTS["group"]] and rule["resources"] == [DEFAULTS["plural"]]
    # create/get: delivery and read-back; list/watch: outcomes; delete/patch: stop.
    assert set(rule["verbs"]) == {"create", "get", "list", "watch", "delete", "patch"}
