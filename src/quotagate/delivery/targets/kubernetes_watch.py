"""One ledger's objects in one namespace, kept current by a list and a watch.

What client-go's informers do, reduced to what the target needs: LIST by label
selector (``quotagate.io/ledger=<id>``) once (in pages), then WATCH from the
``resourceVersion`` that list returned, applying ADDED/MODIFIED/DELETED events
and moving the version on with every event (and BOOKMARK). A watch the server
ends is resumed from the last version; 410 Expired (the version was
compacted away) or any failure means the cache may have missed something, so
it lists again. Reading outcomes is then a dictionary lookup, not one GET
per running object per pass.

The follower runs in one daemon thread per target, started on first use and
stopped by ``close`` (``Watch.stop`` shuts the socket the stream blocks on).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("quotagate.delivery.kubernetes")

WATCH_SECONDS = 240  # server-side length of one watch request; it is resumed after
LIST_PAGE = 500  # objects per LIST page, as client-go's reflector pages its lists
_BACKOFF_FIRST, _BACKOFF_MAX = 0.2, 10.0


class ObjectFollower:
    def __init__(self, list_objects: Callable[..., Any], *, label_selector: str,
                 api_exception: type[Exception], watch_module: Any, timeout: float,
                 describe: Callable[[Exception], str]) -> None:
        self._list_objects = list_objects  # list_namespaced_custom_object, bound to the resource
        self.label_selector = label_selector
        self._api_exception = api_exception
        self._timeout = timeout
        self._describe = describe
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._synced = threading.Event()
        self._tried = threading.Event()  # set after the first list attempt, however it went
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = watch_module.Watch()  # one, reused by every watch request
        self.resource_version: str | None = None
        self.last_error: str | None = None
        self.lists = 0  # how often it had to list (once, unless watches broke)
        self.watches = 0

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"quotagate-kubernetes-watch {self.label_selector}")
                self._thread.start()

    def wait_synced(self, timeout: float) -> bool:
        """Synced? Waits (up to ``timeout``) only for the first list, not for a broken API:
        a worker's pass must not stall on every call while the API server is down."""
        self._tried.wait(timeout)
        return self._synced.is_set()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Objects by name as last seen (each replaced on change, never mutated)."""
        with self._lock:
            return dict(self._objects)

    def close(self) -> None:
        self._stopping.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        # Stop until it is stopped: a stream that was just starting resets its
        # stop flag, and its socket exists only once its request went out.
        for _attempt in range(int((self._timeout + 1) / 0.05)):
            self._watch.stop()
            thread.join(0.05)
            if not thread.is_alive():
                return

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        backoff = _BACKOFF_FIRST
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._follow()
                backoff = _BACKOFF_FIRST
            except self._api_exception as error:
                if self._stopping.is_set():
                    break
                if getattr(error, "status", None) == 410:
                    # Our version was compacted away: we may have missed events; list again.
                    logger.info("kubernetes watch %s: %s; listing again", self.label_selector,
                                getattr(error, "reason", error))
                    self.resource_version = None
                    continue
                backoff = self._failed(self._describe(error), backoff)
            except Exception as error:  # unreachable, timed out, reset: list again later
                if self._stopping.is_set():
                    break
                backoff = self._failed(f"{type(error).__name__}: {error}", backoff)

    def _failed(self, text: str, backoff: float) -> float:
        logger.warning("kubernetes watch %s failed: %s (listing again in %.1fs)",
                       self.label_selector, text, backoff)
        self.last_error = text
        self._synced.clear()
        self._tried.set()
        self.resource_version = None
        self._stopping.wait(backoff)
        return min(backoff * 2, _BACKOFF_MAX)

    def _list(self) -> None:
        """All of the ledger's objects, in pages of LIST_PAGE from one consistent snapshot."""
        objects: dict[str, dict[str, Any]] = {}
        following: str | None = None
        version: str | None = None
        while True:
            page = self._list_objects(label_selector=self.label_selector, limit=LIST_PAGE,
                                      _continue=following, _request_timeout=self._timeout)
            for item in page.get("items") or []:
                objects[item["metadata"]["name"]] = item
            metadata = page.get("metadata") or {}
            # The snapshot's version is the first page's; watching from it misses nothing.
            version = version or str(metadata["resourceVersion"])
            following = metadata.get("continue") or None
            if following is None or self._stopping.is_set():
                break
        with self._lock:
            self._objects = objects
            self.resource_version = version
            self.lists += 1
        self.last_error = None
        self._synced.set()
        self._tried.set()

    def _follow(self) -> None:
        """One watch request from our version, until the server ends it."""
        if self._stopping.is_set():
            return
        self.watches += 1
        stream = self._watch.stream(
            self._list_objects, label_selector=self.label_selector,
            resource_version=self.resource_version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(self._timeout, WATCH_SECONDS + self._timeout),
        )
        for event in stream:
            item = event.get("raw_object") or {}
            metadata = item.get("metadata") or {}
            version = metadata.get("resourceVersion")
            if self._stopping.is_set():
                break
            with self._lock:
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._objects[metadata["name"]] = item
                elif event["type"] == "DELETED":
                    self._objects.pop(str(metadata.get("name")), None)
                if version:
                    self.resource_version = str(version)
