"""Opening stores: URL options parsed in one place, stores as async context managers."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekeeper.errors import InvalidInputError, StoreUnavailableError
from statekeeper.stores import StoreOptions, open_store
from statekeeper.stores.base import Durability, SessionRecord


async def test_open_store_as_context_manager_closes_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    async with open_store(url) as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
    with pytest.raises(StoreUnavailableError):
        await store.get_session("t", "s1")
    async with await open_store(url) as again:
        assert (await again.get_session("t", "s1")).id == "s1"


async def test_memory_store_is_a_context_manager() -> None:
    async with open_store("memory://") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
        assert (await store.get_session("t", "s1")).version == 1


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("memory://?bogus=1", "unknown memory store option(s): bogus"),
        ("sqlite:///{tmp}/x.db?durability=sometimes", "durability='sometimes' is not one of"),
        ("sqlite:///{tmp}/x.db?busy_timeout=soon", "busy_timeout='soon' is not a valid float"),
        ("sqlite:///{tmp}/x.db?mode=rwx", "mode='rwx' is not one of: rw, ro"),
        ("files://{tmp}/x?lock_timeout=0", "lock_timeout='0' must be greater than 0"),
        ("memory://?max_payload_bytes=-5", "must be greater than 0"),
    ],
)
async def test_bad_options_are_refused_with_the_fix(
    url: str, fragment: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        await open_store(url.replace("{tmp}", str(tmp_path)))
    assert fragment in str(caught.value)


def test_store_options_parse_each_type_once() -> None:
    options = StoreOptions(
        "x", {"n": "3", "f": "0.5", "b": "yes", "s": "v", "durability": "process"}
    )
    assert options.take("n", int, 1) == 3
    assert options.take("f", float, 1.0) == 0.5
    assert options.take("b", bool, False) is True
    assert options.take("s", str, "") == "v"
    assert options.durability() is Durability.PROCESS
    assert options.take("absent", int, 7) == 7
    options.done()
    with pytest.raises(InvalidInputError, match="not a valid bool"):
        StoreOptions("x", {"b": "maybe"}).take("b", bool, False)


async def test_sqlite_page_size_applies_to_a_new_file_only(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "big.db"
    async with open_store(f"sqlite:///{path}?page_size=16384") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
    async with open_store(f"sqlite:///{path}?page_size=4096") as store:  # existing: kept
        assert (await store.get_session("t", "s1")).id == "s1"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    conn.close()
    with pytest.raises(InvalidInputError, match="page_size=5000 is not one of"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}?page_size=5000")


async def test_a_new_sqlite_file_uses_8_kb_pages_by_default(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "default.db"
    async with open_store(f"sqlite:///{path}") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 8192
    conn.close()
