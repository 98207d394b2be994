"""Sessions and transcripts: appends, views, branches, forks, conflicts, listing."""

from __future__ import annotations

import asyncio

import pytest

from statekeeper.core.messages import Message, MessageCategory, ToolCallBlock
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    NotFoundError,
)
from statekeeper.retry import retry_on_conflict
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store


async def test_append_and_read_back_in_order(manager: SessionManager) -> None:
    chat = await manager.create(title="t", messages=[Message.system("be brief")])
    await chat.append(Message.user("hi"))
    await chat.append(Message.assistant("hello"), Message.user("bye"))

    again = await manager.get(chat.id)
    texts = [m.text for m in await again.messages()]
    assert texts == ["be brief", "hi", "hello", "bye"]
    assert again.record.message_count == 4
    assert again.record.head_seq == again.record.last_seq == 4
    assert again.record.total_tokens == again.record.fresh_tokens > 0
    assert all(m.tokens and m.tokens > 0 for m in await again.messages())


async def test_message_fields_round_trip(manager: SessionManager) -> None:
    call = ToolCallBlock(id="c1", name="search", arguments='{"q": "é"}')
    sent = [
        Message.assistant("looking", tool_calls=[call], metadata={"k": [1, 2.5, None]}),
        Message.tool_result("c1", "found", is_error=True),
        Message.context("ref doc"),
    ]
    chat = await manager.create(messages=sent)
    got = await (await manager.get(chat.id)).messages()
    assert [m.model_dump(exclude={"tokens"}) for m in got] == [
        m.model_dump(exclude={"tokens"}) for m in sent
    ]
    assert got[2].category is MessageCategory.CONTEXT


async def test_second_writer_gets_a_conflict_not_an_interleaving(manager: SessionManager) -> None:
    chat = await manager.create()
    other = await manager.get(chat.id)
    await chat.append(Message.user("from A"))
    with pytest.raises(ConflictError):
        await other.append(Message.user("from B"))
    assert [m.text for m in await chat.messages()] == ["from A"]

    await retry_on_conflict(
        lambda: other.append(Message.user("from B")), before_retry=other.refresh
    )
    assert [m.text for m in await chat.messages()] == ["from A", "from B"]


async def test_non_strict_appends_are_serialised_into_one_chain(manager: SessionManager) -> None:
    chat = await manager.create()
    handles = [await manager.get(chat.id) for _ in range(10)]
    await asyncio.gather(
        *(h.append(Message.user(f"m{i}"), strict=False) for i, h in enumerate(handles))
    )
    branch = await (await manager.get(chat.id)).branch()
    assert [e.seq for e in branch] == list(range(1, 11))
    assert [e.parent_seq for e in branch] == [None, *range(1, 10)]


async def test_retrying_the_same_message_does_not_duplicate_it(manager: SessionManager) -> None:
    chat = await manager.create()
    message = Message.user("once")
    await chat.append(message)
    outcome = await chat.append(message)
    assert [e.seq for e in outcome.entries] == [1]
    assert len(await chat.messages()) == 1
    assert chat.record.message_count == 1


async def test_checkout_makes_a_branch_and_keeps_the_other(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.user("q"), Message.assistant("a1")])
    await chat.checkout(1)
    await chat.append(Message.assistant("a2"))
    assert [m.text for m in await chat.messages()] == ["q", "a2"]
    assert len(await chat.entries()) == 3  # a1 is still stored
    await chat.checkout(2)
    assert [m.text for m in await chat.messages()] == ["q", "a1"]
    with pytest.raises(InvalidInputError):
        await chat.checkout(99)


async def test_fork_shares_history_without_copying(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.user(f"m{i}") for i in range(5)])
    fork = await chat.fork(at=3, title="alt")
    await fork.append(Message.user("alt-4"))
    await chat.append(Message.user("m5"))
    assert [m.text for m in await fork.messages()] == ["m0", "m1", "m2", "alt-4"]
    assert len(await fork.entries()) == 1  # only its own entry is stored
    assert fork.record.forked_from is not None
    assert fork.record.forked_from.session_id == chat.id
    assert [m.text for m in await chat.messages()][-1] == "m5"

    entry_id = (await chat.entries())[1].id
    by_id = await chat.fork(at=entry_id)
    assert [m.text for m in await by_id.messages()] == ["m0", "m1"]
    fork_of_fork = await fork.fork()
    assert [m.text for m in await fork_of_fork.messages()] == ["m0", "m1", "m2", "alt-4"]


async def test_listing_pages_through_every_session_once(manager: SessionManager) -> None:
    created = {(await manager.create(title=f"s{i}", metadata={"n": i % 2})).id for i in range(7)}
    seen: list[str] = []
    cursor = None
    while True:
        page = await manager.list(limit=3, cursor=cursor)
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted(created)
    assert len(seen) == len(set(seen))
    odd = [r async for r in manager.iter(metadata={"n": 1})]
    assert len(odd) == 3


async def test_delete_removes_the_whole_session(manager: SessionManager) -> None:
    chat = await manager.create(messages=[Message.user("x")])
    await chat.delete()
    with pytest.raises(NotFoundError):
        await manager.get(chat.id)
    with pytest.raises(NotFoundError):
        await manager.delete(chat.id)


async def test_tenants_cannot_see_each_other(store: Store) -> None:
    alice = SessionManager(store, "alice")
    bob = SessionManager(store, "bob")
    chat = await alice.create(session_id="shared-name", messages=[Message.user("secret")])
    with pytest.raises(NotFoundError):
        await bob.get(chat.id)
    assert (await bob.list()).items == []
    bobs = await bob.create(session_id="shared-name")
    assert await bobs.messages() == []
    with pytest.raises(AlreadyExistsError):
        await alice.create(session_id="shared-name")


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 10_000, "..", "a b"])
async def test_hostile_session_ids_are_refused(manager: SessionManager, bad: str) -> None:
    with pytest.raises(InvalidIdError):
        await manager.create(session_id=bad)
    with pytest.raises(InvalidIdError):
        await manager.get(bad)
    assert (await manager.list()).items == []


async def test_reserved_tenant_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInputError):
        SessionManager(store, "statekeeper.app")
