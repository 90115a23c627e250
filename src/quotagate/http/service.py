"""One ``serve`` process: the API, an admission loop and (when installed) the dispatcher.

Shutdown order on SIGTERM/SIGINT: uvicorn stops accepting connections and
lets in-flight requests (each one transaction) finish; then the worker threads
are told to stop and joined, so an admission pass in progress commits or rolls
back whole and a dispatcher can give up its lease before the process exits 0.
The signals are the caller's (``quotagate.cli.stop_signals``, which bounds the
whole stop by ``serve --exit-grace``), not uvicorn's: a thread blocked in a
database call would otherwise keep the process alive for ever after the joins.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import sqlalchemy as sa

from quotagate.app import Quotagate
from quotagate.delivery.wakeup import Wakeup
from quotagate.errors import StoreUnavailable
from quotagate.observability.metrics import Metrics

log = logging.getLogger("quotagate.serve")

_MAX_BACKOFF = 5.0
# The largest admission pass a backlog grows to (AdmissionLoop).
MAX_ADMIT_BATCH = 256


# serve's first generation collects after this many new container objects, not
# CPython's 700 (docs/decisions/318-serve-settles-its-heap.md).
SERVE_GC_THRESHOLD = 7000


class Worker(Protocol):
    def run(self, stop: threading.Event) -> None: ...


class AdmissionLoop:
    """Admit in batches while work fits; poll every ``interval`` seconds when idle.

    Passes that come back full double the next one's size, up to
    ``MAX_ADMIT_BATCH``; a short pass goes back to ``batch``.

    The admission-wait metric needs each placement's submission time, one more
    read. It runs on a thread of its own (``_WaitObserver``), so the admission
    thread — the one that sets the pace when work pours in — goes straight on to
    its next batch; the count of admissions is recorded at once.
    """

    def __init__(
        self, gate: Quotagate, metrics: Metrics, *, batch: int = 16, interval: float = 0.2,
        on_admitted: Callable[[], None] | None = None,
    ) -> None:
        self.gate = gate
        self.metrics = metrics
        self.batch = batch
        self.interval = interval
        # Called after each pass that reserved something (committed by then): serve rings
        # the dispatcher's bell with it (docs/decisions/258).
        self.on_admitted = on_admitted
        self.waits = _WaitObserver(gate, metrics)

    def run(self, stop: threading.Event) -> None:
        try:
            self._run(stop)
        finally:
            self.waits.close()

    def _run(self, stop: threading.Event) -> None:
        backoff = self.interval
        size = self.batch
        while not stop.is_set():
            try:
                started = time.perf_counter()
                admitted = self.gate.admit(size)
                self.metrics.admission_pass.observe(time.perf_counter() - started)
                if admitted:
                    if self.on_admitted is not None:
                        self.on_admitted()
                    self.metrics.count_admissions(admitted)
                    self.waits.observe(admitted, self.gate.now())
                # A backlog: each full pass asks for twice as many, up to MAX_ADMIT_BATCH
                # (a pass costs about the same round trips at any size); the first
                # short pass goes back to ``batch`` (docs/decisions/252).
                size = min(2 * size, max(self.batch, MAX_ADMIT_BATCH)) \
                    if len(admitted) == size else self.batch
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


class _WaitObserver:
    """Observes admission waits off the admission thread, many passes per read.

    Passes admitted while a read runs are gathered and looked up together in
    the next one, so under load there are fewer reads than passes.
    """

    def __init__(self, gate: Quotagate, metrics: Metrics) -> None:
        self.gate = gate
        self.metrics = metrics
        self._lock = threading.Lock()
        self._pending: list[tuple[list[Any], float]] = []
        self._scheduled = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def observe(self, admitted: list[Any], now: float) -> None:
        with self._lock:
            self._pending.append((admitted, now))
            if self._scheduled:
                return
            self._scheduled = True
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="admission-waits")
            executor = self._executor
        executor.submit(self._drain)

    def _drain(self) -> None:
        with self._lock:
            passes, self._pending, self._scheduled = self._pending, [], False
        try:
            created = self.gate.submitted_at(
                [placement.id for admitted, _now in passes for placement in admitted])
        except (sa.exc.SQLAlchemyError, StoreUnavailable):
            created = {}
        for admitted, now in passes:
            self.metrics.observe_admission_waits(admitted, created, now)

    def close(self) -> None:
        """Observe what is still pending, then stop the thread."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


