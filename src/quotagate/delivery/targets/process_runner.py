"""Runs one request's command, detached from the worker that launched it.

Started as ``python process_runner.py RUN_DIR`` in a new session. It forks and
the launcher exits at once, so the worker never waits for the command and a
worker killed mid-run neither kills the command nor loses its result: the exit
status is written into the run directory, where the next worker reads it.

Standard library only, so starting it costs a bare interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STARTED = "started"
EXIT_STATUS = "exit_status"
OUTPUT = "output.log"
REQUEST = "request.json"


def run(run_directory: Path) -> int:
    # Several launchers may be started for one run directory (a worker killed
    # between creating it and launching, then a retry); only the one that
    # creates the marker runs the command.
    try:
        descriptor = os.open(run_directory / STARTED, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return 0
    os.write(descriptor, str(os.getpid()).encode())
    os.close(descriptor)
    spec = json.loads((run_directory / REQUEST).read_text())
    # The worker's own test hook must not leak into the command's environment.
    environment = {key: value for key, value in os.environ.items()
                   if key != "QUOTAGATE_CRASH_AT"}
    environment.update(
        QUOTAGATE_REQUEST_ID=spec["request_id"],
        QUOTAGATE_TENANT=spec["tenant"],
        QUOTAGATE_FENCING_TOKEN=str(spec["fencing_token"]),
        QUOTAGATE_PAYLOAD=json.dumps(spec["payload"]),
        QUOTAGATE_RUN_DIR=str(run_directory),
    )
    with open(run_directory / OUTPUT, "ab") as output:
        try:
            status = subprocess.call(
                spec["command"], env=environment, cwd=run_directory,
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            )
        except OSError as error:
            output.write(f"cannot start command: {error}\n".encode())
            status = 127
    temporary = run_directory / f".{EXIT_STATUS}.tmp"
    temporary.write_text(str(status))
    os.replace(temporary, run_directory / EXIT_STATUS)
    return 0


def main() -> None:
    run_directory = Path(sys.argv[1])
    if os.fork() > 0:
        os._exit(0)  # the launcher returns at once; the child is reparented
    try:
        code = run(run_directory)
    finally:
        sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
