"""Who is calling and what they may do: API tokens and the authorizer hook."""

from quotagate.auth.authorizer import (
    ADMIN_OPERATIONS,
    EXECUTOR_OPERATIONS,
    OPERATIONS,
    Actor,
    Authorizer,
    default_authorizer,
)
from quotagate.auth.tokens import CreatedToken, TokenInfo, TokenStore

__all__ = [
    "ADMIN_OPERATIONS",
    "EXECUTOR_OPERATIONS",
    "OPERATIONS",
    "Actor",
    "Authorizer",
    "CreatedToken",
    "TokenInfo",
    "TokenStore",
    "default_authorizer",
]
