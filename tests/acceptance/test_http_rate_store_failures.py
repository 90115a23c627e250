"""``serve --rate-store redis://…``: a failing Redis is a 503 ``rate_store_unavailable``."""

from __future__ import annotations

from pathlib import Path

import httpx
import redis

from quotagate import Quotagate
from quotagate.rate.keys import BucketKey, redis_key
from support.databases import fresh_database
from support.http_servers import bearer, make_token, running_server
from support.redis_servers import RedisServer


def test_serve_takes_its_rate_store_option_and_answers_503_for_every_redis_failure(
    tmp_path: Path,
) -> None:
    server_directory = tmp_path / "redis"
    server_directory.mkdir()
    store = RedisServer(server_directory)
    store.start()
    try:
        with fresh_database("sqlite", tmp_path) as db_url:
            with Quotagate.connect(db_url, rate_store=store.url) as gate:
                gate.set_pool("pool-1", {"gpu": 100})
                gate.set_tenant("team-a", {"gpu": 100})
                gate.set_rate("team-a", {"capacity": 100, "refill_per_second": 0})
            headers = bearer(make_token(db_url))
            client = redis.Redis.from_url(store.url)
            with running_server(db_url, tmp_path, args=["--rate-store", store.url]) as serve:
                def submit(request_id: str) -> httpx.Response:
                    return httpx.post(f"{serve.url}/v1/tenants/team-a/requests", headers=headers,
                                      json={"id": request_id, "cost": {"gpu": 1}}, timeout=30)

                assert submit("job-ok").status_code == 202
                assert client.hget(redis_key(BucketKey("team-a")), "tokens") == b"99"

                def refused(request_id: str, words: str) -> None:
                    response = submit(request_id)
                    assert response.status_code == 503, response.text
                    body = response.json()
                    assert body["code"] == "rate_store_unavailable"
                    assert words in body["message"]
                    missing = httpx.get(f"{serve.url}/v1/tenants/team-a/requests/{request_id}",
                                        headers=headers, timeout=30)
                    assert missing.status_code == 404

                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", 1)
                refused("job-oom", "OOM")
                client.config_set("maxmemory", 0)

                client.rename(redis_key(BucketKey("team-a")), "saved")
                client.set(redis_key(BucketKey("team-a")), "not a bucket")
                refused("job-wrongtype", "WRONGTYPE")
                client.delete(redis_key(BucketKey("team-a")))
                client.rename("saved", redis_key(BucketKey("team-a")))
                assert submit("job-ok-again").status_code == 202

                store.kill()
                refused("job-refused", "cannot be reached")
    finally:
        store.kill()
