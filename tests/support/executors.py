"""Getting requests to ``delivered`` for real: a webhook receiver on 127.0.0.1 and the dispatcher.

The receiver accepts every POST (201 with an id; ``POST …/_batch``: 201 for each item)
and answers GETs with
``running``, so a delivered request stays delivered until someone ends it.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from support.json_http import JsonHandler
from support.waiting import wait_for


class _Handler(JsonHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/_batch"):  # many deliveries in one call (--batch-deliver)
            self._reply(200, {"results": [
                {"status": 201, "object": {"id": uuid.uuid4().hex,
                                           "request_id": item["request_id"], "state": "running"}}
                for item in body["deliveries"]]})
            return
        self._reply(201, {"id": uuid.uuid4().hex, "request_id": body["request_id"],
                          "state": "running"})

    def do_GET(self) -> None:
        self._reply(200, {"request_id": "", "state": "running"})


@contextmanager
def webhook_receiver(handler: type[BaseHTTPRequestHandler] = _Handler) -> Iterator[str]:
    """The base URL of a receiver answering with ``handler``; by default it keeps every
    delivered request running."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def webhook_target(gate: Quotagate, name: str, base_url: str, **options: Any) -> None:
    TargetStore(gate.engine, clock=gate.clock).set(
        name, "webhook", {"url": f"{base_url}/{name}"}, **options
    )


def deliver(gate: Quotagate, request_id: str, tenant: str, target: str,
            cost: dict[str, int] | None = None) -> int:
    """Submit, admit and deliver one request to ``target``; return its fencing token."""
    gate.submit(request_id, tenant, cost or {"gpu": 1}, target=target)
    assert gate.admit(1), f"{request_id} was not admitted"
    dispatcher = Dispatcher(gate, worker_name=f"test-{uuid.uuid4().hex[:8]}")
    try:
        def delivered() -> bool:
            dispatcher.run_once()
            return gate.show(request_id).state == RequestState.DELIVERED

        wait_for(delivered, f"{request_id} delivered")
    finally:
        dispatcher.release()
    binding = gate.binding(request_id)
    assert binding is not None and binding["target"] == target
    return int(binding["fencing_token"])
