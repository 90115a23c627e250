"""A fast local webhook receiver for benchmarks/pipeline.py, run in its own process.

It accepts every delivery (``POST /hooks``: 201, the body echoed back with an
``id``; ``POST /hooks/_batch``: the same for each item, docs/delivery.md),
notes when each request arrived, and ends the work at once in one of three
ways:

* ``callback``: it calls ``POST …/requests/{id}/complete`` on quotagate with an
  executor token and the delivery's fencing token (accepted even before the
  worker has recorded the delivery, docs/decisions/225), calling again while
  quotagate answers 409 ``not_delivered`` (older servers did so until the
  delivery was recorded), and its outcome read says ``running`` until that
  succeeded;
* ``callback-batch``: the same, but the ends of each tenant gathered while its
  previous call is in flight go in one ``POST …/requests:end``;
* ``read``: its outcome read (``GET /hooks/{name}``, or many names at once with
  ``POST /hooks/_read``) says ``completed`` at once, and the worker finds out
  by reading.

``GET /arrivals`` returns ``{request_id: epoch seconds}`` of first arrivals.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
import uuid
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

_CALLBACK_ATTEMPTS = 500
_BATCH = 500  # ends per POST …/requests:end
_CONNECTIONS = 16  # callbacks in flight at once, each on its own connection

# httpcore tries ``import sniffio`` on every async request; where it is not
# installed, each failed import walks sys.path again (a fifth of this process's
# samples under py-spy, docs/performance.md): make that import fail at once.
if importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]


def build_app(mode: str, quotagate_url: str, executor_token: str,
              transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The receiver; ``transport`` (tests) replaces the HTTP connection pool to quotagate."""
    objects: dict[str, dict[str, Any]] = {}
    arrivals: dict[str, float] = {}
    pending: set[asyncio.Task[None]] = set()
    calls = {"callbacks": 0, "not_delivered": 0, "transport_errors": 0}
    client = httpx.AsyncClient(
        base_url=quotagate_url, headers={"Authorization": f"Bearer {executor_token}"},
        timeout=60, limits=httpx.Limits(max_connections=_CONNECTIONS), transport=transport,
    )
    # Callbacks beyond the client's connections wait here, not in httpcore's pool,
    # which scans every queued request on every request's start and end:
    # hundreds queued made that scan most of this process's time.
    in_flight = asyncio.Semaphore(_CONNECTIONS)

    async def complete(stored: dict[str, Any]) -> None:
        path = f"/v1/tenants/{stored['tenant']}/requests/{stored['request_id']}/complete"
        delay = 0.01
        for _ in range(_CALLBACK_ATTEMPTS):
            calls["callbacks"] += 1
            try:
                async with in_flight:
                    answer = await client.post(
                        path, json={"fencing_token": stored["fencing_token"]})
            except httpx.TransportError:
                # A kept-alive connection the server closed as we reused it: again.
                calls["transport_errors"] += 1
                await asyncio.sleep(delay)
                continue
            if answer.status_code == 200:
                stored["state"] = "completed"
                return
            if answer.status_code != 409 or answer.json().get("code") != "not_delivered":
                stored["callback_error"] = f"{answer.status_code} {answer.text[:200]}"
                return
            calls["not_delivered"] += 1
            # The worker records its batch's deliveries together: back off.
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        stored["callback_error"] = "never recorded as delivered"

    # callback-batch: per tenant, ends gathered while the previous call is in flight.
    gathered: dict[str, list[dict[str, Any]]] = {}
    wakeups: dict[str, asyncio.Event] = {}

    def gather(stored: dict[str, Any]) -> None:
        tenant = stored["tenant"]
        gathered.setdefault(tenant, []).append(stored)
        if tenant not in wakeups:
            wakeups[tenant] = asyncio.Event()
            task = asyncio.get_running_loop().create_task(flush(tenant))
            pending.add(task)
        wakeups[tenant].set()

    async def flush(tenant: str) -> None:
        path = f"/v1/tenants/{tenant}/requests:end"
        while True:
            await wakeups[tenant].wait()
            wakeups[tenant].clear()
            batch, gathered[tenant] = gathered[tenant][:_BATCH], gathered[tenant][_BATCH:]
            if gathered[tenant]:
                wakeups[tenant].set()
            if not batch:
                continue
            calls["callbacks"] += 1
            try:
                answer = await client.post(path, json={"ends": [
                    {"id": stored["request_id"], "state": "completed",
                     "fencing_token": stored["fencing_token"]} for stored in batch]})
            except httpx.TransportError:
                calls["transport_errors"] += 1
                retry(batch)
                continue
            if answer.status_code != 200:
                for stored in batch:
                    stored["callback_error"] = f"{answer.status_code} {answer.text[:200]}"
                continue
            later = []
            for stored, result in zip(batch, answer.json()["results"], strict=True):
                if result["status"] == 200:
                    stored["state"] = "completed"
                elif result["status"] == 409 and result["error"]["code"] == "not_delivered":
                    calls["not_delivered"] += 1
                    later.append(stored)
                else:
                    stored["callback_error"] = f"{result['status']} {result['error']}"
            retry(later)

    def retry(batch: list[dict[str, Any]]) -> None:
        # The worker records its batch's deliveries together: ask again shortly.
        if batch:
            asyncio.get_running_loop().call_later(0.05, lambda: [gather(s) for s in batch])

    def accept(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body["name"]
        arrivals.setdefault(body["request_id"], time.time())
        stored = objects.get(name)
        if stored is not None:
            return 409, {"error": "exists"}
        stored = {**body, "id": uuid.uuid4().hex,
                  "state": "completed" if mode == "read" else "running"}
        objects[name] = stored
        if mode == "callback":
            task = asyncio.get_running_loop().create_task(complete(stored))
            pending.add(task)
            task.add_done_callback(pending.discard)
        elif mode == "callback-batch":
            gather(stored)
        return 201, stored

    async def deliver(request: Request) -> JSONResponse:
        status, answer = accept(await request.json())
        return JSONResponse(answer, status_code=status)

    async def deliver_many(request: Request) -> JSONResponse:
        # --batch-deliver: each item answered as its own POST would be.
        results = []
        for item in (await request.json())["deliveries"]:
            status, answer = accept(item)
            results.append({"status": status, "object": answer})
        return JSONResponse({"results": results})

    async def read(request: Request) -> JSONResponse:
        stored = objects.get(request.path_params["name"])
        if stored is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return JSONResponse(stored)

    async def read_many(request: Request) -> JSONResponse:
        names = (await request.json())["names"]
        return JSONResponse({"objects": {name: objects[name] for name in names
                                         if name in objects}})

    async def stop(request: Request) -> JSONResponse:
        objects.pop(request.path_params["name"], None)
        return JSONResponse({}, status_code=200)

    async def report(_request: Request) -> JSONResponse:
        errors = [stored["callback_error"] for stored in objects.values()
                  if "callback_error" in stored]
        return JSONResponse({"arrivals": arrivals, "callback_errors": errors[:5],
                             "callback_error_count": len(errors), **calls})

    return Starlette(routes=[
        Route("/hooks", deliver, methods=["POST"]),
        Route("/hooks/_read", read_many, methods=["POST"]),
        Route("/hooks/_batch", deliver_many, methods=["POST"]),
        Route("/hooks/{name}", read, methods=["GET"]),
        Route("/hooks/{name}", stop, methods=["DELETE"]),
        Route("/arrivals", report, methods=["GET"]),
    ])


def serve(port: int, mode: str, quotagate_url: str, executor_token: str) -> None:
    """Run the receiver until the process is terminated (the benchmark's child process)."""
    # The plain asyncio loop and h11 whatever is installed: the receiver stays the
    # same process when a run compares serve with and without uvicorn's extras.
    uvicorn.run(build_app(mode, quotagate_url, executor_token), host="127.0.0.1", port=port,
                log_level="warning", access_log=False, lifespan="off", loop="asyncio",
                http="h11")
