"""Refuse request bodies above a size limit before anything parses them.

A pure ASGI middleware: it reads the body itself (at most ``limit`` bytes plus
one chunk), answers 413 when it is too large, and otherwise hands the buffered
body on. Checking Content-Length alone would miss chunked uploads.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# The scope key of the whole body once it is read (http/hot_routes.py parses it there).
BUFFERED_BODY = "quotagate.body"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, limit: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await self._refuse(send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away before sending the whole body.
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = scope[BUFFERED_BODY] = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body: dict[str, Any] = {
            "code": "body_too_large",
            "message": f"the request body is larger than {self.limit} bytes",
        }
        payload = json.dumps(body).encode()
        await send({
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                        (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": payload})
