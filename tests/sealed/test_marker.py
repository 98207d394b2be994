"""A sealed store says it is sealed: once opened with a keyring it keeps a marker record,
and opening it without the keyring (to read or to write) is refused with `WrongKeyError`
naming the fix, on every backend that outlives a process; a store sealed before the
marker existed gets it when opened with its keyring."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import pytest

from statekeeper.codec import WrongKeyError
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.sealed import SEALED_VERSION, Keyring, SealedStore, sealed
from statekeeper.stores.sealed.marker import MARKER, read_marker
from statekeeper.testing.registry import BACKENDS, new_context
from statekeeper.testing.schemes import TEST_KEYRING_VAR

DURABLE = [
    "sqlite-sealed",
    "files-sealed",
    "postgres-sealed",
    "redis-sealed",
    "redis-cluster-sealed",
]


def without_keyring(url: str) -> str:
    base, _, query = url.partition("?")
    kept = [(k, v) for k, v in parse_qsl(query) if k != "keyring"]
    return f"{base}?{urlencode(kept)}" if kept else base


@pytest.mark.parametrize("name", DURABLE)
async def test_a_sealed_store_refuses_an_opening_without_its_keyring(
    name: str, tmp_path: Path
) -> None:
    made = BACKENDS[name]
    ctx = new_context(made, tmp_path)
    assert made.url is not None
    url = made.url(ctx)
    async with made.open(ctx) as store:
        assert isinstance(store, SealedStore)
        await store.create_session(SessionRecord(id="s1", tenant="t", title="secret"))
        marker = await read_marker(store.wrapped)
        assert marker is not None
        assert marker["key_ids"] == [store.keyring.current]
        for options in ({}, {"durability": "process"} if name.startswith("sqlite") else {}):
            with pytest.raises(WrongKeyError, match=r"opened without a keyring.*keyring=") as e:
                await open_store(without_keyring(url), **options)
            assert repr(store.keyring.current) in str(e.value)
            assert TEST_KEYRING_VAR not in str(e.value)  # the URL's query is not echoed
        # Nothing was written by the refused openings: the head is as it was.
        assert (await store.get_session("t", "s1")).version == 1


async def test_a_read_only_opening_is_refused_too(tmp_path: Path) -> None:
    ring = Keyring({"k1": Keyring.new_key()})
    url = f"sqlite:///{tmp_path}/state.db"
    async with open_store(url, keyring=ring) as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
    with pytest.raises(WrongKeyError, match="is sealed"):
        await open_store(f"{url}?mode=ro")
    async with open_store(f"{url}?mode=ro", keyring=ring) as store:
        assert (await store.get_session("t", "s1")).id == "s1"


async def test_a_store_sealed_before_the_marker_gets_it(tmp_path: Path) -> None:
    ring = Keyring({"k1": Keyring.new_key()})
    url = f"sqlite:///{tmp_path}/state.db"
    async with open_store(url) as plain:  # sealed the way stores were before the marker
        legacy = sealed(plain, ring)
        await legacy.create_session(SessionRecord(id="s1", tenant="t"))
        await legacy.append_entries("t", "s1", [EntryDraft(id="e1", payload={"x": 1})])
    async with open_store(url) as plain:  # no marker yet: nothing to refuse on
        assert await read_marker(plain) is None
    async with open_store(url, keyring=ring) as store:
        assert (await store.get_entry("t", "s1", "e1")).payload == {"x": 1}
    with pytest.raises(WrongKeyError, match="'k1'"):
        await open_store(url)


async def test_each_current_key_is_recorded(tmp_path: Path) -> None:
    ring = Keyring({"k1": Keyring.new_key()})
    url = f"sqlite:///{tmp_path}/state.db"
    async with open_store(url, keyring=ring):
        pass
    async with open_store(url, keyring=ring.rotated("k2")) as store:
        assert isinstance(store, SealedStore)
        record = await store.wrapped.get_record(*MARKER)
        assert record.value == {"sealed": True, "format": SEALED_VERSION, "key_ids": ["k1", "k2"]}
    async with open_store(url, keyring=ring.rotated("k2")) as store:  # no second write
        assert isinstance(store, SealedStore)
        assert (await store.wrapped.get_record(*MARKER)).version == record.version


async def test_a_plain_store_opens_as_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    async with open_store(url) as plain:
        await plain.create_session(SessionRecord(id="s1", tenant="t", title="hi"))
        assert await read_marker(plain) is None
    async with open_store(url) as plain:
        assert (await plain.get_session("t", "s1")).title == "hi"


def test_the_cli_refuses_a_sealed_store_without_its_keyring(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    ring = Keyring({"k1": Keyring.new_key()})
    url = f"sqlite:///{tmp_path}/state.db"

    async def write() -> None:
        async with open_store(url, keyring=ring) as store:
            await store.create_session(SessionRecord(id="s1", tenant="t", title="secret"))

    asyncio.run(write())
    done = subprocess.run(
        [sys.executable, "-m", "statekeeper.cli", "--store", url, "--tenant", "t", "sessions",
         "list"],
        capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 1
    assert "is sealed" in done.stderr
    assert "?keyring=env:VARIABLE" in " ".join(done.stderr.split())
    assert "secret" not in done.stdout
