"""Reading a Structured Streaming checkpoint directory: what the engine says it did.

``offsets/N`` says batch N was planned, ``commits/N`` that it finished (after its
sink returned). Files only; no Spark needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CheckpointState:
    location: str
    exists: bool
    offsets: tuple[int, ...]
    commits: tuple[int, ...]

    @property
    def latest_offset(self) -> int | None:
        return self.offsets[-1] if self.offsets else None

    @property
    def latest_commit(self) -> int | None:
        return self.commits[-1] if self.commits else None

    @property
    def planned_not_committed(self) -> tuple[int, ...]:
        committed = set(self.commits)
        return tuple(batch for batch in self.offsets if batch not in committed)

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.location, "exists": self.exists, "latest_offset": self.latest_offset,
                "latest_commit": self.latest_commit, "planned_not_committed": list(self.planned_not_committed)}


def read_checkpoint(location: str | Path) -> CheckpointState:
    root = Path(location)
    return CheckpointState(str(root), root.is_dir(), _batches(root / "offsets"), _batches(root / "commits"))


def _batches(directory: Path) -> tuple[int, ...]:
    if not directory.is_dir():
        return ()
    # Batch files are named by their number; ".N.crc" checksums and temporary files are not batches.
    return tuple(sorted(int(entry.name) for entry in directory.iterdir() if entry.name.isdigit()))
