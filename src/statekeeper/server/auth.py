"""Who is calling: the API key of a request, its tenant and scope (FastAPI dependencies)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from statekeeper.server.context import ServerContext
from statekeeper.server.errors import AuthenticationError, PermissionDeniedError
from statekeeper.server.keys import SCOPES, Scope

__all__ = ["ANONYMOUS_TENANT", "Caller", "authenticate", "context_of", "require"]

ANONYMOUS_TENANT = "default"
_bearer = HTTPBearer(auto_error=False, description="An API key: `statekeeper keys create`.")


@dataclass(frozen=True)
class Caller:
    """The tenant and scope a request acts as, and the key that says so."""

    tenant: str
    scope: Scope
    key_id: str | None

    @property
    def decided_by(self) -> str:
        """What a decision records as its author."""
        return f"key:{self.key_id}" if self.key_id else "anonymous"


async def context_of(request: Request) -> ServerContext:
    """The server's shared context (a coroutine: FastAPI runs a plain ``def`` dependency
    in its thread pool, a hop per request)."""
    context: ServerContext = request.app.state.context
    return context


async def _caller(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Caller:
    context: ServerContext = request.app.state.context
    if context.anonymous:
        return Caller(ANONYMOUS_TENANT, "admin", None)
    presented = credentials.credentials if credentials is not None else None
    if presented is None and request.url.path.endswith("/stream"):
        presented = request.query_params.get("key")  # EventSource cannot send headers
    if not presented:
        raise AuthenticationError(
            "this API needs a key: send `Authorization: Bearer <key>` (create one with "
            "`statekeeper keys create --tenant T --scope read`)"
        )
    key = await context.keys.verify(presented)
    return Caller(key.tenant, key.scope, key.key_id)


async def authenticate(request: Request) -> Caller:
    """The caller of ``request``, or `AuthenticationError`: for answers given before the
    route's dependencies run (a body that is not JSON is refused before them)."""
    return await _caller(request, await _bearer(request))


def require(scope: Scope) -> Callable[..., Awaitable[Caller]]:
    """A dependency: the caller, if its key's scope includes ``scope``."""

    async def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Caller:
        caller = await _caller(request, credentials)
        if SCOPES.index(caller.scope) < SCOPES.index(scope):
            raise PermissionDeniedError(
                f"this needs an API key with scope {scope!r}; this key has {caller.scope!r}"
            )
        return caller

    return check


Reader = Annotated[Caller, Depends(require("read"))]
Operator = Annotated[Caller, Depends(require("operate"))]
Admin = Annotated[Caller, Depends(require("admin"))]
Context = Annotated[ServerContext, Depends(context_of)]
