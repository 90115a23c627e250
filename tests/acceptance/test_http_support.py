"""Running real `quotagate serve` processes for the HTTP tests, and the tests of serve itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from quotagate import Quotagate
from quotagate.auth.tokens import TokenStore
from support.databases import fresh_database

QUOTAGATE = str(Path(sys.executable).with_name("quotagate"))
STARTUP_DEADLINE = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """One `quotagate serve` subprocess, its URL and its log."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, deadline: float = STARTUP_DEADLINE) -> None:
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            if self.process.poll() is not None:
                pytest.fail(f"serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        pytest.fail(f"serve was not ready within {deadline}s:\n{self.log()}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"serve did not stop within {timeout}s after SIGTERM:\n{self.log()}")


def start_server(
    db_url: str, log_dir: Path, *, args: Sequence[str] = (), cwd: Path | None = None
) -> Server:
    port = free_port()
    log_path = log_dir / f"serve-{port}.log"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    environment.pop("QUOTAGATE_DB", None)
    command = [QUOTAGATE, "serve", "--port", str(port), "--admit-interval", "0.05",
               "--log-level", "warning", *args]
    if db_url:
        command += ["--db", db_url]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=environment)
    server = Server(process, port, log_path)
    try:
        server.wait_ready()
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise
    return server


@contextmanager
def running_server(
    db_url: str, log_dir: Path, *, args: Sequence[str] = (), cwd: Path | None = None
) -> Iterator[Server]:
    server = start_server(db_url, log_dir, args=args, cwd=cwd)
    try:
        yield server
    finally:
        server.stop()


def make_token(db_url: str, *, tenant: str | None = None, label: str | None = None) -> str:
    """A token made through the Python API (the CLI path has its own test)."""
    with Quotagate.connect(db_url) as gate:
        return TokenStore(gate.engine).create(
            admin=tenant is None, tenant=tenant, label=label, actor="test"
        ).token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- serve itself ------------------------------------------------------------------


def test_serve_creates_the_default_sqlite_ledger_and_stops_cleanly_on_sigterm(
    tmp_path: Path,
) -> None:
    token_output = subprocess.run(
        [QUOTAGATE, "token", "create", "--admin", "--label", "first"], cwd=tmp_path,
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
