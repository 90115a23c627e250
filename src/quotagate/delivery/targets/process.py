"""The ``process`` target: one local command per request, run exactly once.

The external object is a run directory named deterministically after the
request. It is created exclusively and atomically with its identity file (a
prepared directory renamed into place), so a restarted worker finds it, reads
back whose it is, and never runs the same request twice.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotagate.delivery.targets import process_runner
from quotagate.delivery.targets.base import (
    DeliveryFailed,
    DeliverySpec,
    ExternalObject,
    Outcome,
    StopResult,
    check_identity,
)
from quotagate.errors import InvalidInput

_RUNNER = Path(process_runner.__file__)


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
    # Absolute, so workers started from other directories share the same runs.
    return {"command": command, "run_dir": str(Path(run_dir).expanduser().resolve())}


class ProcessTarget:
    kind = "process"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str) -> None:
        checked = validate_config(config)
        self.command: list[str] = checked["command"]
        self.run_dir = Path(checked["run_dir"])
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
            raise DeliveryFailed(f"run directory {final} vanished while being read back")
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
        found = {obtained.request_id: self.outcome(obtained) for obtained in objects}
        return {request_id: outcome for request_id, outcome in found.items()
                if outcome is not None}

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        return StopResult(stopped=False, reason="the process target cannot stop runs yet")

    def close(self) -> None:
        pass

    def outcome(self, obtained: ExternalObject) -> Outcome | None:
        try:
            text = (self.run_dir / obtained.name / process_runner.EXIT_STATUS).read_text()
        except FileNotFoundError:
            return None
        status = int(text.strip())
        if status == 0:
            return Outcome(completed=True)
        how = f"signal {-status}" if status < 0 else f"status {status}"
        return Outcome(completed=False, reason=f"command exited with {how}")

    def _create(self, final: Path, spec: DeliverySpec) -> ExternalObject | None:
        """Create the run directory with its identity in one rename; None if it exists."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            preparing = self.run_dir / f".preparing-{spec.external_name}-{uuid.uuid4().hex}"
            preparing.mkdir()
        except OSError as error:
            raise DeliveryFailed(f"cannot prepare a run directory: {error}") from error
        uid = uuid.uuid4().hex
        (preparing / process_runner.REQUEST).write_text(json.dumps({
            "ledger_id": spec.ledger_id,
            "request_id": spec.request_id,
            "tenant": spec.tenant,
            "uid": uid,
            "fencing_token": spec.fencing_token,
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

    def _launch(self, run_directory: Path) -> None:
        try:
            subprocess.run(
                [sys.executable, str(_RUNNER), str(run_directory)],
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, check=True, timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise DeliveryFailed(f"cannot launch the command runner: {error}") from error
