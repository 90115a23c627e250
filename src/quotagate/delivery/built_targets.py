"""The targets one worker has built, kept across passes and rebuilt only when changed.

A webhook target holds an HTTP connection pool and a Kubernetes target an API
client: building them per delivery or per pass costs more than the delivery
itself. Each pass reads the target table once (``refresh``); a target whose
kind or configuration changed, or that was removed, is closed and built again
on next use, so ``quotagate target set`` reaches running workers without a
restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from quotagate.delivery.registry import TargetConfig, TargetStore
from quotagate.delivery.targets import Target, build_target
from quotagate.errors import NotFound, quoted

__all__ = ["BuiltTargets"]

logger = logging.getLogger("quotagate.delivery")

Builder = Callable[[str, Mapping[str, Any]], Target]


class BuiltTargets:
    def __init__(self, store: TargetStore, *, ledger_id: str,
                 build: Builder | None = None) -> None:
        self.store = store
        self._build: Builder = build or (
            lambda kind, config: build_target(kind, config, ledger_id=ledger_id)
        )
        self._configs: dict[str, TargetConfig] | None = None
        self._built: dict[str, tuple[TargetConfig, Target]] = {}
        # Pool threads resolve targets concurrently; building one twice would leak a client.
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the configurations again; close the targets whose configuration changed."""
        configs = {config.name: config for config in self.store.list()}
        with self._lock:
            self._configs = configs
            for name, (config, target) in list(self._built.items()):
                current = configs.get(name)
                if current is None or (current.kind, current.config) != (config.kind,
                                                                          config.config):
                    del self._built[name]
                    self._close(name, target)

    def get(self, name: str | None) -> tuple[TargetConfig, Target]:
        """The named target, or the default one, built on first use."""
        if self._configs is None:
            self.refresh()
        try:
            with self._lock:
                config = self._resolve(name)
        except NotFound:
            # The configurations read at the pass's start may predate a target set
            # since (the tour sets one and submits at once): read them again once
            # before failing a delivery on a stale view.
            self.refresh()
            with self._lock:
                config = self._resolve(name)
        with self._lock:
            built = self._built.get(config.name)
            if built is None:
                built = (config, self._build(config.kind, config.config))
                self._built[config.name] = built
            return built

    def close(self) -> None:
        with self._lock:
            for name, (_config, target) in self._built.items():
                self._close(name, target)
            self._built.clear()
            self._configs = None

    def _resolve(self, name: str | None) -> TargetConfig:
        configs = self._configs or {}
        if name is None:
            defaults = sorted(n for n, config in configs.items() if config.is_default)
            if not defaults:
                raise NotFound(
                    "the request names no target and no default target is configured; "
                    "set one with 'quotagate target set NAME --kind … --default'",
                    code="no_default_target",
                )
            return configs[defaults[0]]
        if name not in configs:
            raise NotFound(f"target {quoted(name)} does not exist", code="unknown_target")
        return configs[name]

    @staticmethod
    def _close(name: str, target: Target) -> None:
        try:
            target.close()
        except Exception:  # a close that fails must not stop the worker
            logger.exception("closing target %s", name)
