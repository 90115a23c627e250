"""What handing a blocking call from the event loop to a thread costs, per call.

``serve`` answers a single submit on the event loop and runs its database work on a
thread. This measures the hand-off alone, with the work a short wait that releases
the GIL as a database round trip does: ``--callers`` tasks on one asyncio loop each
hand ``--calls`` calls over in turn, through AnyIO's thread pool (``to_thread.run_sync``,
the baseline: what ``serve`` uses) and through a lane of a few threads fed by one
queue, the alternative docs/decisions/322 measured and did not adopt, in
alternating rounds in one process. Reported: the process's CPU time per call (user + system, all
threads) and the calls answered per second of wall time, median of the rounds.

    .venv/bin/python benchmarks/submit_handoff.py [--calls 3000] [--callers 8] \\
        [--work-ms 0.5] [--threads 14] [--lanes 2,4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

import anyio
import anyio.to_thread

from quotagate.cli.common import render_table

HandOff = Callable[[Callable[[], None]], Awaitable[None]]


class QueueLane:
    """``threads`` threads taking calls from one queue: a busy thread needs no wake-up.

    A call holds a token of the loop's thread limiter while it runs, as through AnyIO,
    so the database pool's bound (docs/decisions/314) would hold."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], Future[None]]] = \
            queue.SimpleQueue()
        self._started = 0
        self._lock = threading.Lock()

    async def run(self, work: Callable[[], None]) -> None:
        limiter = anyio.to_thread.current_default_thread_limiter()
        try:
            limiter.acquire_nowait()
        except anyio.WouldBlock:
            await limiter.acquire()
        try:
            answer: Future[None] = Future()
            with self._lock:
                self._queue.put((work, answer))
                if self._started < self.threads:
                    self._started += 1
                    threading.Thread(target=self._serve, daemon=True).start()
            await asyncio.wrap_future(answer)
        finally:
            limiter.release()

    def _serve(self) -> None:
        while True:
            work, answer = self._queue.get()
            if answer.set_running_or_notify_cancel():
                try:
                    answer.set_result(work())
                except Exception as error:
                    answer.set_exception(error)


def _anyio(work: Callable[[], None]) -> Awaitable[None]:
    return anyio.to_thread.run_sync(work)


async def _round(hand_off: HandOff, calls: int, callers: int, work_seconds: float,
                 threads: int) -> tuple[float, float]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = threads

    def work() -> None:
        time.sleep(work_seconds)

    async def caller(count: int) -> None:
        for _ in range(count):
            await hand_off(work)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(calls // callers) for _ in range(callers)))
    done = calls // callers * callers
    return (time.process_time() - cpu) / done, done / (time.perf_counter() - wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--callers", type=int, default=8, help="Tasks handing calls over at once.")
    parser.add_argument("--work-ms", type=float, default=0.5,
                        help="Milliseconds each call waits on its thread (the GIL released).")
    parser.add_argument("--threads", type=int, default=14,
                        help="The loop's thread limit (serve's default with workers).")
    parser.add_argument("--lanes", default="2,4",
                        help="Comma-separated thread counts of the queue-fed lanes measured.")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    sides: dict[str, HandOff] = {"AnyIO to_thread.run_sync (baseline)": _anyio}
    for size in (int(size) for size in arguments.lanes.split(",") if size.strip()):
        sides[f"one queue, {size} threads"] = QueueLane(size).run
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}

    async def run_all() -> None:
        for _ in range(arguments.rounds):
            for name, hand_off in sides.items():
                results[name].append(await _round(hand_off, arguments.calls, arguments.callers,
                                                  arguments.work_ms / 1000, arguments.threads))

    asyncio.run(run_all())
    print(render_table(
        ["hand-off", "CPU µs per call (median)", "range", "calls/s (median)"],
        [[name, f"{statistics.median(cpu for cpu, _ in runs) * 1e6:.0f}",
          f"{min(cpu for cpu, _ in runs) * 1e6:.0f}-{max(cpu for cpu, _ in runs) * 1e6:.0f}",
          f"{statistics.median(rate for _, rate in runs):.0f}"]
         for name, runs in results.items()],
    ))


if __name__ == "__main__":
    main()
