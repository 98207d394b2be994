"""Encryption at rest for any store: a wrapper that seals what a tenant stores.

    store = await open_store("sqlite:///state.db", keyring=Keyring({"k1": key}))
    store = await open_store("sqlite:///state.db?keyring=env:STATEKEEPER_KEYRING")

`SealedStore` seals entry and event payloads, record values and the session head's title,
metadata (except the keys declared clear), delivery context and state with AES-256-GCM,
each bound to its tenant and owner (an entry also to its seq and parent); `Keyring` holds
the keys (one current, the older ones to open older rows); `reseal` moves rows sealed with
older keys (or none) to the current key; `open_store` marks a store it opens with a
keyring, and refuses to open a marked one without (`statekeeper.stores.sealed.marker`).
Everything is described in ``docs/encryption.md``. Needs the ``crypto`` extra.
"""

from __future__ import annotations

from statekeeper.stores.sealed.keyring import SEALED_VERSION, Keyring
from statekeeper.stores.sealed.store import SealedStore, sealed

__all__ = ["SEALED_VERSION", "Keyring", "SealedStore", "sealed"]
