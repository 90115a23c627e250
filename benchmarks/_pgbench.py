"""The admission transaction run by pgbench: the C client's rate on PostgreSQL.

The Python raw transaction (``_raw_admission.py``) pays for Python and the
driver; pgbench pays for neither, so its rate is what PostgreSQL itself allows
one request per transaction on this machine. The script is the raw
transaction without its Python parts: lock the first waiting request of a
random tenant (``FOR UPDATE SKIP LOCKED``, through the same index), charge its
gpu and cpu on the tenant and on one pool with conditional UPDATEs, mark it
reserved, insert its outbox row, commit. There is no fit check and no best fit
(no Python to run them): every request goes to ``pool-1``, whose caps the
benchmark's queue never reaches. Prepared statements (``-M prepared``), the
same server settings as everyone (nothing about durability is changed).

``pgbench`` comes from Debian's ``postgresql-client`` (``which pgbench``); without it
the rows say so and the benchmark goes on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.engine import make_url

SCRIPT = r"""
\set tenant random(1, {tenants})
BEGIN;
SELECT id AS request_id, tenant AS request_tenant,
       COALESCE((cost::json->>'gpu')::bigint, 0) AS gpu,
       COALESCE((cost::json->>'cpu')::bigint, 0) AS cpu
  FROM qg_request
 WHERE tenant = 'team-' || chr(96 + :tenant) AND state = 'waiting'
 ORDER BY queue_key, created, id LIMIT 1 FOR UPDATE SKIP LOCKED \gset
UPDATE qg_tenant_quota SET used = used + :gpu
 WHERE tenant = :request_tenant AND resource = 'gpu' AND used + :gpu <= cap;
UPDATE qg_tenant_quota SET used = used + :cpu
 WHERE tenant = :request_tenant AND resource = 'cpu' AND used + :cpu <= cap;
UPDATE qg_pool_capacity SET used = used + :gpu
 WHERE pool = 'pool-1' AND resource = 'gpu' AND used + :gpu <= cap;
UPDATE qg_pool_capacity SET used = used + :cpu
 WHERE pool = 'pool-1' AND resource = 'cpu' AND used + :cpu <= cap;
UPDATE qg_request SET state = 'reserved', pool = 'pool-1', updated = extract(epoch from now())
 WHERE id = :request_id AND state = 'waiting';
INSERT INTO qg_outbox (request_id, tenant, target, created, attempts, next_attempt_at, delivered)
VALUES (:request_id, :request_tenant, NULL, extract(epoch from now()), 0,
        extract(epoch from now()), false);
END;
"""

_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")


class PgbenchUnavailable(Exception):
    """pgbench is not installed."""


def available() -> bool:
    return shutil.which("pgbench") is not None


def run(
    url: str, tenants: Sequence[str], clients: int, *, seconds: float | None = None,
    transactions: int | None = None,
) -> float:
    """Transactions per second of the admission script with ``clients`` connections.

    Give ``seconds`` (a timed burst) or ``transactions`` per client (a drain).
    The tenants must be named ``team-a``, ``team-b``, … as in benchmarks/admit.py.
    """
    if not available():
        raise PgbenchUnavailable("pgbench is not installed (Debian: postgresql-client)")
    expected = [f"team-{chr(97 + index)}" for index in range(len(tenants))]
    if list(tenants) != expected:
        raise ValueError(f"pgbench's script expects tenants {expected}, not {list(tenants)}")
    parsed = make_url(url)
    with tempfile.TemporaryDirectory(prefix="quotagate-pgbench-") as directory:
        script = Path(directory) / "admit.sql"
        script.write_text(SCRIPT.replace("{tenants}", str(len(tenants))))
        command = [
            "pgbench", "--no-vacuum", "--protocol=prepared", f"--file={script}",
            f"--client={clients}", f"--jobs={clients}",
            f"--host={parsed.host or '127.0.0.1'}", f"--port={parsed.port or 5432}",
            f"--username={parsed.username or 'postgres'}",
        ]
        if seconds is not None:
            command.append(f"--time={max(1, round(seconds))}")
        else:
            command.append(f"--transactions={transactions}")
        command.append(parsed.database or "postgres")
        environment = {**os.environ, "PGPASSWORD": parsed.password} if parsed.password else None
        completed = subprocess.run(command, capture_output=True, text=True, check=False,
                                   env=environment)
    match = _TPS.search(completed.stdout)
    if completed.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed ({completed.returncode}): "
                           f"{completed.stderr.strip()[-500:]}")
    return float(match.group(1))
