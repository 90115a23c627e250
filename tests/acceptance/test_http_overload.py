"""When every pooled database connection stays busy, the API answers 503, not 500."""

from __future__ import annotations

from pathlib import Path

import httpx

from quotagate import Quotagate
from quotagate.http import create_app
from quotagate.store.engine import create_engine
from support.databases import fresh_database
from support.http_servers import bearer, make_token, serving


def test_an_exhausted_connection_pool_is_503_store_busy(tmp_path: Path) -> None:
    with fresh_database("sqlite", tmp_path) as db_url:
        token = make_token(db_url)
        engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
        with Quotagate(engine) as gate, serving(create_app(gate)) as url:
            assert httpx.get(f"{url}/v1/usage", headers=bearer(token)).status_code == 200
            held = engine.connect()
            try:
                busy = httpx.get(f"{url}/v1/usage", headers=bearer(token))
            finally:
                held.close()
            assert busy.status_code == 503
            assert busy.json()["code"] == "store_busy"
            assert httpx.get(f"{url}/v1/usage", headers=bearer(token)).status_code == 200
