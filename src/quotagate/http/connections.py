"""How many HTTP calls ``serve`` runs at once: as many as its database pool leaves free.

FastAPI runs every sync endpoint on one of AnyIO's worker threads, 40 by default,
and nearly every call checks out a database connection. With a pool smaller than
that, the calls beyond it wait inside the pool's checkout, where nothing orders
them and, past ``pool_timeout``, the call fails with 503 ``store_busy``. So
``serve`` keeps a fixed pool (``--db-connections``) and bounds AnyIO's worker
threads to what the pool leaves once its own threads have theirs: an extra call
waits on the event loop, costs nothing there, and starts as soon as a thread is
free (docs/decisions/314-serve-connection-pool.md).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from quotagate.errors import InvalidInput

if TYPE_CHECKING:
    import uvicorn

DEFAULT_CONNECTIONS = 20

# Connections serve's own threads can hold at once beside the HTTP calls. With
# workers: the admission loop keeps one between passes (store/kept_connection.py)
# and checks out a second for its expiry pass; its wait observer; the dispatcher,
# its batch writer and its outcome thread (docs/decisions/260); the group release,
# which writes the ends of /complete calls. The retention loop, when on, one more.
# Without workers: the group release.
_WORKER_CONNECTIONS = 7
_API_ONLY_CONNECTIONS = 1
_RETENTION_CONNECTIONS = 1


def reserved_connections(*, workers: bool, retention: bool) -> int:
    """The pool's connections that serve's own threads may hold, not left to HTTP calls."""
    if not workers:
        return _API_ONLY_CONNECTIONS
    return _WORKER_CONNECTIONS + (_RETENTION_CONNECTIONS if retention else 0)


def http_threads(connections: int, *, workers: bool, retention: bool) -> int:
    """HTTP calls run at once with a pool of ``connections``; InvalidInput if it is too small."""
    reserved = reserved_connections(workers=workers, retention=retention)
    if connections <= reserved:
        raise InvalidInput(
            f"{connections} database connections leave none for HTTP calls: serve's own "
            f"threads hold up to {reserved}; give at least {reserved + 1}",
            code="invalid_connections",
        )
    return connections - reserved


def run_server(server: uvicorn.Server, threads: int) -> None:
    """``server.run()``, with AnyIO's worker threads for sync endpoints bounded to ``threads``.

    The limit belongs to the event loop (an AnyIO run variable), so it is set on the
    loop uvicorn serves from, before the first call arrives.
    """

    async def serve() -> None:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        await server.serve()

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(serve())
