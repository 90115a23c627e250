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
every request takes. ``--end callback`` times completions as executors' callbacks
(each end with its executor guard and fencing token, as ``serve``'s group release
writes them) of work a worker claimed and recorded delivered, untimed, before.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _databases import throwaway_database
from quotagate import Quotagate
from quotagate.delivery.registry import TargetStore
from quotagate.domain.external_object import ExternalObject
from quotagate.domain.model import RequestState
from quotagate.store.authority import executor_guard
from quotagate.store.outbox import OutboxStore
from quotagate.store.release import End


def _delivered(gate: Quotagate, chunk: int, ids: list[str]) -> dict[str, int]:
    """Claim and record ``ids`` delivered to ``hook``, as a worker does; their tokens."""
    outbox = OutboxStore(gate.engine, gate.leases, gate.clock)
    lease = gate.leases.acquire(f"worker-{chunk}", "bench", 600.0)
    assert lease is not None
    claims = outbox.claim_work(lease, len(ids), stops=False)
    assert len(claims) == len(ids)
    outbox.record_deliveries(lease, [
        (claim, "hook", ExternalObject(f"obj-{claim.request_id}", None, claim.request_id))
        for claim in claims], actor="bench")
    return {claim.request_id: claim.fencing_token for claim in claims}


def _chunk(gate: Quotagate, chunk: int, stops: int, batch: int,
           end: str) -> tuple[float, float]:
    ids = [f"c{chunk:02d}-{index:05d}" for index in range(stops)]
    for request_id in ids:
        gate.submit(request_id, "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == stops
    complete = end != "stop"
    tokens = _delivered(gate, chunk, ids) if end == "callback" else {}
    if not complete:
        for request_id in ids:
            assert gate.cancel(request_id).request.state == RequestState.CANCELLING
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, stops, batch):
        ends = [End(request_id, RequestState.COMPLETED, actor="executor:hook",
                    guard=executor_guard("hook", tokens[request_id])) if end == "callback"
                else End(request_id, RequestState.COMPLETED) if complete
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
    parser.add_argument("--end", choices=("stop", "complete", "callback"), default="stop")
    options = parser.parse_args()
    with throwaway_database(options.backend) as url, Quotagate.connect(url) as gate:
        gate.set_pool("pool-1", {"gpu": options.stops})
        gate.set_tenant("team-a", {"gpu": options.stops})
        assert gate.ledger_id  # the row the decision lock is taken on
        if options.end == "callback":
            TargetStore(gate.engine).set("hook", "webhook", {"url": "http://127.0.0.1:9/"},
                                         default=True)
        rows = [_chunk(gate, chunk, options.stops, options.batch, options.end)
                for chunk in range(options.chunks)]
        assert gate.check_invariants() == []
    what = {"complete": "completions", "callback": "callbacks"}.get(options.end,
                                                                   "confirmed stops")
    print(f"{options.backend}: {options.chunks} chunks of {options.stops} {what}, "
          f"batches of {options.batch}; load {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%H:%M UTC', time.gmtime())}")
    print(f"| per {what[:-1]} | wall µs {statistics.median(row[0] for row in rows):.0f} | "
          f"CPU µs {statistics.median(row[1] for row in rows):.0f} |")


if __name__ == "__main__":
    main()
