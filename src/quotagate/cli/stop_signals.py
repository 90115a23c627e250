"""SIGTERM/SIGINT for the long-running commands: set their stop event, safely and in bounded time.

A Python signal handler runs in the main thread between two bytecodes, whatever that thread
holds. ``threading.Event.set`` takes the event's lock, which ``Event.wait`` holds for a few
bytecodes on each entry and exit: a handler calling ``stop.set()`` that lands there waits for
itself forever, and the process ignores every later SIGTERM (docs/decisions/905). So the handler
only writes a byte to a pipe; a relay thread reads it and sets the event.

With a ``grace``, the relay also bounds the stop: a command still running ``grace`` seconds
after the signal (a database call in a lock wait, a pool thread in a slow target call) exits
with ``GRACE_EXPIRED_EXIT`` without its cleanup, the way a SIGKILL would; its work stays
claimed under its lease, and the lease's expiry hands it over (docs/decisions/906).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from types import FrameType

__all__ = ["GRACE_EXPIRED_EXIT", "stop_on_signals"]

logger = logging.getLogger("quotagate.cli")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# EX_SOFTWARE: not a clean stop, and not a crash of the command either.
GRACE_EXPIRED_EXIT = 70


def stop_on_signals(stop: threading.Event, *, grace: float | None = None,
                    what: str = "command") -> None:
    """Set ``stop`` on SIGTERM/SIGINT; with ``grace``, exit hard that long after the first one.

    Call from the main thread (``signal.signal`` requires it).
    """
    read_end, write_end = os.pipe()
    # A burst of signals must not block the handler on a full pipe: one byte is enough.
    os.set_blocking(write_end, False)

    def handler(_number: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(BlockingIOError):  # full: a stop is already on its way
            os.write(write_end, b"\0")

    threading.Thread(target=_relay, args=(read_end, stop, grace, what),
                     name="stop-signal", daemon=True).start()
    for number in STOP_SIGNALS:
        signal.signal(number, handler)


def _relay(read_end: int, stop: threading.Event, grace: float | None, what: str) -> None:
    os.read(read_end, 1)
    stop.set()
    if grace is None:
        return
    # Daemon thread: a command that stops in time exits before this wakes up.
    threading.Event().wait(grace)
    logger.warning("%s did not stop within %.1f s of the signal; exiting without cleanup "
                   "(its lease expires and hands its work over)", what, grace)
    sys.stderr.flush()
    os._exit(GRACE_EXPIRED_EXIT)
