"""A 30-second guided tour against a running ``quotagate serve`` (``serve --tour``).

It does what a platform team does on day one, through the real HTTP API: an
admin token (created once, shown once), two tenants with quotas, two pools, a
local process target, then a burst of requests from both tenants — and it
prints each request's way from ``waiting`` to ``completed`` and the usage.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from quotagate.app import Quotagate
from quotagate.errors import StoreUnavailable

Echo = Callable[[str], None]

TOUR_TENANTS = {"team-a": {"gpu": 2, "cpu": 16}, "team-b": {"gpu": 1, "cpu": 8}}
TOUR_POOLS = {"pool-1": {"gpu": 2, "cpu": 16}, "pool-2": {"gpu": 1, "cpu": 8}}
# Each request "runs" for a second so the queue is visible.
TOUR_COMMAND = [sys.executable, "-c",
                "import os, time; time.sleep(1.0); print('done', os.environ['QUOTAGATE_REQUEST_ID'])"]


def _wait_ready(client: Any, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise StoreUnavailable("the server did not become ready within 30 s", code="server_not_ready")


TOUR_TOKEN_LABEL = "tour"


def tour_token(gate: Quotagate) -> tuple[str, int]:
    """A new admin token for this tour, and how many earlier tours' tokens it replaced.

    Each run of the tour shows a new admin token; the ones earlier runs showed are
    revoked, so tours on one ledger do not leave live admin tokens piling up
    (docs/decisions/908-each-tour-replaces-the-last-tours-token.md). Only tokens
    labelled as the tour's are touched.
    """
    earlier = [info for info in gate.list_api_tokens()
               if info.admin and info.label == TOUR_TOKEN_LABEL and info.revoked is None]
    token = gate.create_api_token(admin=True, label=TOUR_TOKEN_LABEL, actor="tour").token
    for info in earlier:
        gate.revoke_api_token(info.id, actor="tour")
    return token, len(earlier)


def run_tour(base_url: str, gate: Quotagate, echo: Echo) -> None:
    import httpx

    with httpx.Client(base_url=base_url, timeout=10) as client:
        _wait_ready(client, time.monotonic() + 30)
        token, replaced = tour_token(gate)
        gate.set_target(
            "local", "process", {"command": TOUR_COMMAND, "run_dir": "quotagate-runs"},
            default=True, actor="tour",
        )
        headers = {"Authorization": f"Bearer {token}"}
        echo("tour: an admin token was created for you (shown once, stored hashed):")
        echo(f"  export QG_TOKEN={token}")
        if replaced:
            echo(f"tour: the admin token{'s' if replaced > 1 else ''} earlier tours showed "
                 f"{'are' if replaced > 1 else 'is'} revoked; for a lasting one: "
                 "quotagate api-token create --admin")
        for name, capacity in TOUR_POOLS.items():
            client.put(f"/v1/pools/{name}", json={"capacity": capacity}, headers=headers)
        for name, quota in TOUR_TENANTS.items():
            client.put(f"/v1/tenants/{name}", json={"quota": quota}, headers=headers)
        echo(f"tour: pools {TOUR_POOLS}, tenants {TOUR_TENANTS}, process target 'local'")
        submitted: list[tuple[str, str]] = []
        for index in range(6):
            tenant = "team-a" if index % 3 else "team-b"
            request_id = f"tour-{int(time.time())}-{index}"
            response = client.post(
                f"/v1/tenants/{tenant}/requests",
                json={"id": request_id, "cost": {"gpu": 1, "cpu": 2}, "priority": index % 2,
                      "payload": {"model": "tiny", "step": index}},
                headers=headers,
            )
            echo(f"  POST /v1/tenants/{tenant}/requests {request_id} -> {response.status_code}")
            submitted.append((tenant, request_id))
        last: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = {}
            for tenant, request_id in submitted:
                body = client.get(f"/v1/tenants/{tenant}/requests/{request_id}",
                                  headers=headers).json()
                states[request_id] = body.get("state", "?")
            if states != last:
                echo("  " + "  ".join(f"{rid.rsplit('-', 1)[1]}:{state}"
                                      for rid, state in states.items()))
                last = states
            if all(state in ("completed", "failed") for state in states.values()):
                break
            time.sleep(0.2)
        usage = client.get("/v1/usage", headers=headers).json()
        echo("tour: usage now " + ", ".join(
            f"{row['tenant']}/{row['resource']} {row['used']}/{row['cap']}"
            for row in usage["tenants"]))
        echo("tour: try it yourself (the server keeps running; Ctrl-C stops it):")
        echo(f"  open {base_url}/ui/ and sign in with the token above (the live dashboard)")
        echo(f"  curl -s -H \"Authorization: Bearer $QG_TOKEN\" {base_url}/v1/usage")
        echo(f"  curl -s -H \"Authorization: Bearer $QG_TOKEN\" -H 'Content-Type: application/json' "
             f"{base_url}/v1/tenants/team-a/requests -d '{{\"id\": \"my-job\", "
             f"\"cost\": {{\"gpu\": 1}}}}'")
        echo(f"  curl -s {base_url}/metrics | grep quotagate_")
