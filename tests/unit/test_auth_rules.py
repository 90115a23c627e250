"""The default authorization rule and the token format, without a database."""

from __future__ import annotations

import pytest

from quotagate.auth import authorizer as operations
from quotagate.auth.authorizer import Actor, default_authorizer
from quotagate.auth.tokens import hash_secret, parse_token
from quotagate.errors import Unauthorized

ADMIN = Actor(token_id="a1", admin=True)
TEAM_A = Actor(token_id="b2", admin=False, tenant="team-a")


@pytest.mark.parametrize("operation", sorted(operations.OPERATIONS))
def test_an_admin_may_do_everything(operation: str) -> None:
    assert default_authorizer("team-b", ADMIN, operation)
    assert default_authorizer(None, ADMIN, operation)


@pytest.mark.parametrize("operation", sorted(operations.OPERATIONS - operations.ADMIN_OPERATIONS))
def test_a_tenant_token_acts_on_its_own_tenant_only(operation: str) -> None:
    assert default_authorizer("team-a", TEAM_A, operation)
    assert not default_authorizer("team-b", TEAM_A, operation)


@pytest.mark.parametrize("operation", sorted(operations.ADMIN_OPERATIONS))
def test_admin_operations_need_an_admin(operation: str) -> None:
    assert not default_authorizer("team-a", TEAM_A, operation)
    assert not default_authorizer(None, TEAM_A, operation)


def test_platform_wide_reads_are_left_to_the_http_layer_to_narrow() -> None:
    assert default_authorizer(None, TEAM_A, operations.USAGE_READ)
    assert default_authorizer(None, TEAM_A, operations.AUDIT_READ)
    assert not default_authorizer(None, TEAM_A, operations.REQUEST_LIST)


def test_a_token_splits_into_id_and_secret() -> None:
    assert parse_token("qg_0a1b_se_cr-et") == ("0a1b", "se_cr-et")


@pytest.mark.parametrize(
    "text", ["", "qg", "qg_", "qg_abc", "qg__secret", "xx_abc_secret", "qg_ABC_secret",
             "qg_ab c_secret", "qg_" + "a" * 33 + "_secret", "qg_abc_" + "s" * 257],
)
def test_malformed_tokens_are_unauthorized(text: str) -> None:
    with pytest.raises(Unauthorized):
        parse_token(text)


def test_the_stored_hash_is_sha256_hex() -> None:
    assert hash_secret("secret") == (
        "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
    )
