"""The store goes away mid-run: the API answers 503, and the ledger is consistent after.

The shared PostgreSQL must keep running for everyone else, so the outage is a
TCP proxy between `serve` and PostgreSQL that this test kills and restarts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from support.databases import fresh_database
from support.http_servers import bearer, make_token, running_server

DEADLINE = 60.0


class TcpProxy:
    """Forwards 127.0.0.1:port to an upstream; ``stop`` cuts every connection at once."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.stopped:
                    client.close()
                    server.close()
                    return
                self.sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            sockets, self.sockets = self.sockets, []
        self.listener.close()
        for end in sockets:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()
        self.thread.join(5)


def poll(check: object, what: str) -> None:
    until = time.monotonic() + DEADLINE
    while not check():  # type: ignore[operator]
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.postgresql
def test_store_outage_gives_503_and_the_ledger_recovers_consistent(tmp_path: Path) -> None:
    with fresh_database("postgresql", tmp_path) as db_url:
        url = sa.engine.make_url(db_url)
        proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
        proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
        token = make_token(db_url)
        headers = bearer(token)
        try:
            with running_server(proxied, tmp_path) as server, httpx.Client(
                base_url=server.url, headers=headers, timeout=30
            ) as client:
                client.put("/v1/pools/main", json={"capacity": {"gpu": 3}}).raise_for_status()
                client.put("/v1/tenants/team-a", json={"quota": {"gpu": 2}}).raise_for_status()
                requests = "/v1/tenants/team-a/requests"
                for n in range(3):
                    client.post(requests, json={"id": f"before-{n}", "cost": {"gpu": 1}})

                proxy.stop()
                attempts: list[httpx.Response] = []

                def refused() -> bool:
                    response = client.post(
                        requests, json={"id": f"during-{len(attempts)}", "cost": {"gpu": 1}}
                    )
                    attempts.append(response)
                    return response.status_code == 503

                poll(refused, "a 503 while the store is down")
                assert attempts[-1].json()["code"] == "store_unavailable"
                ready = client.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["code"] == "store_unavailable"
                assert client.get(f"{requests}/before-0").status_code == 503
                assert client.post(f"{requests}/before-0/cancel").status_code == 503
                assert httpx.get(f"{server.url}/healthz").status_code == 200, "the process lives"
                metrics = httpx.get(f"{server.url}/metrics")
                assert metrics.status_code == 200
                assert "quotagate_store_up 0.0" in metrics.text

                proxy = TcpProxy(proxy.upstream, proxy.port)
                poll(lambda: client.get("/readyz").status_code == 200, "readiness after the outage")
                after = client.post(requests, json={"id": "after", "cost": {"gpu": 1}})
                assert after.status_code == 202, after.text
                # The request refused during the outage can be sent again (its first
                # try may or may not have committed before the cut: 202 or 200).
                retry = client.post(requests, json={"id": "during-0", "cost": {"gpu": 1}})
                assert retry.status_code in (200, 202), retry.text

                def used() -> int:
                    return int(client.get("/v1/tenants/team-a").json()["quota"]["gpu"]["used"])

                # Free the quota the requests admitted before the outage hold; the
                # admission loop, which kept running through the outage, must refill it.
                poll(lambda: used() == 2, "the first admissions")
                held = [item["id"] for item in client.get(requests).json()["requests"]
                        if item["state"] in ("reserved", "delivered")]
                assert len(held) == 2
                for request_id in held:
                    done = client.post(f"{requests}/{request_id}/complete")
                    # 202: a delivery attempt had begun (this server has no target), so
                    # the admin's complete is a stop its worker confirms (decisions 819, 821).
                    assert (done.status_code, done.json()["released"]) in (
                        (200, {"gpu": 1}), (202, {})), done.text

                def ended() -> bool:
                    return all(client.get(f"{requests}/{request_id}").json()["state"] == "completed"
                               for request_id in held)

                poll(ended, "the held requests to end")
                poll(lambda: used() == 2, "admission to resume after the outage")
                assert not set(held) & {
                    item["id"] for item in client.get(requests).json()["requests"]
                    if item["state"] in ("reserved", "delivered")
                }
                status = server.stop()
            assert status == 0, server.log()
        finally:
            proxy.stop()
        with Quotagate.connect(db_url) as gate:
            assert gate.check_invariants() == []
            states = {row["id"]: row["state"] for row in gate.inspect(limit=100)["requests"]}
            assert {"before-0", "before-1", "before-2", "after", "during-0"} <= set(states)
