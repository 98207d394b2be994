"""``statekeeper keys`` and ``statekeeper serve`` from the command line, and a server
started with ``--dev-anonymous``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from statekeeper.cli import app
from statekeeper.server import ApiKeys, ServerConfig
from statekeeper.server.keys import KEYS_NAMESPACE, KEYS_TENANT
from statekeeper.stores import open_store

from .conftest import ThreadServer


def cli(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--store", url, *args])
    return result.exit_code, result.stdout, result.stderr


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/keys.db"
    code, out, err = cli(url, "keys", "create", "--tenant", "acme", "--scope", "operate")
    assert code == 0, err
    key = out.strip()
    assert key.startswith("sk_")
    assert "shown only now" in err
    code, out, _ = cli(url, "keys", "list", "--json")
    [listed] = json.loads(out)["items"]
    assert listed["tenant"] == "acme"
    assert listed["scope"] == "operate"
    assert key not in out
    assert "secret_sha256" not in listed

    async def stored() -> tuple[str, str]:
        async with await open_store(url) as store:
            verified = (await ApiKeys(store).verify(key)).key_id
            record = await store.get_record(KEYS_TENANT, KEYS_NAMESPACE, listed["key_id"])
            return verified, json.dumps(record.value)

    verified, kept = asyncio.run(stored())
    assert verified == listed["key_id"]
    assert key.split("_", 2)[2] not in kept
    code, out, _ = cli(url, "keys", "revoke", listed["key_id"])
    assert code == 0
    code, out, _ = cli(url, "keys", "list", "--json")
    assert json.loads(out)["items"][0]["revoked_at"] is not None
    code, _, err = cli(url, "keys", "create", "--tenant", "acme", "--scope", "root")
    assert code == 1
    assert "unknown scope 'root'" in err
    code, _, err = cli(url, "keys", "revoke", "knope")
    assert code == 1
    assert "no API key" in err


def test_dev_anonymous_refuses_a_public_host(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/anon.db"
    code, _, err = cli(url, "serve", "--dev-anonymous", "--host", "0.0.0.0")
    assert code == 1
    assert "loopback only" in err
    code, _, err = cli(url, "serve", "--app", "no_colon")
    assert code == 1
    assert "MODULE:ATTR" in err


async def test_dev_anonymous_serves_tenant_default_as_admin(tmp_path: Path) -> None:
    server = ThreadServer(ServerConfig("memory://", dev_anonymous=True)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            me = (await client.get("/api/v1/whoami")).json()
            made = await client.post("/api/v1/sessions", json={"session_id": "s1"})
            deleted = await client.delete("/api/v1/sessions/s1")
    finally:
        server.stop()
    assert me == {"tenant": "default", "scope": "admin", "key_id": None}
    assert made.status_code == 201
    assert deleted.status_code == 204


async def test_cors_opens_only_to_the_origins_given() -> None:
    config = ServerConfig("memory://", dev_anonymous=True, cors_origins=("http://ui.example",))
    server = ThreadServer(config).start()
    preflight = {"Access-Control-Request-Method": "POST"}
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            allowed = await client.options(
                "/api/v1/runs", headers={"Origin": "http://ui.example", **preflight}
            )
            other = await client.options(
                "/api/v1/runs", headers={"Origin": "http://evil.example", **preflight}
            )
    finally:
        server.stop()
    assert allowed.headers["access-control-allow-origin"] == "http://ui.example"
    assert "access-control-allow-origin" not in other.headers


def test_serve_never_prints_the_store_password() -> None:
    from statekeeper.cli.server import _shown

    assert (
        _shown("postgresql://app:s3cret@db:5432/agents?schema=x") == "postgresql://db:5432/agents"
    )
    assert _shown("redis://:s3cret@cache:6379/0") == "redis://cache:6379/0"
    assert _shown("sqlite:///var/state.db?mode=ro") == "sqlite:///var/state.db"
