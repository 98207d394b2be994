"""Defaults a new user relies on, and the basics other session libraries have:
get-or-create, pop, clear, verbatim items (issue 11, "defaults and surfaces")."""

from __future__ import annotations

import asyncio
import json

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store


async def test_no_silent_continuation_by_default() -> None:
    store = await open_store("memory://")
    manager = SessionManager(store, "alice")
    chat = await manager.create(session_id="long")
    for batch in range(200):
        await chat.append(*[Message.user(f"m{batch}-{i}") for i in range(100)])
    assert chat.id == "long"
    document = await manager.export("long")
    assert len(document["entries"]) == 20_000
    page = await manager.list()
    assert [r.id for r in page.items] == ["long"]
    await store.close()


async def test_a_budget_smaller_than_what_a_continuation_carries_is_refused(
    store: Store,
) -> None:
    manager = SessionManager(store, "alice", max_tokens=30)
    chat = await manager.create()
    first = chat.id
    appended = 0

    async def append_ten() -> None:
        nonlocal appended
        for i in range(10):
            await chat.append(Message.user(f"message number {i} with a few words"))
            appended += 1

    with pytest.raises(InvalidInputError, match="max_tokens"):
        await append_ten()
    assert appended < 10
    assert chat.id == first
    assert [r.id for r in (await manager.list()).items] == [first]  # no chain was made


async def test_a_message_budget_too_small_to_carry_is_refused(store: Store) -> None:
    manager = SessionManager(store, "alice", max_messages=4)
    chat = await manager.create(
        messages=[Message.system("s1"), Message.system("s2"), Message.context("c")]
    )
    with pytest.raises(InvalidInputError, match="max_messages"):
        await chat.append(Message.user("u1"), Message.user("u2"))
    assert chat.record.message_count == 3
    assert len((await manager.list()).items) == 1


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_boundaries_must_be_positive_integers(bad: object) -> None:
    store = object()
    with pytest.raises(InvalidInputError, match="max_messages"):
        SessionManager(store, "alice", max_messages=bad)  # type: ignore[arg-type]


async def test_a_manager_lists_its_own_agents_sessions(store: Store) -> None:
    bot1 = SessionManager(store, "alice", agent_id="bot1")
    bot2 = SessionManager(store, "alice", agent_id="bot2")
    mine = await bot1.create()
    theirs = await bot2.create()
    assert [r.id for r in (await bot1.list()).items] == [mine.id]
    assert [r.id async for r in bot2.iter()] == [theirs.id]
    assert {r.id for r in (await bot1.list(all_agents=True)).items} == {mine.id, theirs.id}
    assert [r.id for r in (await bot1.list(agent_id="bot2")).items] == [theirs.id]
    everyone = SessionManager(store, "alice")
    assert len((await everyone.list()).items) == 2


async def test_get_or_create_is_safe_for_concurrent_first_writers(store: Store) -> None:
    manager = SessionManager(store, "alice", agent_id="bot")
    first, second = await asyncio.gather(
        manager.get_or_create("chat-1", title="t"), manager.get_or_create("chat-1", title="t")
    )
    assert first.id == second.id == "chat-1"
    assert first.record.created_at == second.record.created_at
    assert [r.id for r in (await manager.list()).items] == ["chat-1"]
    await first.append(Message.user("hi"))
    again = await manager.get_or_create("chat-1")
    assert [m.text for m in await again.messages()] == ["hi"]


async def test_pop_moves_the_head_back_and_keeps_the_entry(store: Store) -> None:
    manager = SessionManager(store, "alice")
    chat = await manager.create(messages=[Message.user("u1"), Message.assistant("a1")])
    await chat.append(Message.user("u2"))
    popped = await chat.pop()
    assert isinstance(popped, Message)
    assert popped.text == "u2"
    assert [m.text for m in await chat.messages()] == ["u1", "a1"]
    assert chat.record.message_count == 2
    assert popped.id in {e.id for e in await chat.entries()}  # still readable
    await chat.append(Message.user("u2b"))
    assert [m.text for m in await chat.messages()] == ["u1", "a1", "u2b"]
    assert (await chat.pop()).text == "u2b"  # type: ignore[union-attr]
    assert (await chat.pop()).text == "a1"  # type: ignore[union-attr]
    assert (await chat.pop()).text == "u1"  # type: ignore[union-attr]
    with pytest.raises(InvalidInputError, match="nothing to pop"):
        await chat.pop()


async def test_pop_on_a_fork_stops_at_the_fork_point(store: Store) -> None:
    manager = SessionManager(store, "alice")
    chat = await manager.create(messages=[Message.user("u1"), Message.assistant("a1")])
    fork = await chat.fork()
    await fork.append(Message.user("f1"))
    assert (await fork.pop()).text == "f1"  # type: ignore[union-attr]
    assert [m.text for m in await fork.messages()] == ["u1", "a1"]
    with pytest.raises(InvalidInputError, match="forked"):
        await fork.pop()


async def test_clear_empties_the_view_and_keeps_history(store: Store) -> None:
    manager = SessionManager(store, "alice")
    chat = await manager.create(messages=[Message.system("s"), Message.user("u1")])
    await chat.clear()
    assert await chat.messages() == []
    assert chat.record.message_count == 0
    assert chat.record.fresh_tokens == 0
    assert {"s", "u1"} <= {e.payload.get("content") for e in await chat.entries()}
    with pytest.raises(InvalidInputError, match="nothing to pop"):
        await chat.pop()
    await chat.append(Message.user("again"))
    assert [m.text for m in await (await manager.get(chat.id)).messages()] == ["again"]
    fork = await chat.fork(at=2)
    await fork.clear()
    assert await fork.messages() == []


async def test_items_are_stored_verbatim_when_asked(store: Store) -> None:
    manager = SessionManager(store, "alice")
    chat = await manager.create()
    raw = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
            "zeta": 1,
            "alpha": {"b": 2, "a": [1.0, -0.0, None]},
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    await chat.append_items(raw, verbatim=True)
    await chat.append(Message.assistant("between"))
    await chat.append_items([{"role": "user", "content": "plain"}])
    reopened = await manager.get(chat.id)
    items = await reopened.items()
    assert json.dumps(items[:2]) == json.dumps(raw)
    assert items[2]["role"] == "assistant"
    assert items[3]["role"] == "user"
    assert [m.text for m in await reopened.messages()] == ["between", "plain"]
    popped = await reopened.pop()
    assert isinstance(popped, Message)
    assert popped.text == "plain"
    await reopened.pop()
    assert json.dumps(await reopened.pop()) == json.dumps(raw[1])
    with pytest.raises(InvalidInputError, match="item 0 of append_items"):
        await chat.append_items([{"x": b"bytes"}], verbatim=True)  # type: ignore[dict-item]
