"""The ``spark`` target: a streaming job per admitted request, on the process target.

A thin layer over :class:`~quotagate.delivery.targets.process.ProcessTarget`
(run directory, exactly-once start, allow-listed environment, stop by process
group, exit status as the outcome). What it adds:

- the command: the user's entry point, ``module`` (``python -m MODULE``) or
  ``command`` (``spark-submit job.py …``), started through
  :mod:`~quotagate.delivery.targets.spark_launcher`;
- a deterministic checkpoint location, ``CHECKPOINT_ROOT/LEDGER_ID/TENANT/EXTERNAL_NAME``,
  in ``$QUOTAGATE_CHECKPOINT_LOCATION``, and the query name in ``$QUOTAGATE_QUERY_NAME``:
  a re-delivery of the same request resumes the same checkpoint;
- the request id and fencing token in the environment (``$QUOTAGATE_REQUEST_ID``,
  ``$QUOTAGATE_FENCING_TOKEN``), for the job's fenced sink; never the ledger's
  database or rate-store URL (refused in ``environment``).

The request completes when the query ends (the job exits 0), its cost stays
held while it runs, and a stop stops the job (docs/streaming.md). A job that fails
gives its request the exception that ended it as the reason's end
(:mod:`~quotagate.delivery.targets.job_failure`).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotagate.delivery.targets import job_failure, process, process_runner, spark_launcher
from quotagate.delivery.targets.base import DeliverySpec, ExternalObject, Outcome, StopResult, TargetKind
from quotagate.errors import InvalidInput, quoted

_LAUNCHER = Path(spark_launcher.__file__)
DEFAULT_CHECKPOINT_ROOT = "quotagate-checkpoints"
# A job must never learn where the ledger is: it could then write around the fence.
FORBIDDEN_ENVIRONMENT = job_failure.LEDGER_ENVIRONMENT


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    module, command = config.get("module"), config.get("command")
    if (module is None) == (command is None):
        raise InvalidInput(
            "a spark target needs exactly one of --module (a Python module run as the job) or "
            "--command (e.g. 'spark-submit job.py')",
            code="invalid_target_config",
        )
    if module is not None and (not isinstance(module, str) or not all(
            part.isidentifier() for part in module.split("."))):
        raise InvalidInput(f"module must be a dotted Python module name, got {quoted(module)}",
                           code="invalid_target_config")
    if isinstance(command, str):
        command = shlex.split(command)
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(part, str) for part in command)):
        raise InvalidInput("command must be a command line", code="invalid_target_config")
    python = config.get("python")
    if python is not None and not isinstance(python, str):
        raise InvalidInput("python must be the path of an interpreter", code="invalid_target_config")
    root = config.get("checkpoint_root") or DEFAULT_CHECKPOINT_ROOT
    if not isinstance(root, str):
        raise InvalidInput("checkpoint_root must be a path", code="invalid_target_config")
    passed = {key: config[key] for key in ("run_dir", "environment", "stop_grace") if key in config}
    # The process target checks those; only "command" is ours to give it.
    checked_process = process.validate_config({**passed, "command": ["job"]})
    leaked = sorted(set(checked_process.get("environment", [])) & set(FORBIDDEN_ENVIRONMENT))
    if leaked:
        raise InvalidInput(
            f"a spark job must not see {', '.join(leaked)}: the ledger's address is never handed to an "
            "executor (the job's sink is fenced by its token alone)",
            code="invalid_target_config",
        )
    checked: dict[str, Any] = {key: value for key, value in checked_process.items() if key != "command"}
    checked["checkpoint_root"] = str(Path(root).expanduser().resolve())
    if module is not None:
        checked["module"] = module
        if python is not None:
            checked["python"] = python
    else:
        checked["command"] = command
    return checked


def job_command(checked: Mapping[str, Any]) -> list[str]:
    if "module" in checked:
        # The worker's own interpreter unless the target names one: the job then sees
        # the same installed packages (quotagate[spark]) as the worker.
        return [checked.get("python") or sys.executable, "-m", checked["module"]]
    return list(checked["command"])


class SparkTarget:
    kind = "spark"

    def __init__(self, config: Mapping[str, Any], *, ledger_id: str) -> None:
        checked = validate_config(config)
        self.checkpoint_root = Path(checked["checkpoint_root"])
        self.ledger_id = ledger_id
        launcher = [sys.executable, str(_LAUNCHER), str(self.checkpoint_root), ledger_id, "--"]
        process_config: dict[str, Any] = {
            key: checked[key] for key in ("run_dir", "environment", "stop_grace") if key in checked
        }
        self.process = process.ProcessTarget({**process_config, "command": [*launcher, *job_command(checked)]},
                                             ledger_id=ledger_id, explain_failures=False)

    def checkpoint_location(self, tenant: str, external_name: str) -> Path:
        return spark_launcher.checkpoint_location(self.checkpoint_root, self.ledger_id, tenant, external_name)

    def create_if_absent(self, spec: DeliverySpec) -> ExternalObject:
        return self.process.create_if_absent(spec)

    def read(self, name: str) -> ExternalObject | None:
        return self.process.read(name)

    def outcomes(self, objects: Sequence[ExternalObject]) -> dict[str, Outcome]:
        ended = self.process.outcomes(objects)
        names = {obtained.request_id: obtained.name for obtained in objects}
        return {request_id: self._with_cause(outcome, names[request_id])
                for request_id, outcome in ended.items()}

    def _with_cause(self, outcome: Outcome, name: str) -> Outcome:
        """A failed job's reason with the exception that ended it (a --module that does not
        import, a query that raised), cleaned of the environment it was given."""
        if outcome.completed:
            return outcome
        cause = job_failure.failure_cause(
            self.process.run_dir / name / process_runner.OUTPUT, self.process.environment_names)
        if cause is None:
            return outcome
        return Outcome(completed=False, reason=f"{outcome.reason or 'the job failed'}: {cause}")

    def forget_ended(self, objects: Sequence[ExternalObject]) -> None:
        # The process target's .exited index is ours too: without this the dispatcher never
        # pruned it for spark runs, and every outcome pass listed every run that ever ended.
        self.process.forget_ended(objects)

    def stop(self, obtained: ExternalObject, fencing_token: int) -> StopResult:
        return self.process.stop(obtained, fencing_token)

    def close(self) -> None:
        self.process.close()


# This module's entry in delivery.targets.TARGET_KINDS.
KIND = TargetKind(validate_config, SparkTarget, frozenset({
    "module", "command", "python", "checkpoint_root", "run_dir", "environment", "stop_grace"}))
