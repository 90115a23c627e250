"""Waiting on a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None], what: str, timeout: float = 30.0, interval: float = 0.05
) -> T:
    """Poll ``condition`` every ``interval`` seconds until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
