"""Opening a sealed store: ``open_store(url, keyring=...)``, or the URL naming where the
keyring lives; a key in a URL is refused without being echoed."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from statekeeper.codec import StateCodec
from statekeeper.errors import InvalidInputError
from statekeeper.stores import open_store
from statekeeper.stores.base import SessionRecord
from statekeeper.stores.sealed import Keyring, SealedStore, sealed


async def test_keyword_and_url_forms_open_the_same_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring = Keyring({"k1": Keyring.new_key()})
    url = f"sqlite:///{tmp_path}/state.db"
    async with open_store(url, keyring=ring) as store:
        assert isinstance(store, SealedStore)
        await store.create_session(SessionRecord(id="s1", tenant="t", title="hello"))
    monkeypatch.setenv("SK_RING", ring.to_json())
    async with open_store(f"{url}?keyring=env:SK_RING&durability=process") as store:
        assert isinstance(store, SealedStore)
        assert (await store.get_session("t", "s1")).title == "hello"
        assert (await store.wrapped.get_session("t", "s1")).title != "hello"  # sealed at rest


@pytest.mark.parametrize("name", ["key", "keys", "codec", "secret", "password"])
async def test_a_key_in_a_url_is_refused_without_echo(tmp_path: Path, name: str) -> None:
    secret = base64.urlsafe_b64encode(Keyring.new_key()).decode()
    with pytest.raises(InvalidInputError, match="never be written in a URL") as caught:
        await open_store(f"sqlite:///{tmp_path}/state.db?{name}={secret}")
    assert secret[:10] not in str(caught.value)
    assert not (tmp_path / "state.db").exists()  # refused before anything was opened


async def test_a_codec_is_not_a_keyring(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="keyring="):
        await open_store(f"sqlite:///{tmp_path}/x.db", codec=StateCodec(key=bytes(32)))
    with pytest.raises(InvalidInputError, match="keyring= as well"):
        await open_store(f"sqlite:///{tmp_path}/x.db", clear_metadata=["a"])
    with pytest.raises(InvalidInputError, match=r"statekeeper\.Keyring"):
        await open_store("memory://", keyring=bytes(32))


async def test_clear_metadata_and_allow_plain_from_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SK_RING", Keyring({"k1": Keyring.new_key()}).to_json())
    url = f"sqlite:///{tmp_path}/s.db?keyring=env:SK_RING&clear_metadata=a,b&allow_plain=yes"
    async with open_store(url) as store:
        assert isinstance(store, SealedStore)
        assert (store.clear_metadata, store.allow_plain) == (frozenset({"a", "b"}), True)


async def test_sealing_twice_is_refused() -> None:
    ring = Keyring({"k1": Keyring.new_key()})
    async with open_store("memory://", keyring=ring) as store:
        with pytest.raises(InvalidInputError, match="sealed already"):
            sealed(store, ring)
