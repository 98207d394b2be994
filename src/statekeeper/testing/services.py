"""Backend services (a database server) the suite needs: skip locally, fail under CI.

A backend whose server is not running calls `require_service`: the test is skipped with
the reason, unless ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1`` is set, when it
fails instead, so a CI run cannot go green without having tested the backend.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import NoReturn

__all__ = ["require_service", "services_required", "tcp_reachable"]

_TRUE = {"1", "true", "yes", "on"}


def services_required(environ: Mapping[str, str] | None = None) -> bool:
    """True when a missing backend service must fail the run instead of skipping."""
    env = os.environ if environ is None else environ
    return (
        env.get("CI", "").strip().lower() in _TRUE
        or env.get("STATEKEEPER_REQUIRE_SERVICES", "").strip().lower() in _TRUE
    )


def require_service(name: str, reason: str) -> NoReturn:
    """Stop the current test because backend ``name``'s service is unavailable.

    Skips with ``reason`` normally; fails when ``CI=true`` or
    ``STATEKEEPER_REQUIRE_SERVICES=1`` is set, so a CI run cannot silently miss it.
    """
    import pytest

    message = f"{name} backend unavailable: {reason}"
    if services_required():
        pytest.fail(
            f"{message} (required because CI=true or STATEKEEPER_REQUIRE_SERVICES=1 is set)",
            pytrace=False,
        )
    pytest.skip(f"{message} (set STATEKEEPER_REQUIRE_SERVICES=1 to make this an error)")


_reachable: dict[tuple[str, int], bool] = {}


async def tcp_reachable(host: str, port: int, *, seconds: float = 1.0) -> bool:
    """Whether a TCP server answers at host:port. Cached, so only the first test waits."""
    if (host, port) not in _reachable:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
        except (OSError, TimeoutError):
            _reachable[host, port] = False
        else:
            writer.close()
            await writer.wait_closed()
            _reachable[host, port] = True
    return _reachable[host, port]
