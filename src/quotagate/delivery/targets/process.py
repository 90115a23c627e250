"""The ``process`` target: one local command per request, run exactly once.

The external object is a run directory (mode 0700) named deterministically
after the ledger and request. It is created exclusively and atomically with its
identity file (a prepared directory renamed into place), so a restarted worker
finds it, reads back whose it is (ledger id and request id), and never runs the
same request twice.

The command sees only an allow-listed environment (docs/decisions/215); a stop
signals its process group, SIGTERM and after ``stop_grace`` seconds SIGKILL,
and is confirmed once its exit status is written (docs/decisions/211).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotagate.delivery.targets import job_failure, process_runner
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    Outcome,
    StopResult,
    TargetKind,
    check_identity,
)
from quotagate.errors import InvalidInput

_RUNNER = Path(process_runner.__file__)
# What a command inherits from the worker's environment, besides the variables
# its target names; never the worker's database or rate-store URLs.
ALLOWED_ENVIRONMENT = ("PATH", "HOME", "LANG")
DEFAULT_STOP_GRACE = 10.0
# In a run directory: when the stop's SIGTERM was sent (its mtime).
TERMINATED = "terminated"
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    command = config.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(
        isinstance(part, str) for part in command
    ):
        raise InvalidInput(
            "a process target needs --command, the command line to run per request",
            code="invalid_target_config",
        )
    run_dir = config.get("run_dir") or "quotagate-runs"
    if not isinstance(run_dir, str):
        raise InvalidInput("run_dir must be a path", code="invalid_target_config")
    environment = config.get("environment") or []
    if isinstance(environment, str):
        environment = [name for name in environment.replace(",", " ").split() if name]
    if not isinstance(environment, list) or not all(
        isinstance(name, str) and _VARIABLE_NAME.fullmatch(name) for name in environment
    ):
        raise InvalidInput("environment must be a list of variable names the command may "
                           "inherit from the worker", code="invalid_target_config")
    stop_grace = config.get("stop_grace", DEFAULT_STOP_GRACE)
    if isinstance(stop_grace, bool) or not isinstance(stop_grace, int | float) or stop_grace < 0:
        raise InvalidInput("stop_grace must be a number of seconds, 0 or more",
                           code="invalid_target_config")
    # Absolute, so workers started from other directories share the same runs.
    checked: dict[str, Any] = {
        "command": _absolute_program(command),
        "run_dir": str(Path(run_dir).expanduser().resolve()),
    }
    if environment:
        checked["environment"] = sorted(set(environment))
    if stop_grace != DEFAULT_STOP_GRACE:
        checked["stop_grace"] = float(stop_grace)
    return checked


def _absolute_program(command: list[str]) -> list[str]:
    """A program named by a relative path (``./serve-model.sh``) made absolute.

    The command runs in its request's run directory, where ``./serve-model.sh``
    is not: it would exit 127. Read against the directory the target is set
    from, as the run directory is; a bare name (``sh``) is still found on PATH.
    """
    program = command[0]
    if os.sep not in program or Path(program).is_absolute():
        return command
    return [str(Path(program).expanduser().resolve()), *command[1:]]


class ProcessTarget:
    kind = "process"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str,
                 explain_failures: bool = True) -> None:
        checked = validate_config(config)
        # A failed command's reason ends with the last line of its output (docs/decisions/825);
        # the spark target takes the Python exception's line itself, never a JVM's last line.
        self.explain_failures = explain_failures
        self.command: list[str] = checked["command"]
        self.run_dir = Path(checked["run_dir"])
        self.environment_names: list[str] = checked.get("environment", [])
        self.stop_grace: float = checked.get("stop_grace", DEFAULT_STOP_GRACE)
        self.ledger_id = ledger_id

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        final = self.run_dir / spec.external_name
        if not final.exists():
            created = self._create(final, spec)
            if created is not None:
                self._launch(final)
                return created
        found = self.read(spec.external_name)
        if found is None:
            raise DeliveryFailed(f"run directory {final} vanished while being read back",
                                 public="the run vanished")
        check_identity(found, spec)
        # The lost attempt may have died between creating the directory and
        # launching; launching again is harmless (the runner's marker is exclusive).
        if not (final / process_runner.STARTED).exists():
            self._launch(final)
        return found

    def read(self, name: str) -> ExternalObject | None:
        try:
            spec = json.loads((self.run_dir / name / process_runner.REQUEST).read_text())
        except FileNotFoundError:
            return None
        return ExternalObject(name=name, uid=spec["uid"], request_id=spec["request_id"],
                              ledger_id=spec.get("ledger_id"))

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        """Ended runs among ``objects``, found through the ``.exited`` index (one listing)."""
        try:
            exited = set(os.listdir(self.run_dir / process_runner.EXITED_INDEX))
        except FileNotFoundError:
            return {}
        ended: dict[str, Outcome] = {}
        for obtained in objects:
            if obtained.name in exited:
                outcome = self._outcome(obtained.name)
                if outcome is not None:
                    ended[obtained.request_id] = outcome
        return ended

    def forget_ended(self, objects: Sequence[ExternalObject]) -> None:
        """Prune ``objects`` from the ``.exited`` index once their ends are in the ledger.

        The index then holds only runs whose end is not recorded yet, so the
        listing ``outcomes`` makes stays as small as the work in flight. The
        run directory (with its ``exit_status``) stays: a stop or a read-back
        still finds it.
        """
        index = self.run_dir / process_runner.EXITED_INDEX
        for obtained in objects:
            with contextlib.suppress(FileNotFoundError):
                (index / obtained.name).unlink()

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        """Stop the run: SIGTERM its process group, SIGKILL after the grace period.

        Confirmed once the runner wrote the exit status, or when the run never
        started (the ``stop`` marker keeps it from ever starting), or when
        neither the command's group nor the runner exist any more.
        """
        directory = self.run_dir / obtained.name
        if not directory.is_dir():
            return StopResult(stopped=True, reason="the run directory is gone")
        ended = self._outcome(obtained.name)
        if ended is not None:
            return StopResult(stopped=True, reason=ended.reason or "command had completed")
        marker = directory / process_runner.STOP
        try:
            descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            pass
        else:
            os.write(descriptor, f"{time.time()} token={fencing_token}".encode())
            os.close(descriptor)
        if not (directory / process_runner.STARTED).exists():
            return StopResult(stopped=True, reason="stopped before the command started")
        try:
            group = int((directory / process_runner.PROCESS_GROUP).read_text())
        except (FileNotFoundError, ValueError):
            return self._starting_or_gone(directory)
        # The stop is asked again every second until confirmed. SIGTERM goes once:
        # sent again it would interrupt the command's own shutdown (many programs
        # take a second one for "quit now"). Later asks only look, and SIGKILL
        # follows ``stop_grace`` seconds after the SIGTERM (docs/decisions/817).
        terminated = directory / TERMINATED
        sent: signal.Signals | None
        try:
            late = time.time() - terminated.stat().st_mtime >= self.stop_grace
        except FileNotFoundError:
            sent = signal.SIGTERM
        else:
            sent = signal.SIGKILL if late else None
        try:
            os.killpg(group, 0 if sent is None else sent)
        except ProcessLookupError:
            return self._starting_or_gone(directory)
        except PermissionError:
            return StopResult(stopped=False, failed=True,
                              reason="not allowed to signal the command")
        if sent == signal.SIGTERM:
            # Marked after the signal: a worker killed in between sends it once more,
            # which is better than never.
            process_runner.write_private(terminated, f"{time.time()}")
        return StopResult(stopped=False,
                          reason="SIGKILL sent, waiting for the exit" if sent == signal.SIGKILL
                          else "SIGTERM sent, waiting for the exit")

    def close(self) -> None:
        pass

    def _starting_or_gone(self, directory: Path) -> StopResult:
        """No command group to signal: the runner is starting it, or it all died."""
        ended = self._outcome(directory.name)
        if ended is not None:
            return StopResult(stopped=True, reason=ended.reason or "command had completed")
        try:
            runner = int((directory / process_runner.STARTED).read_text())
            os.kill(runner, 0)
        except (ValueError, FileNotFoundError, ProcessLookupError):
            return StopResult(stopped=True, reason="the command and its runner are gone")
        except PermissionError:
            pass
        return StopResult(stopped=False, reason="the command is starting")

    def _outcome(self, name: str) -> Outcome | None:
        try:
            text = (self.run_dir / name / process_runner.EXIT_STATUS).read_text()
        except FileNotFoundError:
            return None
        status = int(text.strip())
        if status == 0:
            return Outcome(completed=True)
        how = f"signal {-status}" if status < 0 else f"status {status}"
        reason = f"command exited with {how}"
        if status > 0 and self.explain_failures:
            # Not after a signal: a stopped command's last words are not why it ended.
            cause = job_failure.failure_cause(self.run_dir / name / process_runner.OUTPUT,
                                              self.environment_names, last_line=True)
            if cause is not None:
                reason = f"{reason}: {cause}"
        return Outcome(completed=False, reason=reason)

    def _create(self, final: Path, spec: DeliverySpec) -> ExternalObject | None:
        """Create the run directory with its identity in one rename; None if it exists."""
        try:
            self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            preparing = self.run_dir / f".preparing-{spec.external_name}-{uuid.uuid4().hex}"
            preparing.mkdir(mode=0o700)
            preparing.chmod(0o700)  # whatever the umask
        except OSError as error:
            raise DeliveryFailed(f"cannot prepare a run directory: {error}",
                                 public="cannot prepare the run") from error
        uid = uuid.uuid4().hex
        process_runner.write_private(preparing / process_runner.REQUEST, json.dumps({
            "ledger_id": spec.ledger_id,
            "request_id": spec.request_id,
            "tenant": spec.tenant,
            "uid": uid,
            "fencing_token": spec.fencing_token,
            "attempt": spec.attempt,
            "command": self.command,
            "payload": spec.payload,
            "cost": dict(spec.cost),
        }))
        try:
            # A non-empty directory at ``final`` makes this fail: creation is exclusive.
            os.rename(preparing, final)
        except OSError:
            shutil.rmtree(preparing, ignore_errors=True)
            return None
        return ExternalObject(spec.external_name, uid, spec.request_id, created_now=True,
                              ledger_id=spec.ledger_id)

    def _environment(self) -> dict[str, str]:
        names = (*ALLOWED_ENVIRONMENT, *self.environment_names)
        return {name: os.environ[name] for name in names if name in os.environ}

    def _launch(self, run_directory: Path) -> None:
        try:
            subprocess.run(
                [sys.executable, str(_RUNNER), str(run_directory)],
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, check=True, timeout=60, env=self._environment(),
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise DeliveryFailed(f"cannot launch the command runner: {error}",
                                 public="cannot start the command") from error


# This module's entry in delivery.targets.TARGET_KINDS.
KIND = TargetKind(validate_config, ProcessTarget,
                  frozenset({"command", "run_dir", "environment", "stop_grace"}))
