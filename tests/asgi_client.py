"""An HTTP client on an in-process server (the app's lifespan run, no socket), for
tests outside tests/server that need a request or two. Import as
``from asgi_client import served``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from statekeeper.server import ServerConfig, create_app

__all__ = ["served"]


@asynccontextmanager
async def served(url: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a server on the store at ``url``, sending API key ``key``."""
    app = create_app(ServerConfig(url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=headers
        ) as client:
            yield client
