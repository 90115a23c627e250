"""``serve``'s admission loop on SQLite, PostgreSQL and MariaDB: a backlog grows its passes."""

from __future__ import annotations

import itertools
import threading

from quotagate import Quotagate, RequestState
from quotagate.http.service import AdmissionLoop
from support.waiting import wait_for


def test_full_passes_double_the_next_one_and_a_short_pass_goes_back(gate: Quotagate) -> None:
    """Each pass that comes back full asks for twice as many as it did; the first short
    one asks for ``batch`` again (docs/decisions/252). Every request is admitted once."""
    gate.set_pool("main", {"gpu": 1000})
    gate.set_tenant("team-a", {"gpu": 1000})
    gate.submit_many("team-a", [{"id": f"r-{index:03d}", "cost": {"gpu": 1}}
                                for index in range(100)])
    asked: list[int] = []
    got: list[int] = []
    admitted: list[str] = []
    admit = gate.admit

    def counted(limit: int = 1) -> list[object]:
        placements = admit(limit)
        asked.append(limit)
        got.append(len(placements))
        admitted.extend(placement.id for placement in placements)
        return placements  # type: ignore[return-value]

    gate.admit = counted  # type: ignore[method-assign]
    loop = AdmissionLoop(gate, gate.metrics, batch=4, interval=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: len(admitted) == 100 and got[-1] == 0, "the backlog admitted")
    finally:
        stop.set()
        thread.join(30)
    passes = list(zip(asked, got, strict=True))
    for (size, count), (next_size, _next_count) in itertools.pairwise(passes):
        assert next_size == (min(2 * size, 256) if count == size else 4), passes
    assert asked[:4] == [4, 8, 16, 32] and got[:4] == asked[:4], passes
    assert asked[-1] == 4, passes
    assert sorted(admitted) == [f"r-{index:03d}" for index in range(100)]
    assert {gate.show(f"r-{index:03d}").state for index in range(100)} == {RequestState.RESERVED}
    assert gate.check_invariants() == []


def test_each_pass_that_reserved_something_rings_once_it_is_committed(gate: Quotagate) -> None:
    """serve's admission loop rings the dispatcher's bell after every pass that reserved
    something, and only then: what it reserved is already committed (another connection
    reads it reserved), and passes that found nothing ring nothing (docs/decisions/258)."""
    gate.set_pool("main", {"gpu": 1000})
    gate.set_tenant("team-a", {"gpu": 1000})
    gate.submit_many("team-a", [{"id": f"r-{index:02d}", "cost": {"gpu": 1}}
                                for index in range(10)])
    passes: list[list[str]] = []
    admit = gate.admit

    def counted(limit: int = 1) -> list[object]:
        placements = admit(limit)
        passes.append([placement.id for placement in placements])
        return placements  # type: ignore[return-value]

    seen_at_ring: list[set[RequestState]] = []

    def ring() -> None:
        seen_at_ring.append({gate.show(request_id).state for request_id in passes[-1]})

    gate.admit = counted  # type: ignore[method-assign]
    loop = AdmissionLoop(gate, gate.metrics, batch=4, interval=0.01, on_admitted=ring)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: sum(map(len, passes)) == 10 and len(passes) >= 5 and not passes[-1],
                 "the backlog admitted and empty passes after it")
    finally:
        stop.set()
        thread.join(30)
    reserving = [ids for ids in passes if ids]
    assert len(reserving) < len(passes)  # there were empty passes: they rang nothing
    assert seen_at_ring == [{RequestState.RESERVED}] * len(reserving)
