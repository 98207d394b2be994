"""Who is calling: the API key of a request, its tenant and scope (FastAPI dependencies)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase
from fastapi.security.utils import get_authorization_scheme_param

from statekeeper.server.context import ServerContext
from statekeeper.server.errors import AuthenticationError, PermissionDeniedError
from statekeeper.server.keys import SCOPES, Scope

__all__ = ["ANONYMOUS_TENANT", "Caller", "authenticate", "context_of", "require"]

ANONYMOUS_TENANT = "default"
_DESCRIPTION = "An API key: `statekeeper keys create`."


@dataclass(frozen=True)
class Caller:
    """The tenant and scope a request acts as, and the key that says so."""

    tenant: str
    scope: Scope
    key_id: str | None
    label: str | None = None

    @property
    def decided_by(self) -> str:
        """What a decision records as its author: the key's label, which a person reads,
        with its id, which stays unique (``Ops Alice (key:k…)``); ``key:<id>`` for a key
        with no label."""
        if not self.key_id:
            return "anonymous"
        return f"{self.label} (key:{self.key_id})" if self.label else f"key:{self.key_id}"


async def context_of(request: Request) -> ServerContext:
    """The server's shared context (a coroutine: FastAPI runs a plain ``def`` dependency
    in its thread pool, a hop per request)."""
    context: ServerContext = request.app.state.context
    return context


EVENT_STREAMS = frozenset({"/api/v1/stream"})
"""The paths whose ``GET`` may take the key as a ``key`` query parameter: the event
streams, which a browser opens with EventSource (it cannot send headers). Anywhere else
a key in a URL would land in logs and histories, so it is not read."""


def _presented(request: Request) -> str | None:
    """The bearer token of ``request`` (as `HTTPBearer` reads it), else, for a ``GET``
    of an event stream, its ``key`` query parameter."""
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    if token and scheme.lower() == "bearer":
        return token
    if request.method == "GET" and request.url.path in EVENT_STREAMS:
        return request.query_params.get("key")
    return None


async def _caller(request: Request) -> Caller:
    context: ServerContext = request.app.state.context
    if context.anonymous:
        return Caller(ANONYMOUS_TENANT, "admin", None)
    presented = _presented(request)
    if not presented:
        raise AuthenticationError(
            "this API needs a key: send `Authorization: Bearer <key>` (create one with "
            "`statekeeper keys create --tenant T --scope read`)"
        )
    key = await context.keys.verify(presented)
    return Caller(key.tenant, key.scope, key.key_id, key.label)


async def authenticate(request: Request) -> Caller:
    """The caller of ``request``, or `AuthenticationError`: for answers given before the
    route's dependencies run (a body that is not JSON is refused before them)."""
    return await _caller(request)


class _Requires(SecurityBase):
    """The dependency `require` makes. It is the OpenAPI bearer scheme itself (a
    `SecurityBase`) rather than a function depending on `HTTPBearer`: FastAPI solves
    each dependency level on every request, and one level costs less than two."""

    def __init__(self, scope: Scope) -> None:
        self.model = HTTPBearerModel(description=_DESCRIPTION)
        self.scheme_name = "HTTPBearer"
        self.scope = scope

    async def __call__(self, request: Request) -> Caller:
        caller = await _caller(request)
        if SCOPES.index(caller.scope) < SCOPES.index(self.scope):
            raise PermissionDeniedError(
                f"this needs an API key with scope {self.scope!r}; this key has {caller.scope!r}"
            )
        return caller


def require(scope: Scope) -> Callable[..., Awaitable[Caller]]:
    """A dependency: the caller, if its key's scope includes ``scope``."""
    return _Requires(scope)


Reader = Annotated[Caller, Depends(require("read"))]
Operator = Annotated[Caller, Depends(require("operate"))]
Admin = Annotated[Caller, Depends(require("admin"))]
Context = Annotated[ServerContext, Depends(context_of)]
