"""Group commit for releases that arrive one by one (HTTP callbacks of executors).

Each caller hands its end over and waits; one thread writes whatever has
gathered in one transaction (``Ledger.release_many``) and hands every caller
its own answer. Nothing waits on a timer: while a batch commits, the next one
gathers, so a lone callback is written at once and a burst shares
transactions (docs/decisions/219). Fencing is what a single release does: each
end's guard runs inside the batch's transaction on its locked row.

The writer thread starts with the first end and stops after a second without
one, so an idle API (or a test's app) keeps no thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from quotagate.store.release import End, ReleaseResult

__all__ = ["DEFAULT_GROUP_SIZE", "GroupRelease"]

DEFAULT_GROUP_SIZE = 128
_IDLE_SECONDS = 1.0

ReleaseMany = Callable[[Sequence[End]], list[ReleaseResult | Exception]]


class GroupRelease:
    """Releases from many threads, written together. Thread-safe."""

    def __init__(self, release_many: ReleaseMany, *, group_size: int = DEFAULT_GROUP_SIZE
                 ) -> None:
        self._release_many = release_many
        self._group_size = group_size
        self._queue: queue.SimpleQueue[tuple[End, Future[ReleaseResult]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None

    def release(self, end: End) -> ReleaseResult:
        """End one request with the next group; its result, or its refusal raised."""
        answer: Future[ReleaseResult] = Future()
        with self._lock:
            self._queue.put((end, answer))
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="group-release",
                                                daemon=True)
                self._writer.start()
        return answer.result()

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

    def _commit(self, group: list[tuple[End, Future[ReleaseResult]]]) -> None:
        try:
            results = self._release_many([end for end, _answer in group])
        except BaseException as error:  # the whole transaction failed: every caller hears it
            for _end, answer in group:
                answer.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        for (_end, answer), result in zip(group, results, strict=True):
            if isinstance(result, Exception):
                answer.set_exception(result)
            else:
                answer.set_result(result)
