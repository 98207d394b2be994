"""Session boundaries, continuation sessions, scoped key-value state, context windows."""

from __future__ import annotations

import pytest

from statekeeper.core.messages import Message, MessageCategory
from statekeeper.errors import InvalidInputError
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store
from statekeeper.stores.base import EntryKind, SessionPatch


async def test_crossing_the_boundary_continues_in_a_linked_session(store: Store) -> None:
    manager = SessionManager(store, "alice", max_messages=6)
    chat = await manager.create(messages=[Message.system("sys"), Message.context("doc")])
    first = chat.id
    await chat.append(Message.user("u1"), Message.assistant("a1"))
    await chat.append(Message.user("u1b"), Message.assistant("a1b"))
    outcome = await chat.append(Message.user("u2"))

    assert outcome.continued_from == first
    assert chat.id != first
    assert chat.record.continued_from == first
    assert chat.record.continuation_index == 1
    old = await manager.get(first)
    assert old.record.continued_to == chat.id
    view = await chat.messages()
    assert [m.text for m in view[:2]] == ["sys", "doc"]
    assert view[2].metadata["statekeeper.marker"] == "continuation"
    assert view[-1].text == "u2"
    assert all(m.category <= MessageCategory.CONTEXT for m in view[:3])
    assert (await manager.latest(first)).id == chat.id


async def test_continuation_reserved_before_a_crash_is_finished_later(store: Store) -> None:
    manager = SessionManager(store, "alice", max_messages=None)
    chat = await manager.create(messages=[Message.system("sys"), Message.user("u")])
    # A crash after reserving the link and before creating the continuation:
    await store.update_session("alice", chat.id, SessionPatch(set={"continued_to": "ses-next"}))
    assert (await manager.latest(chat.id)).id == chat.id
    await chat.continue_session()
    assert chat.id == "ses-next"
    assert chat.record.continued_from is not None
    assert (await manager.latest(chat.record.continued_from)).id == "ses-next"


async def test_token_boundary(store: Store) -> None:
    manager = SessionManager(store, "alice", max_messages=None, max_tokens=60)
    chat = await manager.create()
    first = chat.id
    for i in range(10):
        await chat.append(Message.user(f"message number {i} with a few words"))
    assert chat.id != first
    assert chat.record.fresh_tokens <= 60 or chat.record.message_count <= 2
    assert chat.record.continuation_index <= 4  # not a chain of near-empty sessions


async def test_scoped_state(store: Store) -> None:
    manager = SessionManager(store, "alice", agent_id="bot", max_messages=None)
    chat = await manager.create()
    await chat.state.update({"draft": "d1", "user:locale": "fr", "app:theme": "dark", "temp:x": 1})
    assert await chat.state.get("draft") == "d1"
    assert await chat.state.get("temp:x") == 1

    other = await manager.create()
    assert await other.state.get("user:locale") == "fr"
    assert await other.state.get("app:theme") == "dark"
    assert await other.state.get("draft") is None

    reopened = await manager.get(chat.id)
    assert await reopened.state.get("draft") == "d1"
    assert await reopened.state.get("temp:x") is None  # never persisted

    bob = await SessionManager(store, "bob", agent_id="bot").create()
    assert await bob.state.get("user:locale") is None
    assert await bob.state.get("app:theme") == "dark"

    await chat.state.delete("draft", "user:locale")
    assert await chat.state.get("draft") is None
    assert await other.state.get("user:locale") is None
    deltas = [e.payload["delta"] for e in await chat.entries() if e.kind == EntryKind.STATE]
    assert deltas[0]["session"]["set"] == {"draft": "d1"}
    assert deltas[1]["session"]["deleted"] == ["draft"]
    assert all("temp" not in d for d in deltas)
    assert await chat.messages() == []  # state entries are not messages

    with pytest.raises(InvalidInputError):
        await chat.state.update({"user:": 1})


async def test_context_window_keeps_system_and_newest_dialog(manager: SessionManager) -> None:
    chat = await manager.create(
        messages=[Message.system("rules")] + [Message.user(f"turn {i} " * 5) for i in range(20)]
    )
    window = await chat.context_window(budget=60)
    assert window.messages[0].text == "rules"
    assert window.tokens <= 60
    assert window.messages[-1].text == ("turn 19 " * 5)
    kept = [m.text for m in window.messages[1:]]
    assert kept == [m.text for m in (await chat.messages())[-len(kept) :]]