def load_dispatcher(
    gate: Quotagate, worker_name: str | None = None, concurrency: int = 32,
    wakeup: Wakeup | None = None,
) -> Worker:
    """The delivery dispatcher ``serve`` runs beside the API.

    The default name is unique per process; a stable name (one per host, say)
    makes a restarted ``serve`` the same worker, with its lease's history.
    ``wakeup``: the bell the admission loop rings (docs/decisions/258).
    """
    from quotagate.delivery.dispatcher import Dispatcher

    worker_name = worker_name or f"{socket.gethostname()}-{os.getpid()}"
    dispatcher: Worker = Dispatcher(gate, worker_name=worker_name, concurrency=concurrency,
                                    wakeup=wakeup)
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
    connections: int | None = None,
    stop: threading.Event,
    graceful_seconds: float = 20.0,
) -> int:
    """Serve until ``stop`` is set (the caller's SIGTERM/SIGINT relay); the exit status.

    In-flight HTTP calls get up to ``graceful_seconds`` to finish once it is set.
    ``on_started`` runs in a daemon thread next to the server (``serve --tour``).
    ``connections``: the size of the gate's fixed pool (``--db-connections``); HTTP
    calls run at once only as many as it leaves free (quotagate.http.connections).
    """
    try:
        import uvicorn
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on extras installed
        raise ModuleNotFoundError("serve needs uvicorn: pip install 'quotagate[server]'") from exc
    from quotagate.http.app import create_app
    from quotagate.http.connections import http_threads, run_server

    call_threads = None if connections is None else http_threads(
        connections, workers=workers, retention=prune_older_than is not None)
    metrics = gate.metrics
    app = create_app(gate, metrics=metrics)
    workers_stop = threading.Event()  # set once the HTTP side has drained
    threads: list[threading.Thread] = []
    # The admission loop rings it after each pass that reserved something; the stop
    # below too, so an idle dispatcher does not sit out its poll interval.
    wakeup = Wakeup()
    if workers:
        loops: list[tuple[str, Worker]] = [
            ("admission", AdmissionLoop(gate, metrics, batch=admit_batch, interval=admit_interval,
                                        on_admitted=wakeup.ring)),
            ("dispatcher", load_dispatcher(gate, worker_name, concurrency, wakeup)),
        ]
        if prune_older_than is not None:
            from quotagate.http.pruning import PruneLoop

            loops.append(("retention", PruneLoop(gate, prune_older_than)))
        threads = [threading.Thread(target=worker.run, args=(workers_stop,), name=name)
                   for name, worker in loops]
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="off",
        timeout_graceful_shutdown=max(1, round(graceful_seconds)),
    )
    server = _server_without_signals(uvicorn, config)

    def exit_on_stop() -> None:
        stop.wait()
        server.should_exit = True  # uvicorn's main loop looks every 0.1 s

    threading.Thread(target=exit_on_stop, name="serve-stop", daemon=True).start()
    for thread in threads:
        thread.start()
    if on_started is not None:
        threading.Thread(target=on_started, name="tour", daemon=True).start()
    try:
        with settled_heap():
            if call_threads is None:
                server.run()
            else:
                run_server(server, call_threads)
    finally:
        log.info("stopping workers")
        workers_stop.set()
        wakeup.ring()
        for thread in threads:
            thread.join()  # bounded by the caller's grace, which exits the process hard
        gate.close()
    return 0 if server.started else 1


@contextlib.contextmanager
def settled_heap(threshold: int = SERVE_GC_THRESHOLD) -> Iterator[None]:
    """Serve with start-up's objects out of the collector's sight and fewer young collections.

    Every call allocates hundreds of short-lived containers (h11 events, Starlette's
    scope and request, pydantic's models, the driver's rows), so with CPython's default
    first-generation threshold of 700 a collection ran about once per request, and now
    and then one of the whole heap: some 100,000 objects that start-up left (modules,
    the app and its routes, SQLAlchemy's and pydantic's caches), never garbage, walked
    for ~80 ms each time. ``gc.freeze()`` moves those to
    the permanent generation; the higher threshold lets most calls' objects die by
    reference count before a collection looks at them. The old settings come back on
    the way out, for an in-process caller.
    """
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(threshold, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()


def _server_without_signals(uvicorn: Any, config: Any) -> Any:
    """A ``uvicorn.Server`` that leaves SIGTERM/SIGINT to the caller's handlers.

    uvicorn would replace them while it serves, and raise the signal again once it
    has shut down; the caller's relay sets ``stop`` instead (:func:`run`).
    """

    class Server(uvicorn.Server):  # type: ignore[misc]
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)
