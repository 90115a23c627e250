"""What a pruned request leaves outside the ledger: the process targets' run directories.

``quotagate prune`` deletes finished requests; a process (or Spark) target's run
directory ``<run_dir>/<external name>/`` and its entry in the ``.exited`` index
would then stay forever (docs/decisions/204). Kubernetes objects are not touched:
the cluster's own garbage collection and TTL controllers own them.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets import process_runner
from quotagate.store.retention import PrunedBinding

__all__ = ["RUN_DIRECTORY_KINDS", "remove_run_directories"]

# Target kinds whose external object is a run directory under config["run_dir"].
RUN_DIRECTORY_KINDS = frozenset({"process", "spark"})


def remove_run_directories(targets: TargetStore, bindings: Sequence[PrunedBinding]) -> int:
    """Remove the run directories of ``bindings``; how many were there to remove."""
    run_dirs = {
        config.name: Path(config.config["run_dir"])
        for config in targets.list()
        if config.kind in RUN_DIRECTORY_KINDS and isinstance(config.config.get("run_dir"), str)
    }
    removed = 0
    for binding in bindings:
        run_dir = run_dirs.get(binding.target)
        # The name came from the ledger, but a path separator or ".." must never
        # let a prune reach outside the run directory.
        if run_dir is None or Path(binding.external_name).name != binding.external_name \
                or binding.external_name in ("", ".", ".."):
            continue
        directory = run_dir / binding.external_name
        if directory.is_dir():
            shutil.rmtree(directory)
            removed += 1
        (run_dir / process_runner.EXITED_INDEX / binding.external_name).unlink(missing_ok=True)
    return removed
