"""Conformance registration of the files backend: a fresh root under the test's tmp_path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

from statekeeper.stores import Store, open_store

from .backends import SHARED, BackendContext, backend


@backend("files", capabilities={SHARED})
async def files_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """Plain JSON / JSONL files with the default durability (power: fsync every write)."""
    store = await open_store(f"files://{quote(str(ctx.tmp_path / 'root'))}", **ctx.options)
    try:
        yield store
    finally:
        await store.close()
