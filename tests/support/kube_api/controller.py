"""A controller for the in-suite API server: it "runs" each new object and reports its phase.

What an operator's controller would do on a real cluster: see a new object
(no status yet, not being deleted) and set ``status.phase`` through the status
subresource. It follows the store's change notifications, not a timer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from support.kube_api.server import KubeApiServer
from support.kube_api.status import ApiError


@contextmanager
def controller(server: KubeApiServer, phase: str = "Completed") -> Iterator[list[str]]:
    """Give every new object ``status.phase = phase``; yields the names it handled, in order."""
    handled: list[str] = []
    stopping = threading.Event()
    store = server.store

    def run() -> None:
        seen = 0
        while not stopping.is_set():
            for found in server.model_services():
                metadata = found["metadata"]
                if found.get("status") or metadata.get("deletionTimestamp"):
                    continue
                try:
                    server.set_status(metadata["name"], metadata["namespace"], phase=phase,
                                      observedGeneration=metadata["generation"])
                except ApiError:
                    continue  # deleted meanwhile
                handled.append(metadata["name"])
            with store.changed:
                store.changed.wait_for(
                    lambda up_to=seen: store.revision > up_to or stopping.is_set(), timeout=0.5)
                seen = store.revision

    thread = threading.Thread(target=run, daemon=True, name="in-suite controller")
    thread.start()
    try:
        yield handled
    finally:
        stopping.set()
        with store.changed:
            store.changed.notify_all()
        thread.join()
