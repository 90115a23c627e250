"""A stand-in executor on 127.0.0.1 for webhook deliveries: it accepts work that then keeps running.

With it, delivered requests stay ``delivered`` (bound, with their fencing
token) for as long as a test looks at them, instead of failing for want of a
target or finishing by themselves.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

from support.json_http import JsonHandler


class _Executor(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()


class _Handler(JsonHandler):
    server: _Executor

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            found = self.server.objects.setdefault(body["name"], {
                "id": uuid.uuid4().hex, "request_id": body["request_id"],
                "ledger_id": body["ledger_id"], "state": "running"})
        self._reply(201, found)

    def do_GET(self) -> None:
        with self.server.lock:
            found = self.server.objects.get(self.path.rsplit("/", 1)[-1])
        if found is None:
            self._reply(404, {"message": "no such object"})
        else:
            self._reply(200, found)


@contextmanager
def running_executor() -> Iterator[str]:
    """Serve the executor in a thread; yield its URL."""
    executor = _Executor()
    thread = threading.Thread(target=executor.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{executor.server_address[1]}/objects"
    finally:
        executor.shutdown()
        executor.server_close()
