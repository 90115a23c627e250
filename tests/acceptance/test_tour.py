"""The README's main job: `quotagate serve --tour` on the embedded SQLite default."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from quotagate import Quotagate


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_with_the_tour_takes_requests_from_waiting_to_completed(tmp_path: Path) -> None:
    port = _free_port()
    environment = {key: value for key, value in os.environ.items() if key != "QUOTAGATE_DB"}
    server = subprocess.Popen(
        [sys.executable, "-m", "quotagate.cli", "serve", "--port", str(port), "--tour"],
        cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    finished = threading.Event()

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line.rstrip())
            if "tour: try it yourself" in line or "tour stopped" in line:
                finished.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert finished.wait(timeout=180), "\n".join(lines)
        output = "\n".join(lines)
        assert "tour stopped" not in output, output
        progress = [line for line in lines if line.startswith("  0:")]
        assert progress and progress[-1].split() == [f"{n}:completed" for n in range(6)], output
        assert "export QG_TOKEN=qg_" in output
        # Only the tour's own lines: no line per HTTP call, no migration chatter.
        assert "HTTP Request:" not in output, output
        assert "alembic" not in output.lower(), output
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=90) == 0, "\n".join(lines)
    # The default database is ./quotagate.db, and the tour left a consistent ledger.
    with Quotagate.connect(f"sqlite:///{tmp_path / 'quotagate.db'}") as gate:
        assert gate.check_invariants() == []
        states = {row["state"] for row in gate.inspect(limit=50)["requests"]}
        assert states == {"completed"}
