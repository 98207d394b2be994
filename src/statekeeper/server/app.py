"""The FastAPI application: lifespan (the store), error answers, routers, CORS, the UI."""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.server.context import ServerContext
from statekeeper.server.errors import (
    ERROR_RESPONSES,
    error_body,
    redact,
    status_of,
    store_locations,
)
from statekeeper.server.limits import DEFAULT_MAX_BODY_BYTES, BodyLimit
from statekeeper.server.links import add_id_patterns, add_links
from statekeeper.server.streams import EventHub, feed_of
from statekeeper.server.takeover import taking_over
from statekeeper.stores import open_store

__all__ = ["ServerConfig", "check_host", "create_app"]

_log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"


@dataclass(frozen=True)
class ServerConfig:
    """How to run a server (what ``statekeeper serve`` takes)."""

    store: str
    app: str | None = None
    """``MODULE:ATTR`` of a ``(store, tenant) -> Runner`` factory (as ``runs resume --app``)."""
    factory: Callable[..., Any] | None = None
    """The loaded factory of ``app`` (loaded by the caller, who reports a bad one)."""
    dev_anonymous: bool = False
    cors_origins: Sequence[str] = field(default_factory=tuple)
    poll_interval: float = 0.25
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """A request body over this is a 413, refused before it is read (and before auth)."""
    shutdown_grace: float = 10.0
    """Seconds a stopping server lets the runs it drives finish before it releases them."""
    take_over: float | None = None
    """Every so many seconds, resume the runs whose driver went away (needs ``app``; see
    `statekeeper.server.takeover`). None: never by itself."""


def check_host(host: str, dev_anonymous: bool) -> None:
    """Refuse ``--dev-anonymous`` on anything but a loopback address."""
    if not dev_anonymous:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise InvalidInputError(
            f"--dev-anonymous serves without keys, so it binds loopback only, not {host!r}; "
            "use --host 127.0.0.1, or create keys (statekeeper keys create) and drop the flag"
        )


def _errors(app: FastAPI, locations: Sequence[str]) -> None:
    @app.exception_handler(StatekeeperError)
    async def typed(request: Request, exc: StatekeeperError) -> JSONResponse:
        status = status_of(exc)
        message = str(exc)
        if status >= 500:
            _log.warning("%s %s failed: %s", request.method, request.url.path, message)
            message = redact(message, locations)
        return JSONResponse(error_body(type(exc).__name__, message), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        from statekeeper.server.auth import authenticate

        try:  # FastAPI reads the body before the key: a caller with no key learns only that
            await authenticate(request)
        except StatekeeperError as error:
            return JSONResponse(error_body(type(error).__name__, str(error)), status_of(error))
        parts = [
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        ]
        message = "; ".join(parts) or "the request does not match the API"
        return JSONResponse(error_body("InvalidInputError", message), status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: logged with its traceback, answered without one.
        _log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        body = error_body("InternalServerError", "the server failed; see its log")
        return JSONResponse(body, status_code=500)

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException) -> JSONResponse:
        name = "NotFoundError" if exc.status_code == 404 else "InvalidInputError"
        status = 422 if exc.status_code == 400 else exc.status_code  # a body that is not JSON
        return JSONResponse(
            error_body(name, str(exc.detail)), status_code=status, headers=exc.headers
        )


def create_app(config: ServerConfig) -> FastAPI:
    """The server's application; the store opens when it starts and closes when it stops."""
    from statekeeper.server import (
        routes_checkpoints,
        routes_control,
        routes_health,
        routes_memories,
        routes_runs,
        routes_runtime,
        routes_sessions,
        routes_stream,
    )

    locations = store_locations(config.store)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await open_store(config.store)
        hub = EventHub(store, config.poll_interval, feed_of(store, config.store))
        context = ServerContext(
            store,
            hub,
            config.factory,
            config.app,
            anonymous=config.dev_anonymous,
            locations=locations,
            shutdown_grace=config.shutdown_grace,
        )
        app.state.context = context
        try:
            async with taking_over(context, config.take_over if config.factory else None):
                yield
        finally:
            await context.aclose()

    app = FastAPI(
        title="statekeeper",
        summary="Sessions, runs, approvals and live events of statekeeper agents.",
        version="1",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    _errors(app, locations)
    # Requests are matched against the routes in order: the sessions' (a conversation's
    # appends and reads, the busiest) come first.
    modules = (routes_sessions, routes_runs, routes_checkpoints, routes_control, routes_runtime)
    for module in (*modules, routes_memories, routes_stream, routes_health):
        app.include_router(module.router, prefix=API_PREFIX, responses=ERROR_RESPONSES)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)  # inside CORS: errors readable
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    _mount_ui(app)
    _describe(app)
    return app


def _describe(app: FastAPI) -> None:
    """FastAPI's OpenAPI description, with the links between operations and the form
    of ids (`add_links`, `add_id_patterns`)."""
    generate = app.openapi

    def described() -> dict[str, Any]:
        if app.openapi_schema is None:
            add_id_patterns(add_links(generate()))
        return app.openapi_schema or generate()

    app.openapi = described  # type: ignore[method-assign]


def _mount_ui(app: FastAPI) -> None:
    try:  # by name: the UI package is built apart from the API
        ui = importlib.import_module("statekeeper.server.ui")
    except ImportError:  # the control UI is not in this build
        return
    mount = getattr(ui, "mount_ui", None)
    if mount is not None:
        mount(app)
