"""The tests of `quotagate serve` itself: the default ledger, SIGTERM, loopback, its worker."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from quotagate import Quotagate
from support.databases import fresh_database
from support.http_servers import QUOTAGATE, STARTUP_DEADLINE, bearer, make_token, running_server, start_server


def test_serve_creates_the_default_sqlite_ledger_and_stops_cleanly_on_sigterm(
    tmp_path: Path,
) -> None:
    token_output = subprocess.run(
        [QUOTAGATE, "api-token", "create", "--admin", "--label", "first"], cwd=tmp_path,
        capture_output=True, text=True, check=True,
        env={key: value for key, value in os.environ.items() if key != "QUOTAGATE_DB"},
    )
    token = token_output.stdout.strip()
    assert token.startswith("qg_")
    assert (tmp_path / "quotagate.db").exists()
    server = start_server("", tmp_path, cwd=tmp_path)
    try:
        response = httpx.put(f"{server.url}/v1/pools/main", json={"capacity": {"gpu": 1}},
                             headers=bearer(token))
        assert response.status_code == 200, response.text
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    finally:
        status = server.stop()
    assert status == 0, server.log()
    assert token not in server.log()


def test_serve_listens_on_loopback_by_default(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with running_server(db_url, tmp_path, args=["--no-workers"]) as server:
        addresses = _listening_addresses(server.port)
    assert addresses == {"127.0.0.1"}


def _listening_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port``, from the kernel's own table (Linux)."""
    table = Path("/proc/net/tcp")
    if not table.exists():
        pytest.skip("needs /proc/net/tcp (Linux)")
    addresses = set()
    for line in table.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            addresses.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return addresses


def test_sigterm_under_traffic_loses_no_acknowledged_request(tmp_path: Path) -> None:
    with fresh_database("sqlite", tmp_path) as db_url:
        token = make_token(db_url)
        server = start_server(db_url, tmp_path)
        acknowledged: list[str] = []
        with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as client:
            client.put("/v1/pools/main", json={"capacity": {"gpu": 100}}).raise_for_status()
            client.put("/v1/tenants/team-a", json={"quota": {"gpu": 5}}).raise_for_status()

            def submit_until_refused() -> None:
                for n in range(100_000):
                    try:
                        response = client.post("/v1/tenants/team-a/requests",
                                               json={"id": f"job-{n}", "cost": {"gpu": 1}})
                    except httpx.TransportError:
                        return
                    if response.status_code != 202:
                        return
                    acknowledged.append(f"job-{n}")

            sender = threading.Thread(target=submit_until_refused)
            sender.start()
            until = time.monotonic() + 30
            while len(acknowledged) < 20:
                assert time.monotonic() < until and sender.is_alive(), server.log()
                time.sleep(0.01)
            status = server.stop()
            sender.join(30)
        assert status == 0, server.log()
        with Quotagate.connect(db_url) as gate:
            for request_id in acknowledged:
                assert gate.show(request_id).tenant == "team-a"
            assert gate.check_invariants() == []


def test_serve_runs_its_delivery_worker_under_the_name_given(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with running_server(db_url, tmp_path, args=["--worker-name", "edge-1"]):
        deadline = time.monotonic() + STARTUP_DEADLINE
        while True:
            listed = subprocess.run([QUOTAGATE, "lease", "show", "--json", "--db", db_url],
                                    capture_output=True, text=True, check=True).stdout
            if "worker/edge-1" in listed or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert "worker/edge-1" in listed, listed
