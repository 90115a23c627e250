"""Why a job failed, from the end of its run's ``output.log``: the exception's last line.

A spark job whose ``--module`` fails to import exits 1, and the request's reason said only
``command exited with status 1``: the cause (``ModuleNotFoundError: No module named
'pyspark'``) was in the run directory's log, which only the worker's user can read. The
reason is what the tenant sees (``show``, ``diagnose``, the HTTP API), so the line is
cleaned first: credentials in URLs and query values go (``delivery.reasons.redact_text``),
and so does the value of every variable the job was handed from the worker's environment
(the target's ``environment``, an operator's choice that may hold secrets), shown as
``$NAME``, and the ledger's own URLs (``QUOTAGATE_DB``, ``QUOTAGATE_RATE_STORE``) if a line
quotes them. Frames (paths of the worker's machine) are never taken, only the exception's line.

The plain process target's command need not be Python: with ``last_line``, a log that shows
no exception gives its last line that has a letter or digit in it (``Error: disk full``),
cleaned the same way (docs/decisions/825).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from quotagate.delivery.reasons import redact_text

__all__ = ["LEDGER_ENVIRONMENT", "failure_cause"]

# The worker's own addresses: never handed to a job, masked if a line quotes them anyway.
LEDGER_ENVIRONMENT = ("QUOTAGATE_DB", "QUOTAGATE_RATE_STORE")

# Enough for the traceback at the end of a chatty job's log; a log is never read whole.
_TAIL_BYTES = 64 * 1024
_TRACEBACK = "Traceback (most recent call last):"
# What ``python -m MODULE`` prints, after its own path, when it cannot find the module.
_MODULE_NOT_FOUND = re.compile(r"(No module named .+|Error while finding module specification for .+)$")
# A value this short is too likely to occur by chance in a sentence to be worth masking.
_SHORTEST_MASKED = 4
MAX_CAUSE_LENGTH = 300


def failure_cause(log: Path, variables: Iterable[str], *, last_line: bool = False) -> str | None:
    """The last line of the exception that ended the job, cleaned; None if the log shows none.

    With ``last_line``, a log without an exception gives its last meaningful line instead.
    """
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - _TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = text.splitlines()
    cause = _exception_line(lines)
    if cause is None and last_line:
        cause = next((line.strip() for line in reversed(lines)
                      if any(character.isalnum() for character in line)), None)
    if cause is None:
        return None
    values = {name: os.environ[name] for name in (*variables, *LEDGER_ENVIRONMENT)
              if name in os.environ}
    # Longest first: a value that contains another is masked whole. Before the URL
    # redaction, which would change a URL-valued variable so that it no longer matches.
    for name, value in sorted(values.items(), key=lambda item: -len(item[1])):
        if len(value) >= _SHORTEST_MASKED:
            cause = cause.replace(value, f"${name}")
    cause = redact_text(cause)
    return cause if len(cause) <= MAX_CAUSE_LENGTH else cause[:MAX_CAUSE_LENGTH - 1] + "…"


def _exception_line(lines: list[str]) -> str | None:
    """After the last traceback header, the first line that is not indented (the frames are):
    ``KeyError: 'x'``. A JVM's shutdown lines that follow it are not taken."""
    headers = [number for number, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if headers:
        for line in lines[headers[-1] + 1:]:
            if line.strip() and not line[0].isspace():
                return line.strip()
        return None
    for line in reversed(lines):
        found = _MODULE_NOT_FOUND.search(line.strip())
        if found:
            return found.group(1)
    return None
