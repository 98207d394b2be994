"""The blocking facade for scripts: the async API without an event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import StatekeeperError
from statekeeper.sessions import SessionManager
from statekeeper.sync import BlockingRunner


def test_scripts_use_sessions_without_an_event_loop(tmp_path: Path) -> None:
    runner = BlockingRunner()
    store = runner.open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        sessions = runner.wrap(SessionManager(store.unwrap(), "alice"))
        chat = sessions.create(title="sync")
        chat.append(Message.user("hi"))
        chat.append(Message.assistant("hello"))
        again = sessions.get(chat.id)
        assert [m.text for m in again.messages()] == ["hi", "hello"]
        assert again.record.message_count == 2
    finally:
        store.close()


async def test_calling_it_inside_an_event_loop_is_refused() -> None:
    runner = BlockingRunner()

    async def work() -> int:
        return 1

    with pytest.raises(StatekeeperError, match="running event loop"):
        runner.run(work())
    assert asyncio.get_running_loop() is not None
