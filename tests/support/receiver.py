"""A webhook receiver on 127.0.0.1 for the delivery engine tests (a real HTTP server).

It behaves like an idempotent receiver: objects keyed by name, 409 on a second
POST of a name, ``POST /hooks/_batch`` for many deliveries at once (each item
answered on its own), ``GET /hooks/<name>`` to read back, ``DELETE /hooks/<name>`` to
stop. It records every call with its headers, tracks how many POSTs of one
idempotency key are in flight at once, and its answers can be scripted.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

from support.json_http import JsonHandler


class Receiver(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[dict[str, Any]] = []
        self.in_flight: dict[str, int] = {}
        self.most_in_flight: dict[str, int] = {}
        self.post_delay = 0.0
        self.post_status: int | None = None  # answer every POST with this, body included
        self.post_body: dict[str, Any] = {}
        self.initial_state = "running"
        self.delete_answers: list[int] = []  # scripted DELETE answers; then 204
        self.never_confirm_stop = False  # DELETE answers 202 forever
        # request id -> (status, times): answer that item of a delivery with status, so often
        self.refuse_items: dict[str, tuple[int, int]] = {}
        self.batch_answer: dict[str, Any] | None = None  # answer every _batch call with this

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks"

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [call for call in self.calls if call["method"] == method]


class _Handler(JsonHandler):
    server: Receiver

    def _record(self, body: Any = None) -> None:
        with self.server.lock:
            self.server.calls.append({"method": self.command, "path": self.path,
                                      "headers": dict(self.headers), "body": body})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._record(body)
        if self.path.split("?", 1)[0].endswith("/_batch"):
            if self.server.batch_answer is not None:
                self._reply(200, self.server.batch_answer)
                return
            # One call, many deliveries, each answered as its own POST would be.
            results = []
            for item in body["deliveries"]:
                status, answer = self._deliver(item, item["idempotency_key"])
                results.append({"status": status, "object": answer})
            self._reply(200, {"results": results})
            return
        status, answer = self._deliver(body, self.headers["Idempotency-Key"])
        self._reply(status, answer)

    def _deliver(self, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
        with self.server.lock:
            self.server.in_flight[key] = self.server.in_flight.get(key, 0) + 1
            self.server.most_in_flight[key] = max(self.server.most_in_flight.get(key, 0),
                                                  self.server.in_flight[key])
        try:
            if self.server.post_delay:
                time.sleep(self.server.post_delay)  # the receiver's own work, for overlap
            if self.server.post_status is not None:
                return self.server.post_status, self.server.post_body
            with self.server.lock:
                status, times = self.server.refuse_items.get(body["request_id"], (0, 0))
                if times > 0:
                    # Scripted: refuse this request's next ``times`` deliveries.
                    self.server.refuse_items[body["request_id"]] = (status, times - 1)
                    return status, {"error": "refused"}
                name = body["name"]
                if name in self.server.objects:
                    return 409, {"error": "exists"}
                stored = {"id": uuid.uuid4().hex, "name": name,
                          "request_id": body["request_id"], "ledger_id": body["ledger_id"],
                          "fencing_token": body["fencing_token"],
                          "state": self.server.initial_state}
                self.server.objects[name] = stored
            return 201, stored
        finally:
            with self.server.lock:
                self.server.in_flight[key] -= 1

    def do_GET(self) -> None:
        self._record()
        name = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
        with self.server.lock:
            found = self.server.objects.get(name)
        if found is None:
            self._reply(404, {"error": "not found"})
        else:
            self._reply(200, found)

    def do_DELETE(self) -> None:
        self._record()
        name = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
        with self.server.lock:
            if name not in self.server.objects:
                status = 404
            elif self.server.never_confirm_stop:
                status = 202
            elif self.server.delete_answers:
                status = self.server.delete_answers.pop(0)
            else:
                status = 204
            if status in (200, 204):
                self.server.objects[name]["state"] = "stopped"
        self._reply(status, {})


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
