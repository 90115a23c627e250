"""A SIGTERMed ``quotagate serve`` stops in bounded time (``--exit-grace``).

Real serve processes. Its delivery worker blocked in a database call on a row lock
(PostgreSQL waits for ever, MariaDB for innodb_lock_wait_timeout) used to keep the
process alive for ever after SIGTERM; now it exits ``GRACE_EXPIRED_EXIT`` once the
grace is spent, its lease left in place to expire. Ctrl-C (SIGINT) stops it cleanly.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.cli.stop_signals import GRACE_EXPIRED_EXIT
from quotagate.store import schema
from quotagate.store.lease import LeaseStore
from support.http_servers import start_server
from support.waiting import LOCK_POLL_SECONDS, blocked_by, session_id, wait_for

SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mysql", marks=pytest.mark.mysql)]
LEASE = "worker/w1"
GRACE = 2.0


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_serve_blocked_on_a_row_lock_exits_within_its_grace_and_leaves_its_lease(
    db_url: str, tmp_path: Path
) -> None:
    server = start_server(db_url, tmp_path,
                          args=["--worker-name", "w1", "--exit-grace", str(GRACE)])
    with Quotagate.connect(db_url) as gate:
        leases = LeaseStore(gate.engine)
        wait_for(lambda: leases.get(LEASE) is not None, "serve's worker to take its lease")
        generation = leases.get(LEASE).generation
        with gate.engine.connect() as holder:
            # Another transaction holds the lease row: the worker's next renewal waits on it.
            holder.execute(sa.select(schema.lease).where(schema.lease.c.name == LEASE)
                           .with_for_update())
            holder_id = session_id(holder)
            wait_for(lambda: blocked_by(gate.engine, holder_id) > 0
                     or server.process.poll() is not None,
                     "serve's lease renewal to wait for the lease row", timeout=60,
                     interval=LOCK_POLL_SECONDS)
            assert server.process.poll() is None, server.log()
            signalled = time.monotonic()
            status = server.stop(timeout=60)
            took = time.monotonic() - signalled
            holder.rollback()
        assert status == GRACE_EXPIRED_EXIT, server.log()
        assert took >= GRACE  # it waited its grace for the worker first
        assert "serve did not stop within 2.0 s" in server.log()
        left = leases.get(LEASE)  # not released: it expires, as after a crash
        assert (left.owner, left.generation) == ("w1", generation)


def test_serve_stops_cleanly_on_sigint_and_gives_its_lease_up(tmp_path: Path) -> None:
    server = start_server("", tmp_path, cwd=tmp_path, args=["--worker-name", "w1"])
    url = f"sqlite:///{tmp_path / 'quotagate.db'}"
    with Quotagate.connect(url) as gate:
        leases = LeaseStore(gate.engine)
        wait_for(lambda: leases.get(LEASE) is not None, "serve's worker to take its lease")
        server.process.send_signal(signal.SIGINT)
        assert server.stop() == 0, server.log()
        assert leases.get(LEASE).owner is None  # released on the way out, not left to expire
