"""``/api/v1/healthz`` and ``/api/v1/readyz``: for a load balancer or an orchestrator.

Neither takes a key nor says anything about the data: ``healthz`` answers while the
process serves; ``readyz`` answers 200 once the store answers a read and, when the store
has an event feed (PostgreSQL ``LISTEN/NOTIFY``, Redis), the feed listens, and 503 with
the reason otherwise, and from the moment the server starts shutting down.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from statekeeper.errors import NotFoundError
from statekeeper.server.context import ServerContext
from statekeeper.server.errors import redact

__all__ = ["router"]

router = APIRouter(tags=["health"])

PROBE_SECONDS = 5.0
"""How long the store and the feed each get to answer a readiness check."""
_PROBE_TENANT = "statekeeper-readyz"


@router.get("/healthz", responses={200: {"description": "the process is up"}})
async def healthz() -> dict[str, Any]:
    """The process is up and serving (no key; says nothing about the store)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"description": "ready: the store answers and the feed listens"},
        503: {"description": "not ready: the reason (store, feed, or shutting down)"},
    },
)
async def readyz(request: Request) -> JSONResponse:
    """Ready to take requests: the store answers and the event feed (if any) listens.
    503 with the reason otherwise (no key; no data)."""
    context: ServerContext | None = getattr(request.app.state, "context", None)
    if context is None:
        return _not_ready("starting", "the store is not open yet")
    if context.closing:
        return _not_ready("shutting down", "the server is shutting down")
    checks: dict[str, str] = {}
    problem = await _store_problem(context)
    checks["store"] = problem or "ok"
    if context.hub.feed is None:
        checks["feed"] = "none (the server polls the store)"
    else:
        feed_problem = await _feed_problem(context)
        checks["feed"] = feed_problem or "ok"
        problem = problem or feed_problem
    if problem is not None:
        return _not_ready(problem, problem, checks)
    return JSONResponse({"status": "ready", "checks": checks})


def _not_ready(status: str, reason: str, checks: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"status": "not ready", "reason": reason}
    if checks is not None:
        body["checks"] = checks
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})


async def _store_problem(context: ServerContext) -> str | None:
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            await context.store.get_session(_PROBE_TENANT, "readyz")
    except NotFoundError:
        return None  # the store answered
    except TimeoutError:
        return f"store: no answer within {PROBE_SECONDS:g} s"
    except Exception as exc:  # any failure is the answer here, not a 500
        return redact(f"store: {type(exc).__name__}: {exc}", context.locations)
    return None


async def _feed_problem(context: ServerContext) -> str | None:
    """Whether the feed listens: its first notice (a resync) comes once it does."""
    feed = context.hub.feed
    assert feed is not None
    notices = feed.notices(_PROBE_TENANT)
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            await anext(aiter(notices))
    except TimeoutError:
        return f"feed: not listening within {PROBE_SECONDS:g} s"
    except Exception as exc:
        return redact(f"feed: {type(exc).__name__}: {exc}", context.locations)
    finally:
        aclose = getattr(notices, "aclose", None)
        if aclose is not None:
            await aclose()
    return None
