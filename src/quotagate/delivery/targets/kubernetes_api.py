"""The kubernetes client as the target uses it: one ApiClient, errors told apart.

The official client is imported lazily (``quotagate[kubernetes]``). What an
API server answers is translated once, here, into what the worker does next:

* retried with backoff (``DeliveryFailed``): 401/403 (credentials or RBAC an
  operator can fix), 404 on the resource (the CRD or namespace is missing),
  409 that is not AlreadyExists, 429 (throttled; ``retry_after`` kept), 5xx,
  timeouts and unreachable servers;
* not retried (``ObjectRejected``): 400 BadRequest and 422 Invalid — the API
  server refused the object itself, and the same object would be refused again.

Each message names the status, the server's reason and message, and what to
check; none carries a credential.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quotagate.delivery.targets.base import DeliveryFailed
from quotagate.errors import Conflict, InvalidInput, quoted

# Connections kept per API server: a worker delivers many requests at once
# (its --concurrency), and the watch holds one connection for itself.
POOL_SIZE = 64


class ObjectRejected(Conflict):
    """The API server refused the object itself (400/422); retrying cannot help.

    A Conflict, like an identity mismatch, so the worker fails the request at
    once with the server's causes instead of retrying the same refused body.
    """

    status = 422
    default_code = "kubernetes_rejected"


@dataclass(frozen=True)
class Client:
    """The client modules and the one ApiClient a target uses for every call."""

    api: Any  # kubernetes.client.CustomObjectsApi over the target's ApiClient
    api_exception: type[Exception]
    watch: Any  # kubernetes.watch module
    models: Any  # kubernetes.client (V1DeleteOptions, V1Preconditions)

    def close(self) -> None:
        self.api.api_client.close()


def connect(config: Mapping[str, Any]) -> Client:
    """Build the target's ApiClient once: explicit host, kubeconfig, in-cluster, ~/.kube/config."""
    try:
        import urllib3
        from kubernetes import client, watch
        from kubernetes import config as kube_config_module
        from kubernetes.client.exceptions import ApiException
    except ModuleNotFoundError as error:
        raise InvalidInput(
            "the kubernetes target needs the kubernetes client: "
            "pip install 'quotagate[kubernetes]'",
            code="extra_missing",
        ) from error
    kube_config: Any = kube_config_module  # its loaders are untyped
    configuration = client.Configuration()
    if "host" in config:
        # An explicit API server URL, e.g. ``kubectl proxy`` on 127.0.0.1:8001.
        configuration.host = config["host"]
    elif "kubeconfig" in config or "context" in config:
        kube_config.load_kube_config(
            config_file=config.get("kubeconfig"), context=config.get("context"),
            client_configuration=configuration,
        )
    else:
        try:
            kube_config.load_incluster_config(client_configuration=configuration)
        except kube_config.ConfigException:
            kube_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = POOL_SIZE
    # Connection failures are retried by urllib3; a read that timed out is not
    # (more than once, for a pooled connection the server closed): the worker
    # retries a delivery with backoff, and a stalled API server must not hold a
    # worker thread for several timeouts.
    configuration.retries = urllib3.Retry(total=3, connect=3, read=1, status=0, other=0,
                                          redirect=0)
    api = client.CustomObjectsApi(client.ApiClient(configuration))
    return Client(api=api, api_exception=ApiException, watch=watch, models=client)


@dataclass(frozen=True)
class Answer:
    """An API error as the server worded it (its ``Status`` body)."""

    code: int
    reason: str
    message: str
    details: Mapping[str, Any]
    retry_after: int | None

    @property
    def text(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"


def answer(error: Any) -> Answer:
    """Read an ApiException's Status body (the message a real server sends)."""
    text = error.body if isinstance(error.body, str) else ""
    try:
        body: Any = json.loads(text or "{}")
    except (ValueError, RecursionError):
        # Not a Status (e.g. "404 page not found" for an API group nobody serves).
        body = {"message": text.strip()[:200]}
    if not isinstance(body, dict):
        body = {}
    details = body.get("details") if isinstance(body.get("details"), dict) else {}
    retry_after: int | None = None
    header = (error.headers or {}).get("Retry-After") if error.headers is not None else None
    for candidate in (details.get("retryAfterSeconds"), header):
        try:
            retry_after = int(candidate) if candidate is not None else retry_after
        except (TypeError, ValueError):
            continue
    return Answer(code=int(error.status or 0), reason=str(body.get("reason") or error.reason or ""),
                  message=str(body.get("message") or error.reason or "no message"),
                  details=details, retry_after=retry_after)


def failure(error: Any, *, verb: str, resource: str, namespace: str, name: str | None,
            ) -> DeliveryFailed | ObjectRejected:
    """What the worker should make of an API error answering ``verb`` on ``resource``."""
    found = answer(error)
    subject = f"{resource} {name!r}" if name else resource
    fields: dict[str, Any] = {"kubernetes_status": found.code, "kubernetes_reason": found.reason}
    # What a tenant may read (docs/decisions/214): the status and reason, no names or hosts.
    fields["public"] = f"kubernetes answered {found.code} {found.reason}".strip()
    if found.code in (400, 422):
        causes = found.details.get("causes")
        return ObjectRejected(f"kubernetes refused {subject} in namespace {namespace!r}: "
                              f"{found.text}", causes=causes or [], **fields)
    if found.code == 401:
        hint = "the worker's credentials were refused: check its token or kubeconfig"
        code = "kubernetes_unauthorized"
    elif found.code == 403:
        hint = (f"the worker's Role needs {verb!r} on {resource.split('.')[0]!r} in namespace "
                f"{namespace!r} (deploy/rbac/worker-role.yaml)")
        code = "kubernetes_forbidden"
    elif found.code == 404:
        hint = (f"is {resource} served (kubectl apply -f deploy/crds/modelservice.yaml) and does "
                f"namespace {namespace!r} exist?")
        code = "kubernetes_not_found"
    elif found.code == 429:
        after = f"; retry after {found.retry_after}s" if found.retry_after is not None else ""
        hint = f"the API server is throttling the worker{after}"
        code = "kubernetes_throttled"
        if found.retry_after is not None:
            fields["retry_after"] = found.retry_after
    elif found.code >= 500:
        hint = "the API server failed; retrying"
        code = "kubernetes_unavailable"
    else:
        hint = "retrying"
        code = "kubernetes_error"
    return DeliveryFailed(f"kubernetes {verb} {subject} in namespace {quoted(namespace)} answered "
                          f"{found.text} ({hint})", code=code, **fields)


def unreachable(error: Exception, *, verb: str, host: str, timeout: float) -> DeliveryFailed:
    """A call that got no answer: a timeout, or no API server at ``host``."""
    text = f"{type(error).__name__}: {error}"
    if "timed out" in text.lower() or "timeout" in type(error).__name__.lower():
        return DeliveryFailed(f"kubernetes {verb} got no answer from {host} within {timeout:g}s "
                              f"({text})", code="kubernetes_timeout",
                              public="kubernetes did not answer in time")
    return DeliveryFailed(f"kubernetes API unreachable at {host} ({verb}): {text}",
                          code="kubernetes_unreachable", public="kubernetes API unreachable")
