"""The registry itself: built-in backends, registration rules and service requirements."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from statekeeper.stores import Store
from statekeeper.testing import (
    BACKENDS,
    BackendContext,
    backend,
    require_service,
    services_required,
    tcp_reachable,
)
from statekeeper.testing.spec.support import ALL_BACKENDS


def test_builtin_backends_are_registered() -> None:
    assert tuple(BACKENDS)[: len(ALL_BACKENDS)] == ALL_BACKENDS


def test_a_name_can_be_registered_only_once() -> None:
    async def factory(ctx: BackendContext) -> AsyncIterator[Store]:
        raise AssertionError("never opened")
        yield

    with pytest.raises(ValueError, match="already registered"):
        backend("memory")(factory)
    with pytest.raises(ValueError, match="must be letters"):
        backend("bad name")(factory)
    assert "bad name" not in BACKENDS


@pytest.mark.parametrize(
    ("environ", "required"),
    [
        ({}, False),
        ({"CI": "false"}, False),
        ({"CI": ""}, False),
        ({"STATEKEEPER_REQUIRE_SERVICES": "0"}, False),
        ({"CI": "true"}, True),
        ({"CI": "TRUE"}, True),
        ({"CI": "1"}, True),
        ({"STATEKEEPER_REQUIRE_SERVICES": "1"}, True),
        ({"CI": "false", "STATEKEEPER_REQUIRE_SERVICES": "1"}, True),
    ],
)
def test_services_required_follows_the_environment(environ: dict[str, str], required: bool) -> None:
    assert services_required(environ) is required


def test_missing_service_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("STATEKEEPER_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis backend unavailable: no server"):
        require_service("redis", "no server at localhost:6379")


@pytest.mark.parametrize("variable", ["CI", "STATEKEEPER_REQUIRE_SERVICES"])
def test_missing_service_fails_when_services_are_required(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("STATEKEEPER_REQUIRE_SERVICES", raising=False)
    monkeypatch.setenv(variable, "true" if variable == "CI" else "1")
    with pytest.raises(pytest.fail.Exception, match="postgres backend unavailable: down"):
        require_service("postgres", "down")


async def test_tcp_reachable_tells_a_listening_server_from_a_closed_port() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await tcp_reachable("127.0.0.1", port)
    finally:
        server.close()
        await server.wait_closed()
    closed = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    closed_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    assert not await tcp_reachable("127.0.0.1", closed_port, seconds=2.0)
