"""Each ``serve --tour`` run shows a new admin token and revokes the ones earlier tours showed."""

from __future__ import annotations

import pytest

from quotagate import Quotagate
from quotagate.errors import Unauthorized
from quotagate.tour import tour_token


def test_a_tour_token_replaces_earlier_tours_tokens_and_nothing_else(gate: Quotagate) -> None:
    own = gate.create_api_token(admin=True, label="ops", actor="test").token
    first, replaced_first = tour_token(gate)
    second, replaced_second = tour_token(gate)
    assert (replaced_first, replaced_second) == (0, 1)
    with pytest.raises(Unauthorized):
        gate.authenticate(first)
    assert gate.authenticate(second).admin
    assert gate.authenticate(own).admin  # not the tour's: untouched
    live = [info for info in gate.list_api_tokens() if info.revoked is None]
    assert sorted(info.label or "" for info in live) == ["ops", "tour"]
