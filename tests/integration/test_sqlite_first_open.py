"""Several processes opening a new SQLite file at once all get a WAL connection.

The first connection to a file switches it to WAL; SQLite answers a process
that loses that race "database is locked" without waiting (the failure that
once left a sink writer dead and its partner on a barrier).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from support import workers

pytestmark = pytest.mark.sqlite


def test_processes_opening_a_new_file_together_all_connect_in_wal_mode(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    for attempt in range(5):
        url = f"sqlite:///{tmp_path / f'new-{attempt}.db'}"
        barrier = context.Barrier(4)
        results: Any = context.Queue()
        openers = [context.Process(target=workers.open_new_database, args=(url, barrier, results), daemon=True)
                   for _ in range(4)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(timeout=120)
        assert [opener.exitcode for opener in openers] == [0, 0, 0, 0]
        assert sorted(results.get(timeout=10) for _ in openers) == ["wal"] * 4
