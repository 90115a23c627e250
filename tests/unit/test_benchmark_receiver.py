"""benchmarks/_receiver.py: its callbacks wait for a connection outside the HTTP client.

httpcore's pool scans every request queued in it when any request starts or ends;
with hundreds of callbacks queued there the benchmark's receiver, not quotagate,
was the pipeline's limit (docs/performance.md, "Where the end-to-end path spends
its time"). The receiver hands the client at most as many callbacks as it has
connections.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _receiver

DELIVERIES = 100


class HoldingQuotagate(httpx.AsyncBaseTransport):
    """Stands in for quotagate's HTTP API: holds every callback until released."""

    def __init__(self) -> None:
        self.inside = 0
        self.most_inside = 0
        self.answered = 0
        self.release = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            await self.release.wait()
        finally:
            self.inside -= 1
        self.answered += 1
        return httpx.Response(200, json={"state": "completed"})


async def _until(condition: object) -> None:
    # Yield to the event loop until the condition holds: every step is the loop's own.
    while not condition():  # type: ignore[operator]
        await asyncio.sleep(0)


async def _deliver_all() -> tuple[HoldingQuotagate, dict[str, object]]:
    quotagate = HoldingQuotagate()
    app = _receiver.build_app("callback", "http://quotagate.invalid", "executor-token",
                              transport=quotagate)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://receiver") as hooks:
        for n in range(DELIVERIES):
            answer = await hooks.post("/hooks", json={
                "name": f"object-{n}", "request_id": f"req-{n}", "tenant": "tenant-a",
                "fencing_token": n})
            assert answer.status_code == 201

        async def calls() -> dict[str, object]:
            return (await hooks.get("/arrivals")).json()  # type: ignore[no-any-return]

        # Every delivery's callback has started its attempt (counted before it asks
        # for a connection) while quotagate holds the ones it was handed.
        while (await calls())["callbacks"] != DELIVERIES:
            await asyncio.sleep(0)
        await _until(lambda: quotagate.inside >= _receiver._CONNECTIONS)
        # A few more round trips through the receiver give every callback task
        # many turns of the loop: one not held back would reach quotagate by now.
        for _ in range(3):
            await calls()
        held_at_most = quotagate.most_inside
        quotagate.release.set()
        await _until(lambda: quotagate.answered == DELIVERIES)
        report = await calls()
    report["held_at_most"] = held_at_most
    return quotagate, report


def test_callbacks_reach_the_client_no_more_than_its_connections_at_once() -> None:
    quotagate, report = asyncio.run(_deliver_all())

    assert report["held_at_most"] == _receiver._CONNECTIONS
    assert quotagate.most_inside == _receiver._CONNECTIONS
    assert report["callback_error_count"] == 0
    assert quotagate.answered == DELIVERIES
