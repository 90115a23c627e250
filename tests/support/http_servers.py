"""Real HTTP servers for the tests: `quotagate serve` subprocesses, an app served in a thread, tokens."""

from __future__ import annotations

import functools
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
import uvicorn

from quotagate import Quotagate
from quotagate.http.connections import run_server

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
        return gate.create_api_token(admin=tenant is None, tenant=tenant, label=label, actor="test").token


def put_stalled_tenant(admin: httpx.Client, name: str) -> None:
    """Make ``name`` a tenant whose requests of ``gpu=1`` are accepted and never admitted by
    a running server's admission loop: a budget of one gpu-second an hour, and a default
    max-runtime of an hour that every request reserves (budget_exhausted; budgets are
    not judged at submit). A cost above a tenant's quota, or above what a cohort member's
    room could ever hold, is refused at submit (docs/decisions/809, 824)."""
    answer = admin.put(f"/v1/tenants/{name}", json={
        "quota": {"gpu": 1}, "budget": {"gpu": "1s/1h"}, "default_max_runtime": 3600})
    assert answer.status_code == 200, answer.text


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def serving(app: object, *, threads: int | None = None) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread (so the test can hold its hooks); its URL.

    ``threads``: run it as ``quotagate serve --db-connections`` does, through
    ``run_server`` with AnyIO's worker threads bounded to that many."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    run = server.run if threads is None else functools.partial(run_server, server, threads)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    until = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > until or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
