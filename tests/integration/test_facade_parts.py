"""The facade's stores that only some callers use are built on first use, once (docs/decisions/241)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from quotagate import InvalidInput, Quotagate

_PARTS = ("streams", "dashboard_views", "api_tokens", "targets", "leases")


@pytest.mark.parametrize("part", _PARTS)
def test_threads_asking_at_once_share_one_store(db_url: str, part: str) -> None:
    # The HTTP server's threads may ask for a store first together: streams, the dashboard's
    # history and a token cache hold state, so all of them must get the same one.
    with Quotagate.connect(db_url) as gate:
        start = threading.Barrier(8)
        seen: list[Any] = []

        def ask() -> None:
            start.wait()
            seen.append(getattr(gate, part))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(seen) == 8 and all(store is seen[0] for store in seen)
        assert getattr(gate, part) is seen[0]


def test_a_facade_whose_streams_were_never_used_closes_without_building_them(db_url: str) -> None:
    gate = Quotagate.connect(db_url)
    assert gate.tenants() == []
    gate.close()
    assert "streams" not in gate._parts


def test_a_bad_token_cache_time_is_refused_when_the_facade_is_made(db_url: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        Quotagate.connect(db_url, token_cache_ttl=-1)
    assert refused.value.code == "invalid_token_cache_ttl"
