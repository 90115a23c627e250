"""One error root for quotagate; adapters translate it at their edge.

Every error carries a machine-readable ``code``, a human sentence and the HTTP
status that fits, so the CLI and the HTTP API can report it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "Conflict",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "QuotagateError",
    "RateLimited",
    "StaleGeneration",
    "StoreUnavailable",
    "Unauthorized",
    "quoted",
    "with_hint",
]


class QuotagateError(Exception):
    """Root of every error quotagate raises on purpose."""

    status: int = 500
    default_code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.fields = fields

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.fields}


class InvalidInput(QuotagateError):
    """The caller sent something malformed; nothing was changed."""

    status = 400
    default_code = "invalid_input"


class NotFound(QuotagateError):
    status = 404
    default_code = "not_found"


class Conflict(QuotagateError):
    """The request contradicts what the ledger already holds."""

    status = 409
    default_code = "conflict"


class RateLimited(QuotagateError):
    """A rate quota refused the submission; ``retry_after`` is in seconds."""

    status = 429
    default_code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float, **fields: Any) -> None:
        super().__init__(message, retry_after=retry_after, **fields)
        self.retry_after = retry_after


class StaleGeneration(QuotagateError):
    """A fenced write was refused because a newer lease generation exists."""

    status = 409
    default_code = "stale_generation"


class Unauthorized(QuotagateError):
    status = 401
    default_code = "unauthorized"


class Forbidden(QuotagateError):
    status = 403
    default_code = "forbidden"


class StoreUnavailable(QuotagateError):
    """The ledger database (or Redis) cannot be reached."""

    status = 503
    default_code = "store_unavailable"


# What an error message quotes of a caller's value, at most (docs/decisions/811).
MAX_QUOTED = 80


def quoted(value: object) -> str:
    """``repr(value)`` for an error message, cut after :data:`MAX_QUOTED` characters.

    A refusal names what it refuses, but a 100 kB bad field must not come back whole
    in the answer, the CLI's stderr and every log line that quotes the error.
    """
    text = repr(value)
    if len(text) <= MAX_QUOTED:
        return text
    size = len(value) if isinstance(value, str | bytes) else len(text)
    return f"{text[:MAX_QUOTED]}… ({size} characters)"


def with_hint(
    error: QuotagateError, hints: Mapping[str, Callable[[QuotagateError], str]]
) -> QuotagateError:
    """The same error, its sentence ending with ``(hint)`` where ``hints`` has one for its
    code: how the surface that answers (a CLI option, a JSON field) sets what was missing.
    The store's sentence names neither."""
    hint = hints.get(error.code)
    if hint is None:
        return error
    return type(error)(f"{error.message} ({hint(error)})", code=error.code, **error.fields)
