"""The ``webhook`` target: POST each request once in effect to an HTTP endpoint.

The receiver gets ``Idempotency-Key: <request id>`` (``<request id>#<attempt>`` for a
requeued request's later attempt), the fencing token and the
ledger id in headers (``Quotagate-Fencing-Token``, ``Quotagate-Ledger``), so
it can deduplicate retries, refuse a stale worker and tell ledgers apart. Its
answer's ``id`` is recorded as the binding's UID; ``GET <url>/<name>`` reads an
object back after a lost reply (or a 409) and, if it carries a ``state`` of
``completed`` or ``failed``, tells the worker how the work ended (a receiver
may instead call back, see docs/delivery.md). ``DELETE <url>/<name>`` asks it
to stop: 200/204/404 confirm (404: it is gone), 202 means "stopping, ask again".

With ``batch_deliver`` (``--batch-deliver N``) the worker sends up to N
deliveries in one ``POST <url>/_batch`` and the receiver answers each item on
its own (docs/decisions/236); every item carries what a single delivery's
headers carry, so nothing about identity or fencing changes.

One urllib3 connection pool per target keeps connections open across deliveries: under
the worker's delivery threads it costs about a third of the CPU per POST that an
``httpx.Client`` did (docs/decisions/255).
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from quotagate.delivery.reasons import redact_text
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    IdentityMismatch,
    Outcome,
    StopResult,
    TargetKind,
    check_identity,
)
from quotagate.errors import InvalidInput, quoted

FENCING_HEADER = "Quotagate-Fencing-Token"
IDEMPOTENCY_HEADER = "Idempotency-Key"
LEDGER_HEADER = "Quotagate-Ledger"
# Concurrent outcome GETs per target: enough to hide the round trips, few
# enough not to crowd the delivery threads of a small machine.
OUTCOME_READERS = 16
BATCH_READ = 500  # names per batch read call
MAX_BATCH_DELIVER = 500  # deliveries per batch POST, at most
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
    poll_every = config.get("poll_every", 0.0)
    if isinstance(poll_every, bool) or not isinstance(poll_every, int | float) or poll_every < 0:
        raise InvalidInput("poll-every must be 0 or more seconds", code="invalid_target_config")
    batch_read = config.get("batch_read", False)
    if not isinstance(batch_read, bool):
        raise InvalidInput("batch-read must be true or false", code="invalid_target_config")
    batch_deliver = config.get("batch_deliver", 1)
    if (isinstance(batch_deliver, bool) or not isinstance(batch_deliver, int)
            or not 1 <= batch_deliver <= MAX_BATCH_DELIVER):
        raise InvalidInput(f"batch-deliver must be a whole number from 1 to {MAX_BATCH_DELIVER}",
                           code="invalid_target_config")
    checked: dict[str, Any] = {"url": url.rstrip("/"), "timeout": float(timeout)}
    if poll_every:
        checked["poll_every"] = float(poll_every)
    if batch_read:
        checked["batch_read"] = True
    if batch_deliver > 1:
        checked["batch_deliver"] = batch_deliver
    return checked


def redact(url: str) -> str:
    """The URL without user, password or query values, safe for logs and error messages."""
    return redact_text(url)


def _urllib3() -> Any:
    try:
        import urllib3
    except ModuleNotFoundError as error:
        raise InvalidInput(
            "the webhook target needs urllib3: pip install 'quotagate[webhook]'",
            code="extra_missing",
        ) from error
    # urllib3 logs every request's full URL at DEBUG, query-string secrets
    # included; our own messages carry the redacted URL instead.
    logging.getLogger("urllib3").setLevel(max(logging.WARNING,
                                              logging.getLogger("urllib3").level))
    return urllib3


@dataclass(frozen=True)
class _Answer:
    """What a receiver answered: its status and body."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


def idempotency_key(spec: DeliverySpec) -> str:
    """The request id; a requeued request's later attempt adds its number (``job-1#2``),
    so a receiver that dedupes by key does not take it for the stopped attempt's replay."""
    return spec.request_id if spec.attempt == 1 else f"{spec.request_id}#{spec.attempt}"


