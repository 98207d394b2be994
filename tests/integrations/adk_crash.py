"""Run as a script by test_adk_state_commit.py: append one event carrying ``app:`` and
``user:`` state deltas to session ``s`` of app ``app``, user ``u``, and end the process
with ``os._exit(3)`` at the store write of the event: ``before`` it is written, or just
``after`` it was (no clean-up of any kind runs, as in a crash).

    python adk_crash.py <sqlite url> before|after
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

from adk_events import event

from statekeeper import open_store
from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.stores import Store
from statekeeper.stores.base import AppendResult, EntryDraft, WrappingStore

CRASH_EXIT = 3


class CrashingStore(WrappingStore):
    """Ends the process at the append of entries, before or after delegating it."""

    def __init__(self, wrapped: Store, when: str) -> None:
        self.wrapped = wrapped
        self.when = when

    async def append_entries(
        self, tenant: str, session_id: str, drafts: Sequence[EntryDraft], **options: Any
    ) -> AppendResult:
        if self.when == "before":
            os._exit(CRASH_EXIT)
        await self.wrapped.append_entries(tenant, session_id, drafts, **options)
        os._exit(CRASH_EXIT)


async def main(url: str, when: str) -> None:
    store = await open_store(url)
    service = StatekeeperSessionService(CrashingStore(store, when), tenant="acme")  # type: ignore[arg-type]
    session = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert session is not None
    await service.append_event(session, event(1, delta={"app:x": 1, "user:y": 2, "z": 3}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
