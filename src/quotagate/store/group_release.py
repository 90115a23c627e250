"""Group commit for releases that arrive one by one (HTTP callbacks of executors).

Each caller hands its end over and waits; one thread writes whatever has
gathered in one transaction (``Ledger.release_many``) and hands every caller
its own answer. Nothing waits on a timer: while a batch commits, the next one
gathers, so a lone callback is written at once and a burst shares
transactions (docs/decisions/219). Fencing is what a single release does: each
end's guard runs inside the batch's transaction on its locked row.

An end may also be handed over unbuilt (:meth:`GroupRelease.release_later`):
the writer builds it first — for an HTTP callback that is authenticating its
token and asking the authorizer — and a build that raises is that caller's
answer alone. The caller gets a future and need not hold a thread while it
waits, so an ``async`` endpoint costs no thread-pool hand-off (docs/decisions/316).

The writer thread starts with the first end and stops after a second without
one, so an idle API (or a test's app) keeps no thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from quotagate.store.release import End, ReleaseResult

__all__ = ["DEFAULT_GROUP_SIZE", "GroupRelease", "PrepareEnd"]

DEFAULT_GROUP_SIZE = 128
_IDLE_SECONDS = 1.0

ReleaseMany = Callable[[Sequence[End]], list[ReleaseResult | Exception]]
# Builds one end on the writer thread; what it raises is its caller's answer.
PrepareEnd = Callable[[], End]


class GroupRelease:
    """Releases from many threads, written together. Thread-safe."""

    def __init__(self, release_many: ReleaseMany, *, group_size: int = DEFAULT_GROUP_SIZE
                 ) -> None:
        self._release_many = release_many
        self._group_size = group_size
        self._queue: queue.SimpleQueue[tuple[PrepareEnd, Future[ReleaseResult]]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None

    def release(self, end: End) -> ReleaseResult:
        """End one request with the next group; its result, or its refusal raised."""
        return self.release_later(lambda: end).result()

    def release_later(self, prepare: PrepareEnd) -> Future[ReleaseResult]:
        """The future answer of the end ``prepare`` builds on the writer thread.

        Cancelling the future before its group begins withdraws the end: it is
        neither built nor written.
        """
        answer: Future[ReleaseResult] = Future()
        with self._lock:
            self._queue.put((prepare, answer))
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="group-release",
                                                daemon=True)
                self._writer.start()
        return answer

    def _write(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    # Enqueueing happens under the lock: empty now means no caller is left.
                    if self._queue.empty():
                        self._writer = None
                        return
                continue
            group = [first]
            while len(group) < self._group_size:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._commit(group)

    def _commit(self, group: list[tuple[PrepareEnd, Future[ReleaseResult]]]) -> None:
        built: list[tuple[End, Future[ReleaseResult]]] = []
        for prepare, answer in group:
            # A running future can no longer be cancelled, so its answer can always be set.
            if not answer.set_running_or_notify_cancel():
                continue
            try:
                built.append((prepare(), answer))
            except Exception as error:
                answer.set_exception(error)
        if not built:
            return
        try:
            results = self._release_many([end for end, _answer in built])
        except BaseException as error:  # the whole transaction failed: every caller hears it
            for _end, answer in built:
                answer.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        for (_end, answer), result in zip(built, results, strict=True):
            if isinstance(result, Exception):
                answer.set_exception(result)
            else:
                answer.set_result(result)
