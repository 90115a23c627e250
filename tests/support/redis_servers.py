"""Redis servers of the tests' own: one ``redis-server`` on a free port, or a three-node Cluster.

Flushing, killing and restarting these disturbs nobody else's Redis (the
shared one on 6379 is never flushed).
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from support.databases import unavailable


class RedisServer:
    """A redis-server process of our own: no persistence, killable, restartable on its port."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, options: Sequence[str] = ()) -> None:
        try:
            self.process = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.directory), *options],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        except FileNotFoundError as error:
            unavailable("redis-server", error)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL: the state it held is gone, as in a crash without persistence."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


class SilentServer:
    """A TCP port that accepts connections and never answers: a Redis that hangs.

    It counts the bytes each connection sent, so a test can wait until a
    client is stuck waiting for a reply; :meth:`hang_up` closes every
    connection (the stuck client then sees the connection drop).
    """

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = int(self.listener.getsockname()[1])
        self.received = 0
        self._connections: list[socket.socket] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, query: str = "") -> str:
        return f"redis://127.0.0.1:{self.port}/0" + (f"?{query}" if query else "")

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with self._changed:
                self._connections.append(connection)
            threading.Thread(target=self._swallow, args=(connection,), daemon=True).start()

    def _swallow(self, connection: socket.socket) -> None:
        while True:
            try:
                data = connection.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._changed:
                self.received += len(data)
                self._changed.notify_all()

    def wait_for_bytes(self, count: int, timeout: float = 60.0) -> None:
        """Until clients have sent ``count`` bytes in all (the request they wait on)."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.received >= count, timeout), (
                f"only {self.received} bytes arrived")

    def hang_up(self) -> None:
        with self._changed:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)  # wakes the reader, sends FIN
                connection.close()
            self._connections.clear()

    def close(self) -> None:
        self.listener.close()
        self.hang_up()


def _cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus port (port + 10000) is free and valid too."""
    ports: list[int] = []
    candidate = 20000 + random.randrange(30000)
    while len(ports) < count:
        candidate += 1
        if candidate > 55000:
            candidate = 20000
        probes = [socket.socket(), socket.socket()]
        try:
            for probe, port in zip(probes, (candidate, candidate + 10000), strict=True):
                probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        ports.append(candidate)
    return ports


class RedisCluster:
    """Three redis-server primaries of our own joined into a Redis Cluster."""

    def __init__(self, directory: Path) -> None:
        self.nodes = [RedisServer(directory / f"node-{index}", port)
                      for index, port in enumerate(_cluster_ports(3))]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> None:
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            node.start(["--cluster-enabled", "yes", "--cluster-config-file",
                        str(node.directory / "nodes.conf")])
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{node.port}" for node in self.nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )
        deadline = time.monotonic() + 30
        for node in self.nodes:
            while b"cluster_state:ok" not in subprocess.run(
                ["redis-cli", "-p", str(node.port), "cluster", "info"],
                capture_output=True, timeout=10,
            ).stdout:
                assert time.monotonic() < deadline, "the cluster never became ready"
                time.sleep(0.05)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()



@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real three-primary Redis Cluster for the module (started once: it takes seconds)."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.kill()


@pytest.fixture
def silent_redis() -> Iterator[SilentServer]:
    """A "Redis" that accepts connections and never answers."""
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the module's own: it may be flushed, killed and restarted."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()
