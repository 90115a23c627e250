"""A worker's built targets: a target set after its last read is found, not refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from quotagate import NotFound, Quotagate
from quotagate.delivery.built_targets import BuiltTargets


def test_a_default_target_set_after_the_last_read_is_found_without_waiting_for_a_pass(
    gate: Quotagate, tmp_path: Path
) -> None:
    built = BuiltTargets(gate.targets, ledger_id=gate.ledger_id)
    try:
        with pytest.raises(NotFound) as missing:
            built.get(None)  # reads the (empty) configurations
        assert missing.value.code == "no_default_target"
        gate.set_target("local", "process",
                        {"command": ["true"], "run_dir": str(tmp_path / "runs")}, default=True)
        config, _target = built.get(None)
        assert config.name == "local"
        with pytest.raises(NotFound) as unknown:
            built.get("elsewhere")
        assert unknown.value.code == "unknown_target"
    finally:
        built.close()
