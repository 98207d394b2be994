"""The registry itself: built-in backends, registration rules, capabilities, URL schemes
and service requirements."""

from __future__ import annotations

import asyncio
import importlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import statekeeper.testing.spec as spec
from statekeeper.stores import Store
from statekeeper.testing import (
    BACKENDS,
    BASE,
    DAMAGE,
    JOINT,
    PROCESSES,
    REWRITE,
    SHARED,
    THREADS,
    BackendContext,
    backend,
    needs,
    open_backend,
    require_service,
    services_required,
    tcp_reachable,
    url_backend,
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


def test_a_backend_declares_only_known_capabilities() -> None:
    async def factory(ctx: BackendContext) -> AsyncIterator[Store]:
        raise AssertionError("never opened")
        yield

    with pytest.raises(ValueError, match="unknown capabilities"):
        backend("odd", capabilities={"teleport"})(factory)
    with pytest.raises(ValueError, match="no url function"):
        backend("odd", capabilities={PROCESSES})(factory)
    with pytest.raises(ValueError, match="needs\\(\\) takes capabilities"):
        needs(BASE)
    assert "odd" not in BACKENDS


def test_builtin_capabilities() -> None:
    assert BACKENDS["memory"].capabilities == {REWRITE, THREADS, JOINT}
    assert BACKENDS["memory-sealed"].capabilities == {THREADS, JOINT}
    served = {SHARED, PROCESSES, DAMAGE, REWRITE, THREADS, JOINT}
    for name in (*ALL_BACKENDS[1:], "files", "postgres", "redis", "redis-cluster"):
        # Entries and events in two steps: two files, or two slots of a cluster.
        two_steps = name in ("files", "redis-cluster")
        assert BACKENDS[name].capabilities == served - ({JOINT} if two_steps else set()), name
        sealed = BACKENDS.get(f"{name}-sealed")
        wanted = served - {REWRITE} - ({JOINT} if two_steps else set())
        assert sealed is None or sealed.capabilities == wanted, name
    assert all(b.has(BASE) for b in BACKENDS.values())


def test_a_url_backend_needs_a_known_scheme() -> None:
    with pytest.raises(ValueError, match="no conformance scheme for 'nope'"):
        url_backend("nope", "nope://somewhere", register=False)
    assert "nope" not in BACKENDS


def test_schemes_give_each_store_a_place_of_its_own(tmp_path: Path) -> None:
    def fresh(url: str) -> str:
        ctx = BackendContext("x", tmp_path, "sk0123")
        made = url_backend("x", url, register=False)
        assert made.url is not None
        return made.url(ctx)

    assert fresh("memory://") == "memory://"
    assert fresh("sqlite:///elsewhere/my.db?durability=process") == (
        f"sqlite:///{tmp_path}/my.db?durability=process"
    )
    assert fresh("files:///srv/data") == f"files:///{tmp_path}/data"
    assert (
        fresh("postgresql://u@h:5/db?max_size=2")
        == "postgresql://u@h:5/db?max_size=2&schema=sk0123"
    )
    assert fresh("redis://h:6379/1?prefix=mine") == "redis://h:6379/1?prefix=sk0123"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("scheme", "server"), [("postgresql", "PostgreSQL"), ("redis", "Redis")], ids=str
)
async def test_a_backend_whose_server_is_down_skips_locally_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str, server: str
) -> None:
    port = closed_port()
    down = url_backend("down", f"{scheme}://127.0.0.1:{port}/0", register=False)
    reason = f"backend unavailable: no {server} server reachable at {scheme}://127.0.0.1:{port}/0"
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("STATEKEEPER_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match=reason):
        async with open_backend(down, tmp_path):
            raise AssertionError("opened a store on a closed port")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=reason):
        async with open_backend(down, tmp_path):
            raise AssertionError("opened a store on a closed port")


def test_the_spec_asserts_are_rewritten_for_detailed_failures() -> None:
    for name in ("statekeeper.testing.spec.support", "statekeeper.testing.spec.test_sessions"):
        module = importlib.import_module(name)
        assert type(module.__loader__).__name__ == "AssertionRewritingHook", name


def test_every_spec_module_runs_here() -> None:
    here = Path(__file__).parent
    shims = "\n".join(p.read_text() for p in here.glob("test_*.py"))
    for module in Path(spec.__file__).parent.glob("test_*.py"):
        assert f"from statekeeper.testing.spec.{module.stem} import *" in shims, module.name


def test_spec_modules_have_no_module_marks_to_spread() -> None:
    # A project may import several spec modules into one of its own: a module-level
    # pytestmark would then mark every test there.
    for path in Path(spec.__file__).parent.glob("test_*.py"):
        module = importlib.import_module(f"statekeeper.testing.spec.{path.stem}")
        assert not hasattr(module, "pytestmark"), path.name
