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
from typing import Any

from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, EventDraft, SessionRecord
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
        await store.append_events("t", "r1", [EventDraft(stream="tool", kind="k")] * 2)


async def read_all(url: str, ring: Keyring) -> tuple[Any, ...]:
    async with open_store(url, keyring=ring) as store:
        return (
            (await store.get_session("t", "s1")).title,
            [e.payload for e in await store.read_entries("t", "s1")],
            [e.payload for e in await store.read_events("t", "r1")],
            (await store.get_record("t", "runs", "r1")).value,
        )


async def head_key(url: str, ring: Keyring) -> str:
    async with open_store(url, keyring=ring) as store:
        assert isinstance(store, SealedStore)
        raw = await store.wrapped.get_session("t", "s1")
        assert raw.title is not None
        return ring.key_id_of(raw.title.removeprefix("~sealed:"))


def test_reseal_moves_every_row_to_the_new_key(tmp_path: Path) -> None:
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
        "entries": 1,
        "entries_resealed": 1,
        "events": 2,
        "events_resealed": 2,
        "records": 1,
        "records_resealed": 1,
        "raced": 0,
        "left_by_key": {},
    }
    assert asyncio.run(head_key(url, new)) == "k2"
    # The old key can go: every row opens without it.
    expected = ("hello", [{"x": 1}], [{}, {}], {"v": 1})
    assert asyncio.run(read_all(url, new.without("k1"))) == expected
    again = cli("--store", url, "--tenant", "t", "reseal", "--keyring", "env:SK_RING", env=env)
    assert again.returncode == 0, again.stderr
    assert (
        "resealed 0 of 1 session heads, 0 of 1 transcript entries, 0 of 2 events and 0 of 1 "
        "records" in " ".join(again.stdout.split())
    )
    assert "every entry and event is on the current key" in again.stdout


def test_a_key_in_place_of_a_source_is_refused_unechoed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    asyncio.run(write(url, Keyring({"k1": Keyring.new_key()})))
    secret = base64.b64encode(Keyring.new_key()).decode()
    done = cli("--store", url, "--tenant", "t", "reseal", "--keyring", secret, env={})
    assert done.returncode == 1
    assert "env:VARIABLE or file:PATH" in done.stderr
    assert secret[:12] not in done.stderr + done.stdout
