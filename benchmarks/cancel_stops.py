"""What the confirmed stop of a cancel costs, per stop (docs/decisions/716).

    .venv/bin/python benchmarks/cancel_stops.py [--backend postgresql] [--stops 400]
        [--batch 1] [--chunks 5] [--end stop|complete]

On one throwaway ledger, each chunk submits and admits ``--stops`` requests,
cancels them (each turns ``cancelling``: a stop begun) and then confirms their
stops as a worker does (``Ledger.release_many(..., stopped=True)``, ``--batch``
ends per transaction), timing only the confirmations. Since decision 716 such a
batch takes the decision lock (one ``SELECT … FOR UPDATE`` of ``qg_meta``) before
its cost returns; run it with the code before and after, alternating, to see
that statement's price. Wall and CPU (``time.process_time``) µs per confirmed
stop, the median of the chunks. ``--end complete`` times completions instead
(``RequestState.COMPLETED`` of admitted work, no cancel first): the other end
every request takes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _databases import throwaway_database
from quotagate import Quotagate
from quotagate.domain.model import RequestState
from quotagate.store.release import End


def _chunk(gate: Quotagate, chunk: int, stops: int, batch: int,
           complete: bool) -> tuple[float, float]:
    ids = [f"c{chunk:02d}-{index:05d}" for index in range(stops)]
    for request_id in ids:
        gate.submit(request_id, "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == stops
    if not complete:
        for request_id in ids:
            assert gate.cancel(request_id).request.state == RequestState.CANCELLING
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, stops, batch):
        ends = [End(request_id, RequestState.COMPLETED) if complete
                else End(request_id, RequestState.CANCELLED, stopped=True)
                for request_id in ids[start:start + batch]]
        for result in gate.ledger.release_many(ends):
            assert not isinstance(result, Exception) and result.released == {"gpu": 1}
    return ((time.perf_counter() - wall) / stops * 1e6, (time.process_time() - cpu) / stops * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="postgresql")
    parser.add_argument("--stops", type=int, default=400)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--end", choices=("stop", "complete"), default="stop")
    options = parser.parse_args()
    with throwaway_database(options.backend) as url, Quotagate.connect(url) as gate:
        gate.set_pool("pool-1", {"gpu": options.stops})
        gate.set_tenant("team-a", {"gpu": options.stops})
        assert gate.ledger_id  # the row the decision lock is taken on
        rows = [_chunk(gate, chunk, options.stops, options.batch, options.end == "complete")
                for chunk in range(options.chunks)]
        assert gate.check_invariants() == []
    what = "completions" if options.end == "complete" else "confirmed stops"
    print(f"{options.backend}: {options.chunks} chunks of {options.stops} {what}, "
          f"batches of {options.batch}; load {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%H:%M UTC', time.gmtime())}")
    print(f"| per {what[:-1]} | wall µs {statistics.median(row[0] for row in rows):.0f} | "
          f"CPU µs {statistics.median(row[1] for row in rows):.0f} |")


if __name__ == "__main__":
    main()
