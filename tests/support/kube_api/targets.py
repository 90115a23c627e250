"""Building kubernetes targets against the in-suite API server, and closing them after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from quotagate.delivery.naming import external_name
from quotagate.delivery.targets.base import DeliverySpec
from quotagate.delivery.targets.kubernetes import KubernetesTarget
from support.kube_api.server import KubeApiServer

LEDGER = "ledger0a"


class BuildTarget(Protocol):
    def __call__(self, ledger: str = LEDGER, **config: Any) -> KubernetesTarget: ...


@contextmanager
def target_factory(server: KubeApiServer) -> Iterator[BuildTarget]:
    built: list[KubernetesTarget] = []

    def build(ledger: str = LEDGER, **config: Any) -> KubernetesTarget:
        settings = {"host": server.host, "timeout": 2.0, **config}
        if "kubeconfig" in config:
            settings.pop("host")
        target = KubernetesTarget(settings, ledger_id=ledger)
        built.append(target)
        return target

    try:
        yield build
    finally:
        for target in built:
            target.close()


def delivery_spec(request_id: str = "job:1", *, ledger: str = LEDGER, tenant: str = "team-a",
                  token: int = 1, payload: Any = None) -> DeliverySpec:
    return DeliverySpec(request_id=request_id, tenant=tenant, cost={"gpu": 1},
                        payload={"model": "m"} if payload is None else payload,
                        fencing_token=token,
                        external_name=external_name(ledger, tenant, request_id), ledger_id=ledger)
