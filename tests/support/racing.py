"""Child processes started together on a barrier, each answering once (importable helpers)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any


def race(target: Callable[..., None], *args: Any, processes: int) -> list[Any]:
    """Run ``target(*args, barrier, results)`` in ``processes`` spawned processes.

    Each waits on the shared barrier, so their work overlaps, and puts one
    answer on ``results``. Returns the answers once every process exited 0.
    Daemon processes: one that hangs never keeps the test run from ending.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results: Any = context.Queue()
    children = [context.Process(target=target, args=(*args, barrier, results), daemon=True)
                for _ in range(processes)]
    for child in children:
        child.start()
    answers = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    return answers


def race_mixed(jobs: Sequence[tuple[Callable[..., None], tuple[Any, ...]]]) -> list[Any]:
    """:func:`race` for processes doing different things: ``target(*args, barrier, results)``
    per job, all started on one barrier. Returns the answers, in the order they came."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(jobs))
    results: Any = context.Queue()
    children = [context.Process(target=target, args=(*args, barrier, results), daemon=True)
                for target, args in jobs]
    for child in children:
        child.start()
    answers = [results.get(timeout=300) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    return answers
