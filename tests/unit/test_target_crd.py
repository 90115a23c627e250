"""The shipped CRD agrees with the kubernetes target's defaults."""

from __future__ import annotations

from pathlib import Path

import yaml

from quotagate.delivery.targets.kubernetes import DEFAULTS

CRD = Path(__file__).parents[2] / "deploy" / "crds" / "modelservice.yaml"


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
    assert {"Completed", "Succeeded", "Failed"} <= set(
        properties["status"]["properties"]["phase"]["enum"]
    )
