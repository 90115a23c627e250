"""Starts a spark target's streaming job with its checkpoint location and query name.

Run by the process runner as ``python spark_launcher.py CHECKPOINT_ROOT LEDGER_ID -- COMMAND…``
inside the run directory, whose name is the request's external name. It adds
``QUOTAGATE_CHECKPOINT_LOCATION`` (``ROOT/LEDGER_ID/TENANT/EXTERNAL_NAME``) and
``QUOTAGATE_QUERY_NAME`` (the external name) to the environment it was given and
*replaces itself* with the job (``exec``): same process, same process group, so a
stop signals the job itself, and its exit status is the run's.

Standard library only, like the runner.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECKPOINT_VARIABLE = "QUOTAGATE_CHECKPOINT_LOCATION"
QUERY_NAME_VARIABLE = "QUOTAGATE_QUERY_NAME"


def checkpoint_location(root: str | Path, ledger_id: str, tenant: str, external_name: str) -> Path:
    """The one checkpoint directory of a request: deterministic, so a re-delivery resumes it."""
    return Path(root) / ledger_id / tenant / external_name


def main() -> None:
    root, ledger_id, separator, *command = sys.argv[1:]
    if separator != "--" or not command:
        sys.stderr.write("usage: spark_launcher.py CHECKPOINT_ROOT LEDGER_ID -- COMMAND...\n")
        sys.exit(2)
    external_name = Path(os.environ["QUOTAGATE_RUN_DIR"]).name
    location = checkpoint_location(root, ledger_id, os.environ["QUOTAGATE_TENANT"], external_name)
    location.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    environment = {**os.environ, CHECKPOINT_VARIABLE: str(location), QUERY_NAME_VARIABLE: external_name}
    try:
        os.execvpe(command[0], command, environment)
    except OSError as error:
        sys.stderr.write(f"cannot start {command[0]!r}: {error}\n")
        sys.exit(127)


if __name__ == "__main__":
    main()