class WebhookTarget:
    kind = "webhook"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str,
                 max_connections: int = 64,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ledger_id = ledger_id
        checked = validate_config(config)
        # urllib3 drops a URL's user:password silently: it goes as Basic auth on every
        # call instead, and the URL the calls use (and their errors name) holds none.
        self.url, self._credentials = _split_credentials(checked["url"])
        self.timeout: float = checked["timeout"]
        # 0: every object on every outcome pass. More: each object at most once per
        # that many seconds, the first time that long after this worker first saw it
        # delivered (a receiver that calls back needs only a rare safety-net read).
        self.poll_every: float = checked.get("poll_every", 0.0)
        self._schedule = _ReadSchedule(self.poll_every, monotonic)
        # Read outcomes with ``POST <url>/_read`` (many names per call) instead of a GET each.
        self.batch_read: bool = checked.get("batch_read", False)
        # Deliveries per ``POST <url>/_batch``; 1: one POST per delivery.
        self.batch_size: int = checked.get("batch_deliver", 1)
        self._urllib3 = _urllib3()
        self.max_connections = max_connections
        self._reader_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._readers_lock = threading.Lock()
        # block: a delivery thread past max_connections waits for a connection (at most
        # the timeout) instead of opening one more. No retries and no redirects: a
        # retried POST is the worker's decision (its backoff, its fencing), and a
        # redirect would send the request somewhere the admin did not configure.
        self._client = self._urllib3.PoolManager(
            maxsize=max_connections, block=True, retries=False,
            timeout=self._urllib3.Timeout(connect=self.timeout, read=self.timeout),
        )

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        headers = {IDEMPOTENCY_HEADER: idempotency_key(spec), FENCING_HEADER: str(spec.fencing_token),
                   LEDGER_HEADER: spec.ledger_id}
        response = self._call("POST", self.url, document=_body(spec), headers=headers)
        if not 200 <= response.status_code < 300 and response.status_code != 409:
            # The receiver's body may echo anything (the payload, its own
            # secrets): it goes nowhere, not even into the admin's error.
            raise DeliveryFailed(f"webhook POST {redact(self.url)} answered "
                                 f"{response.status_code}",
                                 public=f"webhook answered {response.status_code}")
        return self._created(spec, response.status_code, self._json(response))

    def create_many(self, specs: Sequence[DeliverySpec]) -> list[ExternalObject | Exception]:
        """Up to ``batch_size`` deliveries in one ``POST <url>/_batch``, each answered alone.

        Body ``{"deliveries": [...]}``, each item the single delivery's body
        plus its ``idempotency_key``; the answer ``{"results": [{"status": S,
        "object": {...}}, ...]}`` in the same order. An item is judged exactly as
        a single POST answered ``S`` would be (2xx created, 409 read back and
        its identity checked, anything else a retryable failure of that item);
        an answer that is not such a list fails every item of the call, and
        none of them is bound.
        """
        results: list[ExternalObject | Exception] = []
        for start in range(0, len(specs), self.batch_size):
            results.extend(self._create_chunk(specs[start:start + self.batch_size]))
        return results

    def _create_chunk(self, specs: Sequence[DeliverySpec]) -> list[ExternalObject | Exception]:
        url = self._below("_batch")
        # The ledger is the same for every item; tokens and keys are per item, in the body.
        headers = {LEDGER_HEADER: specs[0].ledger_id}
        deliveries = [{**_body(spec), "idempotency_key": idempotency_key(spec)} for spec in specs]
        try:
            response = self._call("POST", url, document={"deliveries": deliveries},
                                  headers=headers)
            if response.status_code != 200:
                raise DeliveryFailed(f"webhook POST {redact(url)} answered "
                                     f"{response.status_code}",
                                     public=f"webhook answered {response.status_code}")
            answers = self._json(response).get("results")
            if not isinstance(answers, list) or len(answers) != len(specs) or not all(
                isinstance(answer, dict) for answer in answers
            ):
                raise DeliveryFailed(f"webhook POST {redact(url)} answered without one result "
                                     f"per delivery ({len(specs)})",
                                     public="webhook answered without a result per delivery")
        except DeliveryFailed as error:
            return [error] * len(specs)
        results: list[ExternalObject | Exception] = []
        for spec, answer in zip(specs, answers, strict=True):
            status = answer.get("status")
            found = answer.get("object")
            try:
                if not isinstance(status, int) or isinstance(status, bool) or not (
                    200 <= status < 300 or status == 409
                ):
                    raise DeliveryFailed(
                        f"webhook POST {redact(url)} answered {quoted(status)} for "
                        f"{quoted(spec.external_name)}", public=f"webhook answered {status}")
                results.append(self._created(spec, status,
                                             found if isinstance(found, dict) else {}))
            except (DeliveryFailed, IdentityMismatch) as error:
                results.append(error)
        return results

    def _created(self, spec: DeliverySpec, status: int, answer: dict[str, Any]) -> ExternalObject:
        """The object a 2xx answer created, or on 409 the one read back (identity checked)."""
        if status == 409:
            found = self.read(spec.external_name)
            if found is None:
                raise DeliveryFailed(
                    f"webhook answered 409 for {quoted(spec.external_name)} but GET finds nothing",
                    public="webhook answered 409",
                )
            return check_identity(found, spec)
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
        """One GET per object over the shared connection pool, up to
        ``OUTCOME_READERS`` at a time, each object at most once per
        ``poll_every`` seconds when that is set (receivers that call back need
        only a rare read); a 404 after binding ends the request failed.

        The GETs run concurrently because a worker reads outcomes between
        delivery batches: hundreds of them one after another held delivery up
        for seconds per pass (docs/decisions/217).
        """
        objects = self._schedule.due(objects)
        if self.batch_read and objects:
            answers = self._read_many([obtained.name for obtained in objects])
        elif len(objects) > 1:
            answers = list(self._readers().map(lambda obtained: self._get(obtained.name),
                                               objects))
        else:
            answers = [self._get(obtained.name) for obtained in objects]
        ended: dict[str, Outcome] = {}
        for obtained, answer in zip(objects, answers, strict=True):
            if answer is None:
                ended[obtained.request_id] = Outcome(
                    completed=False, reason="the webhook object disappeared")
                continue
            state = answer.get("state")
            if state in _FINAL:
                reason = answer.get("reason")
                ended[obtained.request_id] = Outcome(
                    completed=_FINAL[state], reason=None if reason is None else str(reason)
                )
        self._schedule.forget(obtained.name for obtained in objects
                              if obtained.request_id in ended)
        return ended

    def _readers(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._readers_lock:
            if self._reader_pool is None:
                self._reader_pool = concurrent.futures.ThreadPoolExecutor(
                    min(self.max_connections, OUTCOME_READERS),
                    thread_name_prefix="webhook-outcomes",
                )
            return self._reader_pool

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        headers = {IDEMPOTENCY_HEADER: obtained.request_id, FENCING_HEADER: str(fencing_token),
                   LEDGER_HEADER: self.ledger_id}
        response = self._call("DELETE", self._below(obtained.name),
                              headers=headers)
        if response.status_code == 404:
            return StopResult(stopped=True, reason="the webhook object is gone")
        if response.status_code in (200, 204):
            return StopResult(stopped=True, reason="the webhook receiver confirmed the stop")
        if response.status_code == 202:
            return StopResult(stopped=False, reason="the webhook receiver is stopping it")
        return StopResult(stopped=False, failed=True,
                          reason=f"webhook DELETE answered {response.status_code}")

    def close(self) -> None:
        with self._readers_lock:
            pool, self._reader_pool = self._reader_pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._client.clear()  # closes every kept connection

    def _read_many(self, names: Sequence[str]) -> list[dict[str, Any] | None]:
        """``POST <url>/_read`` with ``{"names": […]}``, ``BATCH_READ`` names per call.

        The receiver answers ``{"objects": {name: object}}``, leaving out names it
        does not have (``_read`` is no object's name: names are DNS-1123 labels).
        """
        answers: list[dict[str, Any] | None] = []
        for start in range(0, len(names), BATCH_READ):
            chunk = list(names[start:start + BATCH_READ])
            response = self._call("POST", self._below("_read"), document={"names": chunk})
            if response.status_code != 200:
                raise DeliveryFailed(f"webhook batch read answered {response.status_code}",
                                     public=f"webhook answered {response.status_code}")
            found = self._json(response).get("objects")
            if not isinstance(found, dict):
                raise DeliveryFailed("webhook batch read answered without an objects map",
                                     public="webhook answered without objects")
            for name in chunk:
                answer = found.get(name)
                answers.append(answer if isinstance(answer, dict) else None)
        return answers

    def _get(self, name: str) -> dict[str, Any] | None:
        response = self._call("GET", self._below(name))
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise DeliveryFailed(f"webhook GET answered {response.status_code}",
                                 public=f"webhook answered {response.status_code}")
        return self._json(response)

    def _below(self, name: str) -> str:
        """``<url>/<name>``, the name before the URL's query string (which it keeps)."""
        parts = urlsplit(self.url)
        path = f"{parts.path.rstrip('/')}/{quote(name, safe='')}"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))

    def _call(self, method: str, url: str, *, document: Any = None,
              headers: Mapping[str, str] | None = None) -> _Answer:
        """``method url``, with ``document`` as its JSON body if given."""
        sent = {**(headers or {}), **self._credentials}
        body = None
        if document is not None:
            body = json.dumps(document).encode()
            sent["Content-Type"] = "application/json"
        try:
            response = self._client.request(method, url, body=body, headers=sent,
                                            redirect=False, pool_timeout=self.timeout)
        except self._urllib3.exceptions.HTTPError as error:
            # urllib3's messages name the path and query string: redact the text whole.
            raise DeliveryFailed(
                f"webhook {method} {redact(url)} failed: {type(error).__name__}: "
                f"{redact(str(error).replace(url, redact(url)))}",
                public=f"webhook unreachable ({type(error).__name__})",
            ) from error
        return _Answer(response.status, response.data)

    @staticmethod
    def _json(response: _Answer) -> dict[str, Any]:
        try:
            answer = response.json() if response.content else {}
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
            return {}
        return answer if isinstance(answer, dict) else {}


