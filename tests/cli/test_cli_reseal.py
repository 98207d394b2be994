"""``statekeeper reseal`` in a real subprocess: the keyring named by ``--keyring``, the
JSON report and the text one, and a key given in its place refused without an echo."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.sealed import Keyring, SealedStore


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statekeeper.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


async def write(url: str, ring: Keyring) -> None:
    async with open_store(url, keyring=ring) as store:
        await store.create_session(SessionRecord(id="s1", tenant="t", title="hello"))
        await store.append_entries("t", "s1", [EntryDraft(id="e1", payload={"x": 1})])
        await store.put_record("t", "runs", "r1", {"v": 1})


async def head_key(url: str, ring: Keyring) -> str:
    async with open_store(url, keyring=ring) as store:
        assert isinstance(store, SealedStore)
        raw = await store.wrapped.get_session("t", "s1")
        assert raw.title is not None
        return ring.key_id_of(raw.title.removeprefix("~sealed:"))


def test_reseal_moves_heads_and_records_to_the_new_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    old = Keyring({"k1": Keyring.new_key()})
    asyncio.run(write(url, old))
    new = old.rotated("k2")
    env = {"SK_RING": new.to_json()}
    done = cli(
        "--store", url, "--tenant", "t", "reseal", "--keyring", "env:SK_RING", "--json", env=env
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "sessions": 1,
        "sessions_resealed": 1,
        "records": 1,
        "records_resealed": 1,
        "raced": 0,
        "entries_by_key": {"k1": 1},
    }
    assert asyncio.run(head_key(url, new)) == "k2"
    again = cli("--store", url, "--tenant", "t", "reseal", "--keyring", "env:SK_RING", env=env)
    assert again.returncode == 0, again.stderr
    assert "resealed 0 of 1 session heads and 0 of 1 records" in again.stdout
    assert "1 transcript entries sealed with k1" in again.stdout


def test_a_key_in_place_of_a_source_is_refused_unechoed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    asyncio.run(write(url, Keyring({"k1": Keyring.new_key()})))
    secret = base64.b64encode(Keyring.new_key()).decode()
    done = cli("--store", url, "--tenant", "t", "reseal", "--keyring", secret, env={})
    assert done.returncode == 1
    assert "env:VARIABLE or file:PATH" in done.stderr
    assert secret[:12] not in done.stderr + done.stdout
