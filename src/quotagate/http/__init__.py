"""The HTTP API (FastAPI), versioned under ``/v1``; needs the ``server`` extra.

``create_app(gate)`` builds the application; ``quotagate serve`` runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quotagate.http.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Imported on first use so that `import quotagate.http` alone never needs FastAPI.
    if name == "create_app":
        try:
            from quotagate.http.app import create_app
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"the HTTP API needs {exc.name}: pip install 'quotagate[server]'"
            ) from exc
        return create_app
    raise AttributeError(name)
