"""Calls that fail leave the store as it was (issue 11, "failed calls that leave data
behind"), on every backend: a snapshot of the tenant is equal before and after."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import (
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    InvalidPayloadError,
    PayloadTooLargeError,
    StatekeeperError,
)
from statekeeper.runs import AskInput, Finish, Respond, Runner
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.sessions.state import APP_TENANT
from statekeeper.stores import Store
from statekeeper.testing.snapshot import snapshot

HUGE = "x" * (17 * 1024 * 1024)  # past the default max_payload_bytes (16 MiB)


def agent() -> ScriptedAgent:
    return ScriptedAgent("a", [Respond([Message.assistant("one")]), AskInput("more?"), Finish("x")])


async def test_start_with_a_bad_run_id_creates_no_session(store: Store) -> None:
    runner = Runner(store, "alice", [agent()])
    before = await snapshot(store, "alice")
    with pytest.raises(InvalidIdError, match="run id"):
        await runner.start("a", "hi", run_id="../x")
    assert await snapshot(store, "alice") == before


async def _exported(store: Store) -> dict[str, Any]:
    sessions = SessionManager(store, "alice")
    session = await sessions.create(session_id="src")
    await session.append(Message.user("one"), Message.assistant("two"), Message.user("three"))
    return await sessions.export("src")


@pytest.mark.parametrize("damage", ["parent", "duplicate", "oversized"])
async def test_a_session_import_that_fails_leaves_no_session(store: Store, damage: str) -> None:
    document = await _exported(store)
    entries = document["entries"]
    if damage == "parent":
        entries[1]["parent_seq"] = 7
    elif damage == "duplicate":
        entries[2]["id"] = entries[0]["id"]
    else:
        entries[2]["payload"] = {"blob": HUGE}
    before = await snapshot(store, "alice")
    with pytest.raises((InvalidInputError, InvalidPayloadError, PayloadTooLargeError)):
        await SessionManager(store, "alice").import_(document, session_id="copy")
    assert await snapshot(store, "alice") == before


async def test_a_run_import_with_oversized_items_leaves_nothing(store: Store) -> None:
    runner = Runner(store, "alice", [agent()])
    asked = await runner.start("a", "hi")
    exported = await runner.runs.export(asked.run_id)
    bulky = exported.replace('"one"', f'"{HUGE}"', 1)
    assert bulky != exported
    before = await snapshot(store, "alice")
    with pytest.raises(PayloadTooLargeError):
        await runner.runs.import_(bulky, run_id="copy", session_id="copy")
    assert await snapshot(store, "alice") == before


async def test_a_stale_handle_state_update_is_all_or_nothing(store: Store) -> None:
    sessions = SessionManager(store, "alice")
    fresh = await sessions.create(session_id="s", agent_id="bot")
    stale = await sessions.get("s")
    await fresh.append(Message.user("moved on"))
    before = await snapshot(store, "alice")
    app_before = await snapshot(store, APP_TENANT)
    with pytest.raises(ConflictError):
        await stale.state.update({"user:x": 1, "app:y": 2, "draft": 3})
    assert await snapshot(store, "alice") == before
    assert await snapshot(store, APP_TENANT) == app_before

    await stale.refresh()
    await stale.state.update({"user:x": 1, "draft": 3})
    assert await fresh.state.get("user:x") == 1
    [entry] = [e for e in await store.read_entries("alice", "s") if e.kind == "state"]
    assert entry.payload["delta"]["user"]["set"] == {"x": 1}
    assert entry.payload["delta"]["session"]["set"] == {"draft": 3}


async def test_a_state_update_with_a_bad_value_writes_no_scope(store: Store) -> None:
    session = await SessionManager(store, "alice").create(session_id="s")
    before = await snapshot(store, "alice")
    with pytest.raises(StatekeeperError):
        await session.state.update({"user:x": 1, "draft": float("nan")})
    assert await snapshot(store, "alice") == before


@pytest.mark.parametrize("key", [None, "", "../x", 7])
async def test_a_record_with_a_bad_key_is_refused_before_anything_is_written(
    store: Store, key: Any
) -> None:
    before = await snapshot(store, "alice", namespaces=["ns"])
    with pytest.raises(InvalidIdError, match="record key"):
        await store.put_record("alice", "ns", key, {"v": 1})
    with pytest.raises(InvalidIdError, match="record key"):
        await store.get_record("alice", "ns", key)
    with pytest.raises(InvalidIdError, match="record key"):
        await store.delete_record("alice", "ns", key)
    assert await snapshot(store, "alice", namespaces=["ns"]) == before


async def test_start_with_a_taken_run_id_creates_no_session(store: Store) -> None:
    runner = Runner(store, "alice", [agent()])
    await runner.start("a", "hi", run_id="r1")
    before = await snapshot(store, "alice")
    with pytest.raises(StatekeeperError, match="already exists"):
        await runner.start("a", "hi", run_id="r1")
    assert await snapshot(store, "alice") == before


async def test_create_with_first_messages_that_fail_leaves_no_session(store: Store) -> None:
    before = await snapshot(store, "alice")
    bad = Message.user("hi", metadata={"v": float("nan")})
    with pytest.raises(InvalidPayloadError):
        await SessionManager(store, "alice").create(session_id="s", messages=[bad])
    assert await snapshot(store, "alice") == before
