"""Writes through any id of a continuation chain reach the chain's live session.

A chain A -> B -> C: a handle opened on A (or B) follows the ``continued_to`` links to C
before it writes, for every write a handle offers; a write planned on a head that another
handle continued meanwhile is refused by the compare-and-set, never stored in the
continued session. Runs on every backend (the ``store`` fixture).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import ConflictError
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores import Store
from statekeeper.stores.base import SessionPatch, SessionRecord


async def _summarize(messages: list[Message]) -> str:
    return f"{len(messages)} messages"


Write = Callable[[Session], Awaitable[object]]

WRITES: dict[str, Write] = {
    "append": lambda s: s.append(Message.user("late")),
    "append non-strict": lambda s: s.append(Message.user("late"), strict=False),
    "append_items": lambda s: s.append_items([{"role": "user", "content": "late"}]),
    "append_items verbatim": lambda s: s.append_items([{"type": "x", "v": 1}], verbatim=True),
    "state.update": lambda s: s.state.update({"draft": "late", "user:seen": 1}),
    "state.delete": lambda s: s.state.delete("draft"),
    "compact": lambda s: s.compact(_summarize, keep_last=0),
    "clear": lambda s: s.clear(),
    "pop": lambda s: s.pop(),
    "update": lambda s: s.update(title="renamed"),
}


async def _chain(store: Store) -> tuple[SessionManager, list[str]]:
    """Sessions A -> B -> C (A and B continued, C live), each with a few messages."""
    manager = SessionManager(store, "alice", agent_id="bot", max_messages=None)
    chat = await manager.create(messages=[Message.system("sys"), Message.user("u0")])
    await chat.state.update({"draft": "d"})
    ids = [chat.id]
    for n in (1, 2):
        await chat.continue_session()
        await chat.append(Message.user(f"u{n}"), Message.assistant(f"a{n}"))
        ids.append(chat.id)
    return manager, ids


async def _heads(store: Store, ids: list[str]) -> list[SessionRecord]:
    return [await store.get_session("alice", i) for i in ids]


@pytest.mark.parametrize("name", list(WRITES))
@pytest.mark.parametrize("through", [0, 1], ids=["first", "middle"])
async def test_a_write_through_an_old_id_reaches_the_live_session(
    store: Store, name: str, through: int
) -> None:
    manager, ids = await _chain(store)
    before = await _heads(store, ids)
    handle = await manager.get(ids[through])

    await WRITES[name](handle)

    after = await _heads(store, ids)
    assert [r.version for r in after[:2]] == [r.version for r in before[:2]]  # A, B untouched
    assert after[2].version > before[2].version  # the write landed in C
    assert handle.id == ids[2]
    assert (await manager.latest(ids[0])).id == ids[2]


async def test_the_appended_message_shows_in_the_latest_session(store: Store) -> None:
    manager, ids = await _chain(store)
    bounded = SessionManager(store, "alice", agent_id="bot", max_messages=50)
    outcome = await (await bounded.get(ids[0])).append(Message.user("where did this go?"))
    assert outcome.session_id == ids[2]
    assert outcome.continued_from == ids[0]
    latest = await manager.latest(ids[0])
    assert (await latest.messages())[-1].text == "where did this go?"
    middle = await manager.get(ids[1])
    assert middle.record.message_count == 4  # marker, sys, u1, a1: nothing added


async def test_checkout_of_a_continued_session_is_refused_naming_the_live_one(
    store: Store,
) -> None:
    manager, ids = await _chain(store)
    before = await _heads(store, ids)
    handle = await manager.get(ids[0])
    with pytest.raises(ConflictError, match=ids[2]):
        await handle.checkout(1)
    assert await _heads(store, ids) == before


async def test_continue_session_on_an_old_id_moves_to_the_live_session(store: Store) -> None:
    manager, ids = await _chain(store)
    handle = await manager.get(ids[0])
    await handle.continue_session()  # a retry of an earlier continuation: nothing new
    assert handle.id == ids[2]
    assert (await store.get_session("alice", ids[2])).continued_to is None


async def test_a_link_a_crash_left_reserved_is_finished_on_the_way(store: Store) -> None:
    manager, ids = await _chain(store)
    live = await manager.get(ids[2])
    await store.update_session(
        "alice", live.id, SessionPatch(set={"continued_to": "ses-next"}), expected_version=None
    )
    outcome = await (await manager.get(ids[0])).append(Message.user("late"))
    assert outcome.session_id == "ses-next"
    assert (await store.get_session("alice", "ses-next")).continued_from == ids[2]
    assert [m.text for m in await (await manager.latest(ids[0])).messages()][-1] == "late"


@pytest.mark.parametrize("name", list(WRITES))
async def test_a_continuation_committed_after_loading_keeps_the_write_out(
    store: Store, name: str
) -> None:
    """Another handle continues A between this handle's load and its write: the write
    is refused (ConflictError) or goes to the live session, never into A."""
    manager = SessionManager(store, "alice", agent_id="bot", max_messages=None)
    chat = await manager.create(messages=[Message.system("sys"), Message.user("u0")])
    await chat.state.update({"draft": "d"})
    await chat.append(Message.user("u1"), Message.assistant("a1"))
    stale = await manager.get(chat.id)  # loaded while A is live
    mover = await manager.get(chat.id)
    await mover.continue_session()  # committed by someone else
    await mover.append(Message.user("u2"), Message.assistant("a2"))
    continued = await store.get_session("alice", chat.id)
    live_before = await store.get_session("alice", mover.id)

    try:
        await WRITES[name](stale)
    except ConflictError:
        landed = False
    else:
        landed = True

    assert await store.get_session("alice", chat.id) == continued  # nothing entered A
    live_after = await store.get_session("alice", mover.id)
    assert (live_after.version > live_before.version) == landed
    if landed:
        assert stale.id == mover.id


async def test_a_strict_append_after_a_continuation_names_the_live_session(
    store: Store,
) -> None:
    manager = SessionManager(store, "alice", max_messages=None)
    chat = await manager.create(messages=[Message.user("u0")])
    stale = await manager.get(chat.id)
    await chat.continue_session()
    with pytest.raises(ConflictError, match=chat.id):
        await stale.append(Message.user("late"))
    await stale.refresh()
    outcome = await stale.append(Message.user("late"))  # the retry follows the link
    assert outcome.session_id == chat.id


async def test_a_continuation_while_the_summariser_runs_keeps_the_compaction_out(
    store: Store,
) -> None:
    manager = SessionManager(store, "alice", max_messages=None)
    chat = await manager.create(messages=[Message.user(f"u{i}") for i in range(4)])
    mover = await manager.get(chat.id)

    async def summarize_while_moving(messages: list[Message]) -> str:
        await mover.continue_session()  # another writer, while the LLM call runs
        return "summary"

    with pytest.raises(ConflictError, match=mover.id):
        await chat.compact(summarize_while_moving, keep_last=1)
    old = await store.get_session("alice", chat.id)
    assert old.compaction_count == 0
    assert old.last_seq == 4


async def test_the_issue_scenario_two_boundary_continuations_then_an_append_through_a(
    store: Store,
) -> None:
    manager = SessionManager(store, "alice", max_messages=6)
    chat = await manager.create(messages=[Message.system("sys")])
    first = chat.id
    while chat.record.continuation_index < 2:
        await chat.append(Message.user("q"), Message.assistant("a"))
    live = chat.id
    middle = (await store.get_session("alice", first)).continued_to
    assert middle is not None
    middle_before = await store.get_session("alice", middle)

    outcome = await (await manager.get(first)).append(Message.user("late"))

    assert outcome.session_id == (await manager.latest(first)).id
    assert outcome.session_id in (live, (await store.get_session("alice", live)).continued_to)
    assert await store.get_session("alice", middle) == middle_before
    latest = await manager.latest(first)
    assert (await latest.messages())[-1].text == "late"
    assert latest.record.message_count <= 6
