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

from quotagate.delivery.naming import external_name
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets import process_runner
from quotagate.store.retention import PrunedBinding

__all__ = ["RUN_DIRECTORY_KINDS", "remove_run_directories"]

# Target kinds whose external object is a run directory under config["run_dir"].
RUN_DIRECTORY_KINDS = frozenset({"process", "spark"})


def remove_run_directories(targets: TargetStore, bindings: Sequence[PrunedBinding],
                           ledger_id: str | None = None) -> int:
    """Remove the run directories of ``bindings``; how many were there to remove.

    With ``ledger_id``, a requeued request's earlier attempts' directories under the
    same target go too (their names are derived: docs/decisions/720).
    """
    run_dirs = {
        config.name: Path(config.config["run_dir"])
        for config in targets.list()
        if config.kind in RUN_DIRECTORY_KINDS and isinstance(config.config.get("run_dir"), str)
    }
    removed = 0
    for binding in bindings:
        run_dir = run_dirs.get(binding.target)
        if run_dir is None:
            continue
        names = [binding.external_name]
        if ledger_id is not None and binding.tenant:
            names += [external_name(ledger_id, binding.tenant, binding.request_id, attempt)
                      for attempt in range(1, binding.attempt)]
        for name in names:
            removed += _remove(run_dir, name)
    return removed


def _remove(run_dir: Path, name: str) -> int:
    # The name came from the ledger, but a path separator or ".." must never
    # let a prune reach outside the run directory.
    if Path(name).name != name or name in ("", ".", ".."):
        return 0
    directory = run_dir / name
    removed = 0
    if directory.is_dir():
        shutil.rmtree(directory)
        removed = 1
    (run_dir / process_runner.EXITED_INDEX / name).unlink(missing_ok=True)
    return removed
