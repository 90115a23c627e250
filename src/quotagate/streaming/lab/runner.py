"""``quotagate lab``: the four scenarios of docs/streaming.md, each in its own throwaway database."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotagate.errors import InvalidInput, StoreUnavailable, quoted
from quotagate.streaming.lab import checkpoint, gate, lease, quota
from quotagate.streaming.lab.databases import Cleanup, new_run_id, server_url, throwaway_database
from quotagate.streaming.lab.observations import Observation

Scenario = Callable[[str, Path], list[Observation]]

SCENARIOS: dict[str, Scenario] = {
    "quota": quota.run,
    "gate": gate.run,
    "lease": lease.run,
    "checkpoint": checkpoint.run,
}


@dataclass
class LabReport:
    run_id: str
    workdir: Path
    observations: dict[str, list[Observation]] = field(default_factory=dict)
    cleanups: list[Cleanup] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def cleanup_complete(self) -> bool:
        return all(cleanup.removed for cleanup in self.cleanups)

    @property
    def ok(self) -> bool:
        return not self.failures and self.cleanup_complete

    def lines(self) -> list[str]:
        return [observation.line() for group in self.observations.values() for observation in group]

    def to_dict(self) -> dict[str, Any]:
        scenarios: dict[str, dict[str, Any]] = {}
        for name, group in self.observations.items():
            fields: dict[str, Any] = {}
            for observation in group:
                # quotaGate appears twice (blocked, recovered): keep both under one name.
                if observation.name in fields:
                    previous = fields[observation.name]
                    fields[observation.name] = [*previous] if isinstance(previous, list) else [previous]
                    fields[observation.name].append(observation.to_dict())
                else:
                    fields[observation.name] = observation.to_dict()
            scenarios[name] = fields
        return {
            "run_id": self.run_id, "ok": self.ok, "scenarios": scenarios, "lines": self.lines(),
            "failures": self.failures, "cleanup_complete": self.cleanup_complete,
            "databases": [cleanup.to_dict() for cleanup in self.cleanups],
        }


def scenario_names(choice: str) -> list[str]:
    if choice == "all":
        return list(SCENARIOS)
    if choice not in SCENARIOS:
        raise InvalidInput(f"unknown lab scenario {quoted(choice)}; choose one of {', '.join(SCENARIOS)} or all",
                           code="invalid_scenario")
    return [choice]


def run_lab(names: Sequence[str], db_url: str | None = None, *, keep_workdir: bool = False,
            on_observation: Callable[[Observation], None] | None = None,
            on_start: Callable[[str], None] | None = None) -> LabReport:
    """Run the scenarios in order; a failing one is reported and the others still run."""
    server = server_url(db_url)  # a bad URL is refused here, before anything runs
    run_id = new_run_id()
    workdir = Path(tempfile.mkdtemp(prefix=f"quotagate-lab-{run_id}-"))
    report = LabReport(run_id, workdir)
    try:
        for name in names:
            scenario = SCENARIOS[name]
            scenario_dir = workdir / name
            scenario_dir.mkdir()
            if on_start is not None:
                on_start(name)
            try:
                with throwaway_database(server, workdir, report.run_id, name, report.cleanups) as url:
                    observations = scenario(url, scenario_dir)
            except StoreUnavailable:
                raise  # no database for any scenario: nothing to run
            except Exception as error:  # one scenario's failure must not hide the others' results
                report.failures[name] = f"{type(error).__name__}: {error}"
                continue
            report.observations[name] = observations
            for observation in observations:
                if on_observation is not None:
                    on_observation(observation)
    finally:
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return report
