"""Encryption at rest: the same SQLite store with and without a keyring.

Both sides go through the public API (``Session.append``, ``Session.messages``) on a
session that already holds 10,000 messages of the realistic mix (`bench.common`), one
store opened plainly and one with ``keyring=``. Appends (one message each) and loads
(all 10,000+ messages) take turns in batches (`bench.common.interleave`); each batch
gives one ratio sealed / plain. Both durability settings are measured: ``power`` (the
default, an fsync per commit) and ``process`` (no fsync: the crypto's share is largest).

The envelope choice is measured too: sealing and opening one message (the JSON of a
``Message``) with the store's envelope (AES-GCM), with `StateCodec` (AES-GCM), and as a
compact JWE (``dir`` + ``A256GCM``) with joserfc, the reviewed JOSE library the issue
names.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Verdicts, as_message, interleave, message_dict
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.stores.sealed import Keyring

HISTORY = 10_000
APPENDS = 300
BATCH = 20
LOADS = 6
TARGETS = {"append": 1.3, "load": 1.5}
"""Upper limits of sealed / plain at 10,000 messages (issue 14)."""


async def filled(url: str, **options: Any) -> tuple[Any, Any]:
    store = await open_store(url, **options)
    session = await SessionManager(store, "bench", max_messages=None).create()
    for start in range(0, HISTORY, 500):
        await session.append(*(as_message(message_dict(n)) for n in range(start, start + 500)))
    await store.checkpoint(truncate=True)
    return store, session


async def measure(durability: str, folder: Path) -> dict[str, Any]:
    """Append and load ratios, sealed over plain, for one durability setting."""
    keyring = Keyring({"bench-1": Keyring.new_key()})
    plain_store, plain = await filled(
        f"sqlite:///{folder}/plain-{durability}.db?durability={durability}"
    )
    sealed_store, sealed = await filled(
        f"sqlite:///{folder}/sealed-{durability}.db?durability={durability}", keyring=keyring
    )
    try:

        async def append_sealed(n: int) -> None:
            await sealed.append(as_message(message_dict(HISTORY + n)))

        async def append_plain(n: int) -> None:
            await plain.append(as_message(message_dict(HISTORY + n)))

        appends = await interleave(append_sealed, append_plain, APPENDS // BATCH, BATCH)

        async def load_sealed(n: int) -> None:
            assert len(await sealed.messages()) >= HISTORY

        async def load_plain(n: int) -> None:
            assert len(await plain.messages()) >= HISTORY

        loads = await interleave(load_sealed, load_plain, LOADS, 1)
    finally:
        await plain_store.close()
        await sealed_store.close()
    return {"append": appends, "load": loads}


def envelopes(rounds: int = 3000) -> dict[str, tuple[float, float]]:
    """Microseconds to seal and to open one ~400-byte message, per envelope."""
    import os

    from joserfc import jwe
    from joserfc.jwk import OctKey

    from statekeeper.codec import StateCodec
    from statekeeper.stores.sealed.keyring import bindings

    text = as_message(message_dict(1)).model_dump_json().encode()
    binding = bindings("entry", "tenant", "session", "entry-id", "message")
    keyring = Keyring({"k": Keyring.new_key()})
    codec = StateCodec(key=os.urandom(32))
    jwk = OctKey.import_key(os.urandom(32))
    header = {"alg": "dir", "enc": "A256GCM"}
    sides = {
        "AES-GCM envelope (ours)": (
            lambda: keyring.seal(text, binding, deterministic=True),
            lambda blob: keyring.open(blob, binding),
        ),
        "StateCodec AES-GCM": (
            lambda: codec.encode(text.decode(), associated_data=b"tenant/session/entry"),
            lambda blob: codec.decode(blob, associated_data=b"tenant/session/entry"),
        ),
        "JWE dir+A256GCM (joserfc)": (
            lambda: jwe.encrypt_compact(header, text, jwk),
            lambda blob: jwe.decrypt_compact(blob, jwk),
        ),
    }
    out = {}
    for name, (seal, unseal) in sides.items():
        blob = seal()
        started = time.perf_counter()
        for _ in range(rounds):
            seal()
        sealing = (time.perf_counter() - started) / rounds * 1e6
        started = time.perf_counter()
        for _ in range(rounds):
            unseal(blob)
        out[name] = (sealing, (time.perf_counter() - started) / rounds * 1e6)
    return out


async def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        results = {d: await measure(d, Path(folder)) for d in ("power", "process")}
    return {"stores": results, "envelopes": envelopes()}


def report(results: dict[str, Any]) -> list[str]:
    verdicts = Verdicts()
    for durability, figures in results["stores"].items():
        appends, loads = figures["append"], figures["load"]
        print(
            f"durability={durability}: append {appends.ours_us:.0f} us sealed vs "
            f"{appends.raw_us:.0f} us plain; load of {HISTORY}+ messages "
            f"{loads.ours_us / 1000:.1f} ms sealed vs {loads.raw_us / 1000:.1f} ms plain"
        )
        verdicts.at_most(f"append, sealed / plain ({durability})", appends, TARGETS["append"])
        verdicts.at_most(f"load 10k, sealed / plain ({durability})", loads, TARGETS["load"])
    for name, (sealing, opening) in results["envelopes"].items():
        print(f"envelope {name:<28} seal {sealing:6.1f} us  open {opening:6.1f} us per message")
    return verdicts.missed


def main() -> None:
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
