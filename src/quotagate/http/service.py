"""One ``serve`` process: the API, an admission loop and (when installed) the dispatcher.

Shutdown order on SIGTERM/SIGINT: uvicorn stops accepting connections and
lets in-flight requests (each one transaction) finish; then the worker threads
are told to stop and joined, so an admission pass in progress commits or rolls
back whole and a dispatcher can give up its lease before the process exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import sqlalchemy as sa

from quotagate.app import Quotagate
from quotagate.errors import StoreUnavailable
from quotagate.observability.metrics import Metrics

log = logging.getLogger("quotagate.serve")

_MAX_BACKOFF = 5.0


class Worker(Protocol):
    def run(self, stop: threading.Event) -> None: ...


class AdmissionLoop:
    """Admit in batches while work fits; poll every ``interval`` seconds when idle."""

    def __init__(
        self, gate: Quotagate, metrics: Metrics, *, batch: int = 16, interval: float = 0.2
    ) -> None:
        self.gate = gate
        self.metrics = metrics
        self.batch = batch
        self.interval = interval

    def run(self, stop: threading.Event) -> None:
        backoff = self.interval
        while not stop.is_set():
            try:
                started = time.perf_counter()
                admitted = self.gate.admit(self.batch)
                self.metrics.admission_pass.observe(time.perf_counter() - started)
                if admitted:
                    self._observe(admitted)
                backoff = self.interval
            except StoreUnavailable:
                log.warning("admission: the ledger database cannot be reached; retrying")
                stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            except Exception:
                # Keep the loop alive: one bad pass must not stop admissions for good.
                log.exception("admission pass failed")
                stop.wait(self.interval)
                continue
            if not admitted:
                stop.wait(self.interval)

    def _observe(self, admitted: list[Any]) -> None:
        try:
            created = self.gate.submitted_at([placement.id for placement in admitted])
        except (sa.exc.SQLAlchemyError, StoreUnavailable):
            created = {}
        self.metrics.record_admissions(admitted, created, self.gate.now())


def load_dispatcher(
    gate: Quotagate, worker_name: str | None = None, concurrency: int = 32
) -> Worker:
    """The delivery dispatcher ``serve`` runs beside the API.

    The default name is unique per process; a stable name (one per host, say)
    makes a restarted ``serve`` the same worker, with its lease's history.
    """
    from quotagate.delivery.dispatcher import Dispatcher

    worker_name = worker_name or f"{socket.gethostname()}-{os.getpid()}"
    dispatcher: Worker = Dispatcher(gate, worker_name=worker_name, concurrency=concurrency)
    return dispatcher


def run(
    gate: Quotagate,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    admit_interval: float = 0.2,
    admit_batch: int = 16,
    workers: bool = True,
    log_level: str = "info",
    access_log: bool = False,
    on_started: Callable[[], None] | None = None,
    worker_name: str | None = None,
    concurrency: int = 32,
    prune_older_than: float | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; return the exit status.

    ``on_started`` runs in a daemon thread next to the server (``serve --tour``).
    """
    try:
        import uvicorn
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on extras installed
        raise ModuleNotFoundError("serve needs uvicorn: pip install 'quotagate[server]'") from exc
    from quotagate.http.app import create_app

    metrics = gate.metrics
    app = create_app(gate, metrics=metrics)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    if workers:
        loops: list[tuple[str, Worker]] = [
            ("admission", AdmissionLoop(gate, metrics, batch=admit_batch, interval=admit_interval)),
            ("dispatcher", load_dispatcher(gate, worker_name, concurrency)),
        ]
        if prune_older_than is not None:
            from quotagate.http.pruning import PruneLoop

            loops.append(("retention", PruneLoop(gate, prune_older_than)))
        threads = [threading.Thread(target=worker.run, args=(stop,), name=name)
                   for name, worker in loops]
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="off",
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)
    # uvicorn handles SIGTERM/SIGINT itself and raises the signal again once it
    # has shut down; these handlers make that second delivery a no-op so we
    # get to stop the threads and exit 0 instead of dying mid-join.
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, lambda *_: None)
    for thread in threads:
        thread.start()
    if on_started is not None:
        threading.Thread(target=on_started, name="tour", daemon=True).start()
    try:
        server.run()
    finally:
        log.info("stopping workers")
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        gate.close()
    return 0 if server.started else 1
