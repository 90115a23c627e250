"""The ``kubernetes`` target: one namespaced custom object per request.

By default a ``ModelService`` (CRD in ``deploy/crds/modelservice.yaml``),
created through the official client's CustomObjectsApi over one ApiClient per
target. Objects carry the ledger's id (label ``quotagate.io/ledger`` and an
annotation) beside the request id and the fencing token, and their names hash
all three (ledger, tenant, request id). On 409 AlreadyExists the object is
read back and bound only if ledger id *and* request id match, and never while
it is being deleted.

Outcomes come from one LIST by the ledger's label and a WATCH from the version
it returned (``kubernetes_watch``), not one GET per object. A bound object
that is gone ends its request as failed. ``stop`` deletes the object (or,
with ``stop: suspend``, sets ``spec.suspend``) and says stopped only once the
object is gone (or its status confirms the suspension). See docs/delivery.md
and docs/decisions/230 to 239.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from quotagate.delivery.naming import label_value
from quotagate.delivery.targets import kubernetes_api, kubernetes_objects
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    Outcome,
    StopResult,
    TargetKind,
    check_identity,
)
from quotagate.delivery.targets.kubernetes_api import ObjectRejected
from quotagate.delivery.targets.kubernetes_watch import ObjectFollower
from quotagate.errors import InvalidInput, QuotagateError, quoted

__all__ = ["KubernetesTarget", "ObjectRejected", "validate_config"]

logger = logging.getLogger("quotagate.delivery.kubernetes")

DEFAULTS = {
    "group": "quotagate.io",
    "version": "v1alpha1",
    "plural": "modelservices",
    "resource_kind": "ModelService",
    "namespace": "default",
    "stop": "delete",
}
STOP_MODES = ("delete", "suspend")
DEFAULT_TIMEOUT = 10.0
_OPTIONAL = ("host", "kubeconfig", "context")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
# What the API server will accept, checked when the target is set, not at the first delivery.
_SYNTAX = {
    "namespace": (_LABEL, "a DNS-1123 label"),
    "plural": (_LABEL, "a DNS-1123 label (lowercase)"),
    "version": (_LABEL, "a DNS-1123 label, e.g. v1alpha1"),
    "group": (_SUBDOMAIN, "a DNS-1123 subdomain, e.g. quotagate.io"),
    "resource_kind": (_KIND, "a CamelCase kind, e.g. ModelService"),
}


def _invalid(message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_target_config")


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = config.get(key) or default
        if not isinstance(value, str):
            raise _invalid(f"{key} must be text")
        checked[key] = value
    for key, (pattern, shape) in _SYNTAX.items():
        if not pattern.fullmatch(checked[key]):
            raise _invalid(f"{key} {checked[key]!r} is not {shape}")
    if checked["stop"] not in STOP_MODES:
        raise _invalid(f"stop must be one of {', '.join(STOP_MODES)}, not {checked['stop']!r}")
    for key in _OPTIONAL:
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            raise _invalid(f"{key} must be text")
        if value:
            checked[key] = value
    timeout = config.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise _invalid("timeout must be a positive number of seconds")
    checked["timeout"] = float(timeout)
    return checked


class KubernetesTarget:
    kind = "kubernetes"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str) -> None:
        self.ledger_id = ledger_id
        self.config = validate_config(config)
        self.namespace: str = self.config["namespace"]
        self.timeout: float = self.config["timeout"]
        self.resource = f"{self.config['plural']}.{self.config['group']}"
        self._client = kubernetes_api.connect(self.config)
        self._api_exception = self._client.api_exception
        host = urlsplit(str(self._client.api.api_client.configuration.host))
        # Shown in errors: never with a user:password the URL might carry.
        self.host = host._replace(netloc=host.netloc.rpartition("@")[2]).geturl()
        self.selector = f"{kubernetes_objects.LABEL_LEDGER}={label_value(ledger_id)}"
        self.follower = ObjectFollower(
            functools.partial(self._client.api.list_namespaced_custom_object, **self._resource()),
            label_selector=self.selector, api_exception=self._api_exception,
            watch_module=self._client.watch, timeout=self.timeout, describe=self._describe,
        )

    def close(self) -> None:
        self.follower.close()
        self._client.close()

    # -- create and read -----------------------------------------------------------

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        try:
            created = self._call("create", "create_namespaced_custom_object", spec.external_name,
                                 body=kubernetes_objects.body(spec, self.config))
        except DeliveryFailed as error:
            if error.fields.get("kubernetes_reason") != "AlreadyExists":
                raise
            # A lost reply of ours, somebody else's object, or one on its way out.
            found = self._get(spec.external_name)
            if found is None:
                raise DeliveryFailed(
                    f"{quoted(spec.external_name)} existed (409) but was gone when read back; "
                    "it will be created on the next attempt", code="kubernetes_gone",
                    public="kubernetes object vanished while being read back",
                ) from error
            deleting = (found.get("metadata") or {}).get("deletionTimestamp")
            if deleting:
                # Adopting it would bind an object that is about to disappear.
                raise DeliveryFailed(
                    f"{quoted(spec.external_name)} exists but is being deleted (since {deleting}); "
                    "not adopted: it will be created anew once it is gone",
                    code="kubernetes_object_deleting",
                    public="an object of that name is being deleted in kubernetes",
                ) from error
            return check_identity(kubernetes_objects.identity(found), spec)
        obtained = kubernetes_objects.identity(created)
        return check_identity(
            ExternalObject(obtained.name, obtained.uid, obtained.request_id, created_now=True,
                           ledger_id=obtained.ledger_id),
            spec,
        )

    def read(self, name: str) -> ExternalObject | None:
        """The object by name, or None if it does not exist.

        An object being deleted still exists (its finalizers may still be
        draining the work): a worker stopping a request must wait for it, not
        take it for never delivered. Binding one is refused in ``create_if_absent``.
        """
        found = self._get(name)
        return None if found is None else kubernetes_objects.identity(found)

    # -- outcomes ------------------------------------------------------------------

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        """Ended objects by request id, read from the followed list, not one GET each.

        An object missing from the cache may be one created after the last
        event arrived, so it is confirmed with one GET before its request is
        ended as deleted.
        """
        if not objects:
            return {}
        self.follower.start()
        if not self.follower.wait_synced(self.timeout):
            raise DeliveryFailed(
                f"kubernetes: cannot list and watch {self.resource} in namespace "
                f"{quoted(self.namespace)}: {self.follower.last_error or 'no answer yet'}",
                code="kubernetes_watch_failed", public="kubernetes cannot be watched",
            )
        known = self.follower.snapshot()
        ended: dict[str, Outcome] = {}
        for obtained in objects:
            found = known.get(obtained.name)
            if found is None or not kubernetes_objects.same(found, obtained):
                try:
                    found = self._get(obtained.name)
                except QuotagateError as error:
                    logger.warning("kubernetes: reading %s back: %s", obtained.name, error.message)
                    continue
                if found is None or not kubernetes_objects.same(found, obtained):
                    reason = kubernetes_objects.gone_reason(found, obtained)
                    ended[obtained.request_id] = Outcome(completed=False, reason=reason)
                    continue
            outcome = kubernetes_objects.phase_outcome(found)
            if outcome is not None:
                ended[obtained.request_id] = outcome
        return ended

    # -- stop ----------------------------------------------------------------------

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        """Delete (or suspend) the object; stopped only once it is gone (or confirmed suspended).

        Idempotent: a worker calls it again to poll. A stop older than the
        attempt that last wrote the object (a lower fencing token) changes nothing.
        """
        try:
            found = self._get(obtained.name)
            if found is None or not kubernetes_objects.same(found, obtained):
                return StopResult(stopped=True, reason=f"{self.resource} {obtained.name!r} is gone")
            metadata = found["metadata"]
            written_by = kubernetes_objects.fencing_token(metadata)
            if written_by is not None and written_by > fencing_token:
                return StopResult(stopped=False, failed=True, reason=(
                    f"stale stop: {obtained.name!r} carries fencing token {written_by}, "
                    f"this stop {fencing_token}"))
            if self.config["stop"] == "suspend":
                return self._suspend(found, fencing_token)
            return self._delete(found)
        except QuotagateError as error:
            return StopResult(stopped=False, failed=True, reason=error.message)

    def _delete(self, found: dict[str, Any]) -> StopResult:
        metadata = found["metadata"]
        name = metadata["name"]
        if not metadata.get("deletionTimestamp"):
            models = self._client.models
            # Preconditions: delete exactly the object we checked, not a newer write
            # (or a replacement under the same name).
            options = models.V1DeleteOptions(
                propagation_policy="Background",
                preconditions=models.V1Preconditions(uid=metadata.get("uid"),
                                                     resource_version=metadata.get("resourceVersion")),
            )
            try:
                self._call("delete", "delete_namespaced_custom_object", name, name=name, body=options)
            except DeliveryFailed as error:
                status = error.fields.get("kubernetes_status")
                if status == 404:
                    return StopResult(stopped=True, reason=f"{self.resource} {name!r} is gone")
                if status == 409:
                    return StopResult(stopped=False, reason=f"{name!r} changed while being "
                                                            "deleted; asking again")
                raise
        after = self._get(name)
        if after is None or after["metadata"].get("uid") != metadata.get("uid"):
            return StopResult(stopped=True, reason=f"{self.resource} {name!r} deleted")
        finalizers = after["metadata"].get("finalizers") or []
        return StopResult(stopped=False, reason=(
            f"{name!r} is being deleted; waiting for finalizers {', '.join(finalizers)}"))

    def _suspend(self, found: dict[str, Any], fencing_token: int) -> StopResult:
        metadata, status = found["metadata"], found.get("status") or {}
        name = metadata["name"]
        phase = status.get("phase")
        if phase in kubernetes_objects.ENDED_PHASES:
            return StopResult(stopped=True, reason=f"{name!r} already ended ({phase})")
        if kubernetes_objects.suspension_confirmed(found):
            return StopResult(stopped=True, reason=f"{name!r} suspended (status.phase {phase})")
        if (found.get("spec") or {}).get("suspend") is not True:
            patch = {"metadata": {"resourceVersion": metadata.get("resourceVersion"),
                                  "annotations": {kubernetes_objects.ANNOTATION_FENCING_TOKEN: str(fencing_token)}},
                     "spec": {"suspend": True}}
            try:
                found = self._call("patch", "patch_namespaced_custom_object", name, name=name,
                                   body=patch)
            except DeliveryFailed as error:
                if error.fields.get("kubernetes_status") == 409:
                    return StopResult(stopped=False, reason=f"{name!r} changed while being "
                                                            "suspended; asking again")
                raise
        return StopResult(stopped=False, reason=(
            f"{name!r}: spec.suspend set (generation {found['metadata'].get('generation')}); "
            f"waiting for the controller to report status.phase {kubernetes_objects.SUSPENDED_PHASE}"))

    # -- calls ---------------------------------------------------------------------

    def _resource(self) -> dict[str, str]:
        return {"group": self.config["group"], "version": self.config["version"],
                "namespace": self.namespace, "plural": self.config["plural"]}

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("get", "get_namespaced_custom_object", name, name=name)
        except DeliveryFailed as error:
            # Absent only if the 404 is about this object, not the resource or namespace.
            if error.fields.get("kubernetes_status") == 404 and \
                    error.fields.get("kubernetes_details") == (name, self.config["plural"]):
                return None
            raise
        return found

    def _call(self, verb: str, method: str, subject: str | None, **arguments: Any) -> Any:
        try:
            return getattr(self._client.api, method)(
                **self._resource(), _request_timeout=self.timeout, **arguments,
            )
        except self._api_exception as error:
            failed = kubernetes_api.failure(error, verb=verb, resource=self.resource,
                                            namespace=self.namespace, name=subject)
            # Which object a 404 is about: the named one, or the resource or namespace.
            details = kubernetes_api.answer(error).details
            failed.fields["kubernetes_details"] = (details.get("name"), details.get("kind"))
            raise failed from error
        except Exception as error:  # urllib3 / socket errors: no answer
            raise kubernetes_api.unreachable(error, verb=verb, host=self.host,
                                             timeout=self.timeout) from error

    def _describe(self, error: Exception) -> str:
        return kubernetes_api.failure(error, verb="list", resource=self.resource,
                                      namespace=self.namespace, name=None).message


# This module's entry in delivery.targets.TARGET_KINDS.
KIND = TargetKind(validate_config, KubernetesTarget,
                  frozenset({*DEFAULTS, *_OPTIONAL, "timeout"}))
