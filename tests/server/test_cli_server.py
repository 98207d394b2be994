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
    code, _, err = cli(url, "serve", "--take-over", "5")
    assert code == 1
    assert "--take-over needs --app" in err


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


def test_keys_need_a_store_that_outlives_the_command(tmp_path: Path) -> None:
    code, out, err = cli("memory://", "keys", "create", "--tenant", "acme")
    assert code == 1
    assert "sk_" not in out  # no key printed that no server could ever know
    assert "memory://" in err
    url = f"sqlite:///{tmp_path}/k.db"
    assert cli(url, "keys", "create", "--tenant", "acme")[0] == 0
    code, _, err = cli(url, "keys", "list", "--tenant", "../x")
    assert code == 1
    assert "tenant '../x' is not allowed" in err


def test_a_damaged_key_record_is_refused_and_the_others_still_listed(tmp_path: Path) -> None:
    from statekeeper.testing.damage import damage_record

    url = f"sqlite:///{tmp_path}/keys.db"

    async def scenario() -> tuple[list[str], str]:
        async with await open_store(url) as store:
            keys = ApiKeys(store)
            good, _ = await keys.create("acme", "read")
            bad, bad_key = await keys.create("acme", "admin")
            await damage_record(store, KEYS_TENANT, KEYS_NAMESPACE, bad.key_id)
            from statekeeper.server import AuthenticationError

            try:
                await keys.verify(bad_key)
            except AuthenticationError as exc:
                refused = str(exc)
            return [k.key_id for k in await keys.list()], refused + "|" + good.key_id

    listed, detail = asyncio.run(scenario())
    refused, good_id = detail.split("|")
    assert listed == [good_id]
    assert "unknown or revoked" in refused
    code, out, err = cli(url, "keys", "list")
    assert code == 0
    assert good_id in out
    assert "damaged" in err


def test_serve_with_an_unreachable_store_says_so_in_one_line() -> None:
    code, _, err = cli("postgresql://nobody:secret@127.0.0.1:1/db", "serve", "--port", "0")
    assert code == 1
    assert "cannot connect" in err
    assert "secret" not in err
    assert "Traceback" not in err
