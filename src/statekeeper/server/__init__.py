"""The HTTP server (``statekeeper serve``, extra ``server``): the resource API, live
events over Server-Sent Events, API keys, and the control UI at ``/ui``.

    from statekeeper.server import ServerConfig, create_app
    app = create_app(ServerConfig("sqlite:///state.db"))   # an ASGI app for any server

See docs/server.md for the routes and their JSON.
"""

from __future__ import annotations

from statekeeper.errors import MissingExtraError

try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:
    raise MissingExtraError("the statekeeper server", "server") from exc

from statekeeper.server.app import ServerConfig, check_host, create_app
from statekeeper.server.errors import AuthenticationError, PermissionDeniedError
from statekeeper.server.keys import SCOPES, ApiKey, ApiKeyList, ApiKeys

__all__ = [
    "SCOPES",
    "ApiKey",
    "ApiKeyList",
    "ApiKeys",
    "AuthenticationError",
    "PermissionDeniedError",
    "ServerConfig",
    "check_host",
    "create_app",
]
