"""One writer of the processes test, run as its own OS process::

    python -m statekeeper.testing.spec.appender URL NAME APPENDS [MODULE ...]

It imports the modules (ones that register a third-party store scheme), opens the store
at URL, prints ``ready`` and waits for a line on stdin, so that every writer starts at
once. Then it makes APPENDS rounds of: a batch of 1 to 3 entries on one shared session,
two events on one shared log, and an update of one shared record.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Sequence

from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, EventDraft, SessionPatch

TENANT = "tenant-a"
SESSION = "shared"
LOG = "log"
NAMESPACE = "counters"
KEY = "c"


def batch_size(round_number: int) -> int:
    """How many entries a writer appends at once in a round (1, 2 or 3)."""
    return 1 + round_number % 3


async def write(url: str, name: str, appends: int) -> None:
    """Open the store, wait for the go, then write every round."""
    async with open_store(url) as store:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for n in range(appends):
            drafts = [
                EntryDraft(id=f"{name}-{n}-{i}", payload={"by": name, "n": n, "i": i})
                for i in range(batch_size(n))
            ]
            patch = SessionPatch(add={"message_count": len(drafts)})
            await store.append_entries(TENANT, SESSION, drafts, patch=patch)
            await store.append_events(TENANT, LOG, [EventDraft(stream=name, kind=str(n))] * 2)
            await store.put_record(TENANT, NAMESPACE, KEY, n)


def main(argv: Sequence[str]) -> None:
    """Run one writer from its command line arguments."""
    url, name, appends, *modules = argv
    for module in modules:
        importlib.import_module(module)
    asyncio.run(write(url, name, int(appends)))


if __name__ == "__main__":
    main(sys.argv[1:])
