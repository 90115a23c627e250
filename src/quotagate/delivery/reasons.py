"""What a delivery error may say, and to whom (docs/decisions/214).

A target's error text is for operators: it names URLs, hosts and paths. It
goes to logs and admin views (the outbox's ``last_error``) only after
``redact_text`` removed ``user:password@`` and query-string values. What a
tenant sees (the request's ``reason``, its audit entries) is a short generic
sentence: a target error's ``public`` field (``webhook answered 500``), else
its code.
"""

from __future__ import annotations

import re

from quotagate.errors import QuotagateError

__all__ = ["public_reason", "redact_text"]

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@")
_QUERY_VALUE = re.compile(r"(?P<key>[?&][^=&#\s]+)=[^&#\s]*")


def redact_text(text: str) -> str:
    """``text`` without credentials in URLs or values in query strings."""
    text = _USERINFO.sub(r"\g<scheme>", text)
    return _QUERY_VALUE.sub(r"\g<key>=***", text)


def public_reason(error: BaseException) -> str:
    """A tenant-safe sentence for a delivery error."""
    if isinstance(error, QuotagateError):
        public = error.fields.get("public")
        if isinstance(public, str) and public:
            return public
        return error.code.replace("_", " ")
    return "internal error"
