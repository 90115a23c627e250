"""The HTTP side of the in-suite API server: routes, verbs, watch streams, injected faults.

Served: ``/apis/{group}/{version}/namespaces/{namespace}/{plural}`` (POST
create; GET list, paged by ``limit``/``continue`` from one snapshot, or watch
with ``watch=true``) and ``…/{plural}/{name}`` (GET,
PATCH with a JSON merge patch, DELETE with DeleteOptions) and ``…/{name}/status``.
Order of checks as on a real server: authentication, authorization, then the
resource, then the request itself.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from support.json_http import JsonHandler
from support.kube_api import status
from support.kube_api.access import Access, Role
from support.kube_api.store import MODEL_SERVICE_CRD, ObjectStore, ResourceType, load_crd
from support.kube_api.validation import SelectorError, parse_selector

_PREFIX = "/apis/"
MERGE_PATCH = "application/merge-patch+json"


@dataclass
class Fault:
    """Answer the next ``times`` calls of ``verb`` (optionally on one object) abnormally."""

    verb: str
    code: int | None = None  # answer this error instead of acting
    times: int = 1
    delay: float = 0.0  # wait first: longer than the client's timeout makes a timeout
    drop_reply: bool = False  # act, then close the connection without an answer
    retry_after: int | None = None
    name: str | None = None

    def error(self) -> status.ApiError:
        assert self.code is not None
        reason, message = status.FAULTS.get(self.code, ("InternalError", "injected"))
        details: dict[str, Any] = {}
        headers = {}
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
            headers["Retry-After"] = str(self.retry_after)
        return status.ApiError(self.code, reason, message, details, headers)


@dataclass(frozen=True)
class Call:
    verb: str
    name: str | None
    query: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    namespace: str
    plural: str
    name: str | None
    subresource: str | None

    @classmethod
    def parse(cls, path: str) -> Route:
        parts = path[len(_PREFIX):].split("/") if path.startswith(_PREFIX) else []
        if len(parts) not in (5, 6, 7) or parts[2] != "namespaces" or not all(parts):
            raise status.not_found_resource()
        group, version, _, namespace, plural, *rest = parts
        return cls(group, version, namespace, plural, rest[0] if rest else None,
                   rest[1] if len(rest) > 1 else None)

    def verb(self, method: str, query: Mapping[str, str]) -> str:
        if self.name is None:
            if method == "GET":
                return "watch" if query.get("watch") in ("true", "1") else "list"
            if method == "POST":
                return "create"
        else:
            verbs = {"GET": "get", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}
            if method in verbs:
                return verbs[method]
        raise status.ApiError(405, "MethodNotAllowed",
                              "the server does not allow this method on the requested resource")


class KubeApiHandler(JsonHandler):
    server: KubeApiServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    # Headers and body go out in two writes; with Nagle on, the second waits for
    # the client's delayed ACK (~40 ms a reply). Go's net/http, which a real API
    # server runs on, sets TCP_NODELAY too.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def _answer(self, code: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _answer_plain(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except ValueError as error:
            raise status.bad_request(f"couldn't get version/kind; json parse error: {error}") from error

    def _handle(self, method: str) -> None:
        server = self.server
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        fault: Fault | None = None
        try:
            body = self._body()
            user = server.access.authenticate(self.headers.get("Authorization"))
            route = Route.parse(url.path)
            verb = route.verb(method, query)
            server.record(Call(verb, route.name, query))
            server.access.authorize(user, verb, route.group, route.plural, route.subresource,
                                    route.namespace, route.name)
            kind = server.store.resource_type(route.group, route.version, route.plural)
            if route.subresource is not None and (route.subresource != "status"
                                                  or not kind.status_subresource):
                raise status.not_found_resource()
            fault = server.take_fault(verb, route.name)
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            if fault is not None and fault.code is not None:
                raise fault.error()
            server.store.check_namespace(route.namespace)
            if verb == "watch":
                self._watch(kind, route.namespace, query)
                return
            code, answer = self._act(verb, kind, route, query, body)
        except status.ApiError as error:
            if error.plain is not None:
                self._answer_plain(error.code, error.plain)
            else:
                self._answer(error.code, error.body(), error.headers)
            return
        if fault is not None and fault.drop_reply:
            # The request took effect; the client never hears of it (a lost reply).
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._answer(code, answer)

    def _act(self, verb: str, kind: ResourceType, route: Route, query: Mapping[str, str],
             body: Any) -> tuple[int, Any]:
        store = self.server.store
        if verb == "create":
            return 201, store.create(kind, route.namespace, self._checked_create(kind, route, body))
        if verb == "list":
            return 200, self._list(kind, route.namespace, query)
        assert route.name is not None
        if verb == "get":
            return 200, store.get(kind, route.namespace, route.name)
        if verb == "delete":
            options = body if isinstance(body, dict) else {}
            return 200, store.delete(kind, route.namespace, route.name, options)
        if verb == "patch":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if content_type != MERGE_PATCH:
                raise status.ApiError(
                    415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {MERGE_PATCH}")
            return 200, store.patch(kind, route.namespace, route.name, body, route.subresource)
        raise status.ApiError(405, "MethodNotAllowed", f"{verb} is not served here")

    def _list(self, kind: ResourceType, namespace: str, query: Mapping[str, str]) -> dict[str, Any]:
        """A list, in pages of ``limit`` from one snapshot, as a real server pages with ``continue``."""
        server = self.server
        token = query.get("continue")
        if token:
            with server.lock:
                snapshot = server.list_snapshots.pop(token, None)
            if snapshot is None:
                raise status.ApiError(410, "Expired", "The provided continue parameter is too "
                                      "old to display a consistent list result.")
            items, revision = snapshot
        else:
            items, revision = server.store.list(kind, namespace, self._selector(query))
        limit = int(query.get("limit") or 0)
        metadata: dict[str, Any] = {"resourceVersion": str(revision)}
        if limit and len(items) > limit:
            items, rest = items[:limit], items[limit:]
            following = uuid.uuid4().hex
            with server.lock:
                server.list_snapshots[following] = (rest, revision)
            metadata["continue"] = following
            metadata["remainingItemCount"] = len(rest)
        return {"apiVersion": kind.api_version, "kind": kind.list_kind, "metadata": metadata,
                "items": items}

    @staticmethod
    def _checked_create(kind: ResourceType, route: Route, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise status.bad_request("the body of the request must be a JSON object")
        if body.get("apiVersion") != kind.api_version:
            raise status.bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version ({kind.api_version})")
        if body.get("kind") != kind.kind:
            raise status.bad_request(
                f"the kind in the data ({body.get('kind')}) does not match the expected kind "
                f"({kind.kind})")
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            raise status.bad_request("metadata must be an object")
        if metadata.get("namespace") not in (None, "", route.namespace):
            raise status.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request")
        return body

    @staticmethod
    def _selector(query: Mapping[str, str]) -> list[Any]:
        try:
            return parse_selector(query.get("labelSelector"))
        except SelectorError as error:
            raise status.bad_request(str(error)) from error

    # -- watch ---------------------------------------------------------------------

    def _watch(self, kind: ResourceType, namespace: str, query: Mapping[str, str]) -> None:
        server, store = self.server, self.server.store
        requirements = self._selector(query)
        since = query.get("resourceVersion") or "0"
        if not since.isdigit():
            raise status.bad_request(f"invalid resource version: {since!r}")
        seconds = min(float(query.get("timeoutSeconds") or server.max_watch_seconds),
                      server.max_watch_seconds)
        deadline = time.monotonic() + seconds
        epoch = server.watch_epoch
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        with server.lock:
            server.open_watches += 1
        try:
            if since == "0":  # from "now": the current objects as ADDED first
                items, seen = store.list(kind, namespace, requirements)
                for item in items:
                    self._event("ADDED", item)
            else:
                seen = int(since)
            while True:
                try:
                    events = store.events_after(kind, namespace, seen)
                except status.ApiError:
                    self._event("ERROR", status.expired(seen, store.oldest_watchable))
                    break
                with store.changed:
                    revision = store.revision
                for event in events:
                    if event.revision > revision:
                        break
                    shown = event.as_seen_by(requirements)
                    if shown is not None:
                        self._event(*shown)
                seen = revision
                with store.changed:
                    store.changed.wait_for(
                        lambda up_to=seen: store.revision > up_to or server.watch_epoch != epoch,
                        timeout=min(0.1, max(0.0, deadline - time.monotonic())),
                    )
                if self._client_gone():
                    return
                ended = server.watch_epoch != epoch
                if time.monotonic() >= deadline or ended:
                    if query.get("allowWatchBookmarks") == "true" and (
                            not ended or server.bookmark_on_end):
                        self._event("BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version,
                                                 "metadata": {"resourceVersion": str(seen)}})
                    break
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away (closed its watch)
        finally:
            with server.lock:
                server.open_watches -= 1

    def _client_gone(self) -> bool:
        """Did the client close its end (a real server sees its request context cancelled)?"""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _event(self, kind: str, item: Mapping[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": item}).encode() + b"\n"
        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        self.wfile.flush()


class KubeApiServer(ThreadingHTTPServer):
    """An API server on 127.0.0.1 serving the CRD's custom objects; see the package docstring."""

    daemon_threads = True

    def __init__(self, crd: Path = MODEL_SERVICE_CRD) -> None:
        super().__init__(("127.0.0.1", 0), KubeApiHandler)
        self.store = ObjectStore()
        self.store.serve(load_crd(crd))
        self.access = Access()
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.calls: list[Call] = []
        self.list_snapshots: dict[str, tuple[list[dict[str, Any]], int]] = {}
        self.watch_epoch = 0
        self.bookmark_on_end = True
        self.open_watches = 0
        self.max_watch_seconds = 30.0

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    # -- what the handler uses -----------------------------------------------------

    def record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def take_fault(self, verb: str, name: str | None) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.verb == verb and fault.name in (None, name) and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    # -- what tests use: the cluster's operator, its controller, its failures ------

    def inject(self, verb: str, code: int | None = None, **options: Any) -> Fault:
        fault = Fault(verb, code, **options)
        with self.lock:
            self.faults.append(fault)
        return fault

    def calls_of(self, verb: str) -> list[Call]:
        with self.lock:
            return [call for call in self.calls if call.verb == verb]

    def require_token(self, token: str, role: Role | None = None) -> None:
        self.access = Access(token, role)

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig file for this server (as ``kubectl config view --raw`` writes one)."""
        user: dict[str, Any] = {"token": token} if token else {}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "in-suite",
            "clusters": [{"name": "in-suite", "cluster": {"server": self.host}}],
            "users": [{"name": "worker", "user": user}],
            "contexts": [{"name": "in-suite",
                          "context": {"cluster": "in-suite", "user": "worker"}}],
        }))
        return path

    def model_services(self) -> list[dict[str, Any]]:
        return list(self.store.all_objects())

    def _kind(self) -> ResourceType:
        return next(iter(self.store.types.values()))

    def get(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.store.get(self._kind(), namespace, name)

    def set_status(self, name: str, namespace: str = "default", **fields: Any) -> dict[str, Any]:
        """What a controller does: PATCH …/status."""
        return self.store.patch(self._kind(), namespace, name, {"status": fields}, "status")

    def patch(self, name: str, patch: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        return self.store.patch(self._kind(), namespace, name, patch)

    def delete(self, name: str, namespace: str = "default") -> None:
        """What ``kubectl delete`` does (marks it while finalizers remain)."""
        self.store.delete(self._kind(), namespace, name, {})

    def end_watches(self, *, bookmark: bool = True) -> None:
        """Close every open watch stream, as an API server restart would.

        With ``bookmark`` the streams end with a BOOKMARK of the current version
        (as a graceful server does); without, watchers keep the version of the
        last event they saw.
        """
        with self.store.changed:
            self.bookmark_on_end = bookmark
            self.watch_epoch += 1
            self.store.changed.notify_all()


@contextmanager
def running_api_server(crd: Path = MODEL_SERVICE_CRD) -> Iterator[KubeApiServer]:
    server = KubeApiServer(crd)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.end_watches()
        server.shutdown()
        server.server_close()
        thread.join()
