"""The writer of the joint-append crash test, run as its own OS process::

    python -m statekeeper.testing.spec.joint_writer URL [MODULE ...]

It imports the modules (ones that register a third-party store scheme), opens the store
at URL and appends to the session ``joint`` in a loop until it is killed: round ``n`` is
two entries (``j<n>-0``, ``j<n>-1``) and, in the same call, two events (kind ``<n>``) on
the log ``joint``. After each acknowledged round it prints ``n`` on a line of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Sequence

from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, EventBatch, EventDraft

TENANT = "tenant-a"
SESSION = "joint"
LOG = "joint"


async def write(url: str) -> None:
    """Append rounds of entries with their events until killed."""
    async with open_store(url) as store:
        n = 0
        while True:
            drafts = [EntryDraft(id=f"j{n}-{i}", payload={"n": n, "i": i}) for i in range(2)]
            events = [EventDraft(stream="joint", kind=str(n), payload={"i": i}) for i in range(2)]
            await store.append_entries(TENANT, SESSION, drafts, events=EventBatch(LOG, events))
            print(n, flush=True)
            n += 1


def main(argv: Sequence[str]) -> None:
    """Run the writer from its command line arguments."""
    url, *modules = argv
    for module in modules:
        importlib.import_module(module)
    asyncio.run(write(url))


if __name__ == "__main__":
    main(sys.argv[1:])
