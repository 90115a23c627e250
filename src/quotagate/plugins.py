"""One plugin scheme for everything found by name: rate stores by URL scheme, targets by kind.

A :class:`Plugins` maps names to plugins. Built-in plugins are named by import
path (``"package.module:attribute"``) and imported only when first asked for,
so that an optional dependency (redis, kubernetes) is needed only by whoever
uses it; others are added with :meth:`Plugins.register`. The registry knows
nothing of what it holds: the protocol a plugin implements lives with the
layer that uses it (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Generic, TypeVar

__all__ = ["Plugins"]

Plugin = TypeVar("Plugin")


class Plugins(Generic[Plugin]):
    def __init__(self, builtins: Mapping[str, str]) -> None:
        self._paths = dict(builtins)
        self._loaded: dict[str, Plugin] = {}
        self._lock = threading.Lock()

    def register(self, name: str, plugin: Plugin) -> None:
        """Add ``plugin`` under ``name``, replacing a built-in of that name."""
        with self._lock:
            self._paths.pop(name, None)
            self._loaded[name] = plugin

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted({*self._paths, *self._loaded}))

    def get(self, name: str) -> Plugin | None:
        """The plugin named ``name``, importing a built-in on first use; None if unknown."""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            path = self._paths.get(name)
        if path is None:
            return None
        module_name, _, attribute = path.partition(":")
        plugin: Plugin = getattr(importlib.import_module(module_name), attribute)
        with self._lock:
            return self._loaded.setdefault(name, plugin)