def _split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its ``user:password@``, and the Basic auth header it stood for."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    header = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    host = parts.netloc.rpartition("@")[2]
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, {"Authorization": header}


def _body(spec: DeliverySpec) -> dict[str, Any]:
    """What a receiver gets for one delivery (the worker's own settings never go in it)."""
    return {
        "name": spec.external_name,
        "ledger_id": spec.ledger_id,
        "request_id": spec.request_id,
        "tenant": spec.tenant,
        "cost": dict(spec.cost),
        "payload": spec.payload,
        "fencing_token": spec.fencing_token,
        "attempt": spec.attempt,
    }


class _ReadSchedule:
    """When each object's outcome is read next, with ``poll_every`` seconds between reads.

    Kept per target in memory: a restarted worker starts afresh, which only
    delays each read by up to ``poll_every``. Objects not offered for a while
    (ended elsewhere, by a callback) are dropped, so the table stays as large
    as the set of running objects.
    """

    def __init__(self, poll_every: float, monotonic: Callable[[], float]) -> None:
        self.poll_every = poll_every
        self._monotonic = monotonic
        self._next: dict[str, tuple[float, float]] = {}  # name -> (next read, last offered)
        self._pruned_at = monotonic()
        self._lock = threading.Lock()

    def due(self, objects: Sequence[ExternalObject]) -> list[ExternalObject]:
        if not self.poll_every:
            return list(objects)
        now = self._monotonic()
        due = []
        with self._lock:
            for obtained in objects:
                next_read, _offered = self._next.get(obtained.name, (now + self.poll_every, now))
                if next_read <= now:
                    due.append(obtained)
                    next_read = now + self.poll_every
                self._next[obtained.name] = (next_read, now)
            if now - self._pruned_at >= self.poll_every:
                horizon = now - 3 * self.poll_every - 60
                self._next = {name: entry for name, entry in self._next.items()
                              if entry[1] >= horizon}
                self._pruned_at = now
        return due

    def forget(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                self._next.pop(name, None)


# This module's entry in delivery.targets.TARGET_KINDS.
KIND = TargetKind(validate_config, WebhookTarget, frozenset({
    "url", "timeout", "poll_every", "batch_read", "batch_deliver"}))
