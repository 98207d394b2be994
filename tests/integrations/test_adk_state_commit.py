"""An ADK event and the ``app:`` / ``user:`` state its actions change are stored in one
commit: a store that dies at the event's write (in this process, or a real process
killed there) leaves neither, and one that dies just after leaves both."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from adk_crash import CRASH_EXIT
from adk_events import event

from statekeeper.errors import StoreUnavailableError
from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.integrations.adk._codec import STATE_NAMESPACE, app_record_key, user_record_key
from statekeeper.stores import Store
from statekeeper.stores.base import AppendResult, EntryDraft, WrappingStore

HERE = Path(__file__).parent
DELTA = {"app:x": 1, "user:y": 2, "z": 3}


class DyingStore(WrappingStore):
    """A store whose connection is lost at the first append of entries: that append
    (``before`` or ``after`` delegating it) and every call after it fail, so nothing
    written earlier can be put back (as when the process dies there)."""

    def __init__(self, wrapped: Store, when: str) -> None:
        self.wrapped = wrapped
        self.when = when
        self.dead = False

    def __getattr__(self, name: str) -> Any:
        if self.dead:
            raise StoreUnavailableError("the store went away")
        return getattr(self.wrapped, name)

    async def append_entries(
        self, tenant: str, session_id: str, drafts: Sequence[EntryDraft], **options: Any
    ) -> AppendResult:
        if self.dead:
            raise StoreUnavailableError("the store went away")
        if self.when == "after":
            await self.wrapped.append_entries(tenant, session_id, drafts, **options)
        self.dead = True
        raise StoreUnavailableError("the store went away")


async def _stored(store: Store) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The session's state, the user's state and the session's event ids, read by a
    fresh service (no cache of the dead one)."""
    service = StatekeeperSessionService(store, tenant="acme")
    session = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert session is not None
    user = await service.get_user_state(app_name="app", user_id="u")
    return session.state, user, [e.id for e in session.events]


async def _start(store: Store) -> None:
    service = StatekeeperSessionService(store, tenant="acme")
    await service.create_session(
        app_name="app", user_id="u", session_id="s", state={"app:x": 0, "z": 0}
    )


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_store_lost_at_the_event_write_keeps_state_and_event_together(
    store: Store, when: str
) -> None:
    await _start(store)
    dying = StatekeeperSessionService(DyingStore(store, when), tenant="acme")  # type: ignore[arg-type]
    session = await dying.get_session(app_name="app", user_id="u", session_id="s")
    assert session is not None
    with pytest.raises(StoreUnavailableError):
        await dying.append_event(session, event(1, delta=DELTA))

    state, user, events = await _stored(store)
    if when == "before":
        assert (state, user, events) == ({"app:x": 0, "z": 0}, {}, [])
    else:
        assert (state, user, events) == ({"app:x": 1, "user:y": 2, "z": 3}, {"y": 2}, ["e1"])
    # The app's other users see the app state the stored events say, no more.
    other = await StatekeeperSessionService(store, tenant="acme").create_session(
        app_name="app", user_id="v"
    )
    assert other.state == {"app:x": 0 if when == "before" else 1}


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_process_killed_at_the_event_write_keeps_state_and_event_together(
    tmp_path: Path, when: str
) -> None:
    import asyncio

    from statekeeper import open_store

    url = f"sqlite:///{tmp_path / 'adk.db'}"

    async def start() -> None:
        async with await open_store(url) as store:
            await _start(store)

    async def read() -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        async with await open_store(url) as store:
            return await _stored(store)

    asyncio.run(start())
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(HERE / "adk_crash.py"), url, when],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == CRASH_EXIT, done.stderr
    state, user, events = asyncio.run(read())
    if when == "before":
        assert (state, user, events) == ({"app:x": 0, "z": 0}, {}, [])
    else:
        assert (state, user, events) == ({"app:x": 1, "user:y": 2, "z": 3}, {"y": 2}, ["e1"])


async def test_deltas_a_crash_left_out_of_the_snapshots_are_listed_and_caught_up(
    store: Store,
) -> None:
    await _start(store)
    dying = StatekeeperSessionService(DyingStore(store, "after"), tenant="acme")  # type: ignore[arg-type]
    session = await dying.get_session(app_name="app", user_id="u", session_id="s")
    assert session is not None
    with pytest.raises(StoreUnavailableError):
        await dying.append_event(session, event(1, delta=DELTA))

    service = StatekeeperSessionService(store, tenant="acme")
    [listed] = (await service.list_sessions(app_name="app")).sessions
    assert listed.state == {"app:x": 1, "user:y": 2, "z": 3}
    # The next write of the app moves the snapshot records on past the crash's deltas.
    other = await service.create_session(app_name="app", user_id="v", state={"user:w": 1})
    await service.append_event(other, event(2, delta={"app:x": 5}))
    app = await store.get_record("acme", STATE_NAMESPACE, app_record_key("app"))
    user = await store.get_record("acme", STATE_NAMESPACE, user_record_key("app", "u"))
    assert app.value == {"app": "app", "state": {"x": 5}, "through": 5}
    assert user.value == {"app": "app", "user": "u", "state": {"y": 2}, "through": 4}
    assert await service.get_user_state(app_name="app", user_id="u") == {"y": 2}


async def test_state_records_written_before_the_log_read_as_before(store: Store) -> None:
    await StatekeeperSessionService(store, tenant="acme").create_session(
        app_name="app", user_id="u", session_id="s", state={"z": 0}
    )
    # As an earlier version stored them: the state alone, no log position.
    await store.put_record(
        "acme", STATE_NAMESPACE, app_record_key("app"), {"app": "app", "state": {"x": 9}}
    )
    await store.put_record(
        "acme",
        STATE_NAMESPACE,
        user_record_key("app", "u"),
        {"app": "app", "user": "u", "state": {"y": 8}},
    )
    service = StatekeeperSessionService(store, tenant="acme")
    session = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert session is not None
    assert session.state == {"app:x": 9, "user:y": 8, "z": 0}
    await service.append_event(session, event(1, delta={"user:y2": 1}))
    assert await service.get_user_state(app_name="app", user_id="u") == {"y": 8, "y2": 1}
    [listed] = (await service.list_sessions(app_name="app")).sessions
    assert listed.state == {"app:x": 9, "user:y": 8, "user:y2": 1, "z": 0}
