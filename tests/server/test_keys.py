"""`ApiKeys.verify` remembers the keys it verified, and still sees every change of their
records at once: a revocation or deletion by another process (another `ApiKeys` on the
same store here) refuses the very next request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from statekeeper.server import ApiKeys
from statekeeper.server.errors import AuthenticationError
from statekeeper.server.keys import KEYS_NAMESPACE, KEYS_TENANT
from statekeeper.stores import Store, open_store


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """The server's store and another process's, on one file."""
    url = f"sqlite:///{tmp_path}/keys.db"
    server, other = await open_store(url), await open_store(url)
    try:
        yield server, other
    finally:
        await server.close()
        await other.close()


async def test_a_revocation_elsewhere_refuses_the_next_request(
    stores: tuple[Store, Store],
) -> None:
    server, other = stores
    keys = ApiKeys(server)
    record, key = await ApiKeys(other).create("acme", "read")
    for _ in range(2):  # the second one is answered from what the first one verified
        assert (await keys.verify(key)).key_id == record.key_id
    await ApiKeys(other).revoke(record.key_id)
    with pytest.raises(AuthenticationError, match="unknown or revoked"):
        await keys.verify(key)


async def test_a_deleted_key_is_refused_and_a_wrong_secret_never_passes(
    stores: tuple[Store, Store],
) -> None:
    server, other = stores
    keys = ApiKeys(server)
    record, key = await ApiKeys(other).create("acme", "operate")
    assert (await keys.verify(key)).scope == "operate"
    wrong = key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")
    for presented in (wrong, key[:-1] + "é"):
        with pytest.raises(AuthenticationError):
            await keys.verify(presented)
    assert (await keys.verify(key)).tenant == "acme"  # the right one still passes
    await other.delete_record(KEYS_TENANT, KEYS_NAMESPACE, record.key_id)
    with pytest.raises(AuthenticationError):
        await keys.verify(key)


async def test_what_verify_returns_is_the_callers_own(stores: tuple[Store, Store]) -> None:
    server, _ = stores
    keys = ApiKeys(server)
    _, key = await keys.create("acme", "read")
    first = await keys.verify(key)
    first.scope = "admin"
    assert (await keys.verify(key)).scope == "read"
