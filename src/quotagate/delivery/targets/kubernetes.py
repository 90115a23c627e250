"""The ``kubernetes`` target: one namespaced custom object per request.

By default a ``ModelService`` (CRD in ``deploy/crds/modelservice.yaml``),
created through the official client's CustomObjectsApi. The object's name is
derived from tenant and request id; labels carry both, an annotation carries
the exact request id and the fencing token. On 409 AlreadyExists the object is
read back: ours (same request id) → bind its UID; another's → fail loudly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quotagate.delivery.naming import label_value
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    Outcome,
    StopResult,
    check_identity,
)
from quotagate.errors import InvalidInput

LABEL_REQUEST_ID = "quotagate.io/request-id"
LABEL_TENANT = "quotagate.io/tenant"
LABEL_LEDGER = "quotagate.io/ledger"
ANNOTATION_LEDGER_ID = "quotagate.io/ledger-id"
ANNOTATION_REQUEST_ID = "quotagate.io/request-id"
ANNOTATION_FENCING_TOKEN = "quotagate.io/fencing-token"
DEFAULTS = {
    "group": "quotagate.io",
    "version": "v1alpha1",
    "plural": "modelservices",
    "resource_kind": "ModelService",
    "namespace": "default",
}
_OPTIONAL = ("host", "kubeconfig", "context")
_COMPLETED_PHASES = {"Completed", "Succeeded"}
_FAILED_PHASES = {"Failed"}
REQUEST_TIMEOUT = 10.0


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = config.get(key) or default
        if not isinstance(value, str):
            raise InvalidInput(f"{key} must be text", code="invalid_target_config")
        checked[key] = value
    for key in _OPTIONAL:
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidInput(f"{key} must be text", code="invalid_target_config")
        if value:
            checked[key] = value
    return checked


def _kubernetes() -> tuple[Any, Any, Any]:
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
    except ModuleNotFoundError as error:
        raise InvalidInput(
            "the kubernetes target needs the kubernetes client: "
            "pip install 'quotagate[kubernetes]'",
            code="extra_missing",
        ) from error
    return client, config, ApiException


class KubernetesTarget:
    kind = "kubernetes"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str) -> None:
        self.ledger_id = ledger_id
        self.config = validate_config(config)
        client, kube_config, self._api_exception = _kubernetes()
        configuration = client.Configuration()
        if "host" in self.config:
            # An explicit API server URL, e.g. ``kubectl proxy`` on 127.0.0.1:8001.
            configuration.host = self.config["host"]
        elif "kubeconfig" in self.config or "context" in self.config:
            kube_config.load_kube_config(
                config_file=self.config.get("kubeconfig"), context=self.config.get("context"),
                client_configuration=configuration,
            )
        else:
            try:
                kube_config.load_incluster_config(client_configuration=configuration)
            except kube_config.ConfigException:
                kube_config.load_kube_config(client_configuration=configuration)
        self.api = client.CustomObjectsApi(client.ApiClient(configuration))

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        body = {
            "apiVersion": f"{self.config['group']}/{self.config['version']}",
            "kind": self.config["resource_kind"],
            "metadata": {
                "name": spec.external_name,
                "namespace": self.config["namespace"],
                "labels": {
                    LABEL_REQUEST_ID: label_value(spec.request_id),
                    LABEL_TENANT: spec.tenant,
                    LABEL_LEDGER: label_value(spec.ledger_id),
                    "app.kubernetes.io/managed-by": "quotagate",
                },
                "annotations": {
                    ANNOTATION_REQUEST_ID: spec.request_id,
                    ANNOTATION_LEDGER_ID: spec.ledger_id,
                    ANNOTATION_FENCING_TOKEN: str(spec.fencing_token),
                },
            },
            "spec": {
                "requestId": spec.request_id,
                "tenant": spec.tenant,
                "cost": dict(spec.cost),
                "payload": spec.payload,
            },
        }
        try:
            created = self._call("create_namespaced_custom_object", body=body)
        except self._api_exception as error:
            if error.status != 409:
                raise DeliveryFailed(
                    f"kubernetes refused {spec.external_name!r}: {error.status} {error.reason}"
                ) from error
            # AlreadyExists: a lost reply of ours, or somebody else's object.
            found = self.read(spec.external_name)
            if found is None:
                raise DeliveryFailed(
                    f"{spec.external_name!r} exists (409) but cannot be read back"
                ) from error
            return check_identity(found, spec)
        obtained = self._identity(created)
        return check_identity(
            ExternalObject(obtained.name, obtained.uid, obtained.request_id, created_now=True,
                           ledger_id=obtained.ledger_id),
            spec,
        )

    def read(self, name: str) -> ExternalObject | None:
        found = self._get(name)
        return None if found is None else self._identity(found)

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        found = {obtained.request_id: self.outcome(obtained) for obtained in objects}
        return {request_id: outcome for request_id, outcome in found.items()
                if outcome is not None}

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        return StopResult(stopped=False, reason="the kubernetes target cannot stop objects yet")

    def close(self) -> None:
        self.api.api_client.close()

    def outcome(self, obtained: ExternalObject) -> Outcome | None:
        found = self._get(obtained.name)
        if found is None:
            return None
        status = found.get("status") or {}
        phase = status.get("phase")
        if phase in _COMPLETED_PHASES:
            return Outcome(completed=True)
        if phase in _FAILED_PHASES:
            return Outcome(completed=False, reason=str(status.get("message") or "object failed"))
        return None

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("get_namespaced_custom_object", name=name)
        except self._api_exception as error:
            if error.status == 404:
                return None
            raise DeliveryFailed(
                f"kubernetes GET {name!r} answered {error.status} {error.reason}"
            ) from error
        return found

    def _call(self, method: str, **arguments: Any) -> Any:
        try:
            return getattr(self.api, method)(
                group=self.config["group"], version=self.config["version"],
                namespace=self.config["namespace"], plural=self.config["plural"],
                _request_timeout=REQUEST_TIMEOUT, **arguments,
            )
        except self._api_exception:
            raise
        except Exception as error:  # urllib3 / socket errors: the API server is not there
            raise DeliveryFailed(f"kubernetes API unreachable: {error}") from error

    @staticmethod
    def _identity(found: Mapping[str, Any]) -> ExternalObject:
        metadata = found.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        labels = metadata.get("labels") or {}
        request_id = annotations.get(ANNOTATION_REQUEST_ID) or labels.get(LABEL_REQUEST_ID) or ""
        if labels.get(LABEL_REQUEST_ID) != label_value(str(request_id)):
            request_id = f"(label {labels.get(LABEL_REQUEST_ID)!r})"
        return ExternalObject(name=str(metadata.get("name")), uid=metadata.get("uid"),
                              request_id=str(request_id),
                              ledger_id=annotations.get(ANNOTATION_LEDGER_ID))
