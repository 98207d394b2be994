"""Bad arguments to sessions, stores and the event bus raise typed errors naming the fix,
and change nothing (on every backend)."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper import InvalidIdError, InvalidInputError, InvalidPayloadError, Message
from statekeeper.jsoncodec import MAX_JSON_DEPTH
from statekeeper.runtime.events import EventBus
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

T = "alice"


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def no_sessions(manager: SessionManager) -> bool:
    return (await manager.list()).items == []


async def test_create_with_bytes_in_metadata_is_typed(manager: SessionManager) -> None:
    with pytest.raises(InvalidPayloadError, match=r"metadata\.v: .*JSON") as caught:
        await manager.create(metadata={"v": b"x"})  # type: ignore[dict-item]
    assert "session" in str(caught.value)
    assert await no_sessions(manager)


async def test_create_with_an_integer_key_names_the_key(manager: SessionManager) -> None:
    with pytest.raises(InvalidPayloadError, match=r"key 1 .*must be strings \(use '1'\)"):
        await manager.create(metadata={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(InvalidPayloadError, match=r"metadata\.a: the key 2"):
        await manager.create(metadata={"a": {2: "x"}})  # type: ignore[dict-item]
    assert await no_sessions(manager)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 5, 5000])
async def test_create_with_deeply_nested_metadata_names_the_limit(
    manager: SessionManager, depth: int
) -> None:
    with pytest.raises(InvalidPayloadError, match=f"limit is {MAX_JSON_DEPTH} levels"):
        await manager.create(metadata={"v": nested(depth)})
    assert await no_sessions(manager)


async def test_a_deeply_nested_message_is_refused_and_not_appended(
    manager: SessionManager,
) -> None:
    session = await manager.create()
    with pytest.raises(InvalidPayloadError, match=f"limit is {MAX_JSON_DEPTH} levels"):
        await session.append(Message.user("hi", metadata={"v": nested(MAX_JSON_DEPTH + 5)}))
    assert await session.entries() == []


@pytest.mark.parametrize("limit", [0, -1, 1001])
async def test_list_with_a_bad_limit_is_typed(manager: SessionManager, limit: Any) -> None:
    with pytest.raises(InvalidInputError, match="limit") as caught:
        await manager.list(limit=limit)
    assert "1" in str(caught.value)


@pytest.mark.parametrize(
    "paging",
    [
        {"limit": "5"},
        {"limit": 5.0},
        {"limit": True},
        {"offset": "2"},
        {"offset": True},
        {"cursor": 5},
    ],
)
async def test_list_with_paging_of_the_wrong_type_is_refused_not_coerced(
    manager: SessionManager, paging: dict[str, Any]
) -> None:
    (name,) = paging
    with pytest.raises(InvalidPayloadError, match=name):
        await manager.list(**paging)


async def test_list_with_metadata_that_is_not_a_dict_is_typed(manager: SessionManager) -> None:
    with pytest.raises(InvalidInputError, match=r"metadata filter must be a dict.*\{'key'"):
        await manager.list(metadata="str")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["text", {"role": "user"}, None])
async def test_append_of_something_not_a_message_is_typed(
    manager: SessionManager, bad: Any
) -> None:
    session = await manager.create()
    with pytest.raises(InvalidInputError, match=r"Message\.user"):
        await session.append(Message.user("ok"), bad)
    assert await session.entries() == []


@pytest.mark.parametrize("at", [b"x", 1.5, True, ["1"]])
async def test_fork_at_something_not_a_seq_or_entry_id_is_typed(
    manager: SessionManager, at: Any
) -> None:
    session = await manager.create(messages=[Message.user("hi")])
    with pytest.raises(InvalidInputError, match=r"seq number.*or an entry id"):
        await session.fork(at=at)
    with pytest.raises(InvalidInputError, match=r"seq number.*or an entry id"):
        await session.checkout(at)
    assert [r.id for r in (await manager.list()).items] == [session.id]


@pytest.mark.parametrize(
    ("field", "value"), [("after_seq", "a"), ("after_seq", None), ("until_seq", "3")]
)
async def test_reading_entries_with_a_seq_that_is_not_a_number_is_typed(
    store: Store, manager: SessionManager, field: str, value: Any
) -> None:
    session = await manager.create(messages=[Message.user("hi")])
    with pytest.raises(InvalidInputError, match=f"{field} must be a whole number"):
        await store.read_entries(T, session.id, **{field: value})
    with pytest.raises(InvalidInputError, match=f"{field} must be a whole number"):
        await session.entries(**{field: value})


async def test_reading_events_with_a_seq_that_is_not_a_number_is_typed(store: Store) -> None:
    with pytest.raises(InvalidInputError, match="after_seq must be a whole number"):
        await store.read_events(T, "log1", after_seq="a")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="limit must be"):
        await store.read_events(T, "log1", limit="2")  # type: ignore[arg-type]


async def test_a_record_with_an_integer_key_is_refused_not_stringified(store: Store) -> None:
    with pytest.raises(InvalidPayloadError, match=r"key 1 .*must be strings"):
        await store.put_record(T, "ns", "k", {"a": {1: "x"}})  # type: ignore[dict-item]
    assert await store.list_records(T, "ns") == []


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 5, 300, 5000])
async def test_a_deeply_nested_record_is_refused_not_stored(store: Store, depth: int) -> None:
    with pytest.raises(InvalidPayloadError, match=f"limit is {MAX_JSON_DEPTH} levels"):
        await store.put_record(T, "ns", "k", {"v": nested(depth)})
    assert await store.list_records(T, "ns") == []


@pytest.mark.parametrize("run_id", [["r1"], {"r": 1}, None, 7])
async def test_publish_with_a_run_id_that_is_not_a_string_is_typed(
    store: Store, run_id: Any
) -> None:
    bus = EventBus(store, T)
    with pytest.raises(InvalidIdError, match="run id must be a string"):
        await bus.publish(run_id, "run", "started")


async def test_publish_with_a_deeply_nested_payload_is_typed(store: Store) -> None:
    bus = EventBus(store, T)
    with pytest.raises(InvalidPayloadError, match=f"limit is {MAX_JSON_DEPTH} levels"):
        await bus.publish("r1", "run", "started", {"v": nested(5000)})
    assert await store.read_events(T, "r1") == []
