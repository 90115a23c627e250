"""The ``webhook`` target: POST each request once in effect to an HTTP endpoint.

The receiver gets ``Idempotency-Key: <request id>`` and the fencing token in a
header, so it can both deduplicate retries and refuse a stale worker. Its
answer's ``id`` is recorded as the binding's UID; ``GET <url>/<name>`` reads an
object back after a lost reply (or a 409) and, if it carries a ``state`` of
``completed`` or ``failed``, tells the worker how the work ended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    Outcome,
    StopResult,
    check_identity,
)
from quotagate.errors import InvalidInput

FENCING_HEADER = "Quotagate-Fencing-Token"
IDEMPOTENCY_HEADER = "Idempotency-Key"
LEDGER_HEADER = "Quotagate-Ledger"
_FINAL = {"completed": True, "succeeded": True, "failed": False}


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    url = config.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(
        url
    ).netloc:
        raise InvalidInput("a webhook target needs --url http(s)://…", code="invalid_target_config")
    timeout = config.get("timeout", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise InvalidInput("timeout must be a positive number of seconds",
                           code="invalid_target_config")
    return {"url": url.rstrip("/"), "timeout": float(timeout)}


def redact(url: str) -> str:
    """The URL without user and password, safe for logs and error messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return parts._replace(netloc=host).geturl()


def _httpx() -> Any:
    try:
        import httpx
    except ModuleNotFoundError as error:
        raise InvalidInput(
            "the webhook target needs httpx: pip install 'quotagate[webhook]'",
            code="extra_missing",
        ) from error
    return httpx


class WebhookTarget:
    kind = "webhook"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str) -> None:
        self.ledger_id = ledger_id
        checked = validate_config(config)
        self.url: str = checked["url"]
        self.timeout: float = checked["timeout"]
        self._httpx = _httpx()

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        body = {
            "name": spec.external_name,
            "ledger_id": spec.ledger_id,
            "request_id": spec.request_id,
            "tenant": spec.tenant,
            "cost": dict(spec.cost),
            "payload": spec.payload,
            "fencing_token": spec.fencing_token,
        }
        headers = {IDEMPOTENCY_HEADER: spec.request_id, FENCING_HEADER: str(spec.fencing_token),
                   LEDGER_HEADER: spec.ledger_id}
        response = self._call("POST", self.url, json=body, headers=headers)
        if response.status_code == 409:
            found = self.read(spec.external_name)
            if found is None:
                raise DeliveryFailed(
                    f"webhook answered 409 for {spec.external_name!r} but GET finds nothing"
                )
            return check_identity(found, spec)
        if not 200 <= response.status_code < 300:
            raise DeliveryFailed(
                f"webhook answered {response.status_code}: {response.text[:200]}"
            )
        answer = self._json(response)
        created = ExternalObject(
            name=spec.external_name,
            uid=None if answer.get("id") is None else str(answer["id"]),
            request_id=str(answer.get("request_id", spec.request_id)),
            created_now=True,
            ledger_id=str(answer.get("ledger_id", spec.ledger_id)),
        )
        return check_identity(created, spec)

    def read(self, name: str) -> ExternalObject | None:
        answer = self._get(name)
        if answer is None:
            return None
        return ExternalObject(
            name=name,
            uid=None if answer.get("id") is None else str(answer["id"]),
            request_id=str(answer.get("request_id", "")),
            ledger_id=None if answer.get("ledger_id") is None else str(answer["ledger_id"]),
        )

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        found = {obtained.request_id: self.outcome(obtained) for obtained in objects}
        return {request_id: outcome for request_id, outcome in found.items()
                if outcome is not None}

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        return StopResult(stopped=False, reason="the webhook target cannot stop objects yet")

    def close(self) -> None:
        pass

    def outcome(self, obtained: ExternalObject) -> Outcome | None:
        answer = self._get(obtained.name)
        state = None if answer is None else answer.get("state")
        if state not in _FINAL:
            return None
        reason = answer.get("reason") if answer is not None else None
        return Outcome(completed=_FINAL[state], reason=None if reason is None else str(reason))

    def _get(self, name: str) -> dict[str, Any] | None:
        response = self._call("GET", f"{self.url}/{quote(name, safe='')}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise DeliveryFailed(f"webhook GET answered {response.status_code}")
        return self._json(response)

    def _call(self, method: str, url: str, **options: Any) -> Any:
        try:
            return self._httpx.request(method, url, timeout=self.timeout, **options)
        except self._httpx.HTTPError as error:
            raise DeliveryFailed(
                f"webhook {method} {redact(url)} failed: {type(error).__name__}: "
                f"{str(error).replace(url, redact(url))}"
            ) from error

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        try:
            answer = response.json() if response.content else {}
        except json.JSONDecodeError:
            return {}
        return answer if isinstance(answer, dict) else {}
