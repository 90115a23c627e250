"""SIGTERM sets a command's stop event even when it lands inside ``Event.wait`` (decisions/905).

Each case runs in a child process: a deadlocked signal handler would otherwise hang the suite.
"""

from __future__ import annotations

import subprocess
import sys

from quotagate.cli.stop_signals import GRACE_EXPIRED_EXIT

# The stop event's lock held, as ``Event.wait`` holds it on entry and exit; the handler runs
# at the next bytecode boundary, the call below, with the lock still held. A handler calling
# ``stop.set()`` waits there for the lock forever.
SIGNAL_INSIDE_WAIT = """
import os, signal, threading
from quotagate.cli.stop_signals import stop_on_signals

stop = threading.Event()
stop_on_signals(stop)

def boundary():
    pass

with stop._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    boundary()
assert stop.wait(60), "SIGTERM never set the stop event"
"""

# A command that never looks at its stop event again (a call blocked for good).
STUCK_AFTER_SIGNAL = """
import os, signal, threading
from quotagate.cli.stop_signals import stop_on_signals

stop = threading.Event()
stop_on_signals(stop, grace=0.2, what="stuck command")
os.kill(os.getpid(), signal.SIGTERM)
assert stop.wait(60)
threading.Event().wait()
"""


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    # 60 s: only a deadlock takes that long; TimeoutExpired fails the test.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_signal_inside_the_stop_events_wait_still_stops_the_command() -> None:
    child = run_child(SIGNAL_INSIDE_WAIT)
    assert child.returncode == 0, child.stderr


def test_a_command_still_running_a_grace_after_the_signal_exits_hard() -> None:
    child = run_child(STUCK_AFTER_SIGNAL)
    assert child.returncode == GRACE_EXPIRED_EXIT, child.stderr
    assert "stuck command did not stop within 0.2 s" in child.stderr
