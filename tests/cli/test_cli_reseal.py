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
        await store.put_record("t", "ltm.default", "m1", {"fact": "likes tea"})
        await store.append_events("t", "r1", [EventDraft(stream="tool", kind="k")] * 2)


async def read_all(url: str, ring: Keyring) -> tuple[Any, ...]:
    async with open_store(url, keyring=ring) as store:
        return (
            (await store.get_session("t", "s1")).title,
            [e.payload for e in await store.read_entries("t", "s1")],
            [e.payload for e in await store.read_events("t", "r1")],
            (await store.get_record("t", "runs", "r1")).value,
            (await store.get_record("t", "ltm.default", "m1")).value,
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
    base = ("--store", url, "--tenant", "t", "reseal", "--keyring", "env:SK_RING")
    # Before: a check writes nothing and fails, naming what the old key still seals.
    check = cli(*base, "--check", "--namespace", "ltm.default", "--json", env=env)
    assert check.returncode == 1, check.stderr
    checked = json.loads(check.stdout)
    assert (checked["checked"], checked["current_key"], checked["left_by_key"]) == (
        True, "k2", {"k1": 6},
    )  # fmt: skip
    assert checked["left_by_kind"] == {
        "k1": {"sessions": 1, "entries": 1, "events": 2, "records": 2}
    }
    assert asyncio.run(head_key(url, new)) == "k1"  # nothing was written
    text = cli(*base, "--check", "--namespace", "ltm.default", env=env)
    assert text.returncode == 1
    assert "6 rows left on k1 (1 entries, 2 events, 2 records, 1 sessions)" in text.stdout

    # Naming a namespace adds it to statekeeper's own: runs/r1 is resealed too.
    done = cli(*base, "--namespace", "ltm.default", "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {k: v for k, v in report.items() if k not in ("namespaces", "left_by_kind")} == {
        "sessions": 1,
        "sessions_resealed": 1,
        "entries": 1,
        "entries_resealed": 1,
        "events": 2,
        "events_resealed": 2,
        "records": 2,
        "records_resealed": 2,
        "raced": 0,
        "left_by_key": {},
        "sealed_with": {"k2": 6},
        "unbound_entries": 0,
        "current_key": "k2",
        "checked": False,
    }
    assert report["namespaces"][:2] == ["runs", "run-children"]
    assert report["namespaces"][-1] == "ltm.default"
    assert asyncio.run(head_key(url, new)) == "k2"
    check = cli(*base, "--check", "--namespace", "ltm.default", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "every row gone through is on the current key k2" in check.stdout
    # The old key can go: every row opens without it.
    expected = ("hello", [{"x": 1}], [{}, {}], {"v": 1}, {"fact": "likes tea"})
    assert asyncio.run(read_all(url, new.without("k1"))) == expected
    again = cli(*base, env=env)
    assert again.returncode == 0, again.stderr
    assert (
        "resealed 0 of 1 session heads, 0 of 1 transcript entries, 0 of 2 events and 0 of 1 "
        "records" in " ".join(again.stdout.split())
    )
    assert "every row gone through is on the current key k2" in again.stdout


def test_a_key_in_place_of_a_source_is_refused_unechoed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    asyncio.run(write(url, Keyring({"k1": Keyring.new_key()})))
    secret = base64.b64encode(Keyring.new_key()).decode()
    done = cli("--store", url, "--tenant", "t", "reseal", "--keyring", secret, env={})
    assert done.returncode == 1
    assert "env:VARIABLE or file:PATH" in done.stderr
    assert secret[:12] not in done.stderr + done.stdout
