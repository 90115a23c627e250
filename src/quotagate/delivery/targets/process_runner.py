"""Runs one request's command, detached from the worker that launched it.

Started as ``python process_runner.py RUN_DIR`` in a new session, with only the
allow-listed environment (docs/decisions/215). It forks and the launcher exits
at once, so the worker never waits for the command and a worker killed mid-run
neither kills the command nor loses its result: the exit status is written into
the run directory, where the next worker reads it, and a notice of it into the
run root's ``.exited`` index, so workers find ended runs without reading every
run directory.

The command runs in its own process group, whose id goes into ``pid``: a stop
signals that group (docs/decisions/211). A ``stop`` marker written before the
command started keeps it from starting at all.

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
PROCESS_GROUP = "pid"
STOP = "stop"
EXITED_INDEX = ".exited"
# Exit status recorded for a run stopped before its command started.
NOT_STARTED = "-15"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) atomically, through a rename."""
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def run(run_directory: Path) -> int:
    # Several launchers may be started for one run directory (a worker killed
    # between creating it and launching, then a retry); only the one that
    # creates the marker runs the command.
    try:
        descriptor = os.open(run_directory / STARTED, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return 0
    os.write(descriptor, str(os.getpid()).encode())
    os.close(descriptor)
    if (run_directory / STOP).exists():
        # Stopped before it ran: the stopper saw no ``started`` after writing
        # ``stop``, or sees this status; either way the command never runs.
        _finish(run_directory, NOT_STARTED)
        return 0
    spec = json.loads((run_directory / REQUEST).read_text())
    # The launcher passed only the allow-listed variables; add the request's own.
    environment = dict(os.environ)
    environment.update(
        QUOTAGATE_REQUEST_ID=spec["request_id"],
        QUOTAGATE_TENANT=spec["tenant"],
        QUOTAGATE_FENCING_TOKEN=str(spec["fencing_token"]),
        QUOTAGATE_ATTEMPT=str(spec.get("attempt", 1)),
        QUOTAGATE_PAYLOAD=json.dumps(spec["payload"]),
        QUOTAGATE_RUN_DIR=str(run_directory),
    )
    output_descriptor = os.open(run_directory / OUTPUT, os.O_CREAT | os.O_APPEND | os.O_WRONLY,
                                0o600)
    with os.fdopen(output_descriptor, "ab") as output:
        try:
            process = subprocess.Popen(
                spec["command"], env=environment, cwd=run_directory, process_group=0,
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            )
        except OSError as error:
            output.write(f"cannot start command: {error}\n".encode())
            status = 127
        else:
            write_private(run_directory / PROCESS_GROUP, str(process.pid))
            status = process.wait()
    _finish(run_directory, str(status))
    return 0


def _finish(run_directory: Path, status: str) -> None:
    write_private(run_directory / EXIT_STATUS, status)
    index = run_directory.parent / EXITED_INDEX
    index.mkdir(mode=0o700, exist_ok=True)
    os.close(os.open(index / run_directory.name, os.O_CREAT | os.O_WRONLY, 0o600))


def main() -> None:
    run_directory = Path(sys.argv[1])
    if os.fork() > 0:
        os._exit(0)  # the launcher returns at once; the child is reparented
    os.umask(0o077)  # what the runner and its command create is private to this user
    try:
        code = run(run_directory)
    finally:
        sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
