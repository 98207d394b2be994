"""Reading stored messages: the trusted fast path builds what validation would build,
both on a payload alone and through a real SQLite store."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.core.messages import (
    FileBlock,
    ImageBlock,
    Message,
    MessageCategory,
    OtherBlock,
    Role,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    stored_message,
)
from statekeeper.errors import InvalidPayloadError
from statekeeper.jsoncodec import encode_json, loads
from statekeeper.sessions import SessionManager
from statekeeper.sessions.view import message_draft
from statekeeper.stores import open_store

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
ids = st.text(min_size=1, max_size=6)
blocks = st.one_of(
    st.builds(TextBlock, text=st.text(max_size=20)),
    st.builds(ToolCallBlock, id=ids, name=ids, arguments=st.text(max_size=12)),
    st.builds(
        ToolResultBlock, tool_call_id=ids, content=st.text(max_size=20), is_error=st.booleans()
    ),
    st.builds(ImageBlock, url=st.text(max_size=8), detail=st.none() | st.text(max_size=4)),
    st.builds(FileBlock, name=st.none() | st.text(max_size=6), data=st.none() | st.text()),
    st.builds(lambda v: OtherBlock(type="reasoning", summary=v), json_scalars),
)
messages = st.builds(
    Message,
    role=st.sampled_from(list(Role)),
    content=st.text(max_size=40) | st.lists(blocks, max_size=4),
    category=st.none() | st.sampled_from(list(MessageCategory)),
    name=st.none() | st.text(max_size=8),
    metadata=st.dictionaries(st.text(max_size=5), json_scalars, max_size=3),
    tokens=st.none() | st.integers(min_value=0, max_value=10**6),
)


def validated(payload: dict[str, Any], entry_id: str, created_at: datetime) -> Message:
    """The slow path: full validation of what the store holds."""
    return Message.model_validate({**payload, "id": entry_id, "created_at": created_at})


def assert_same(fast: Message, slow: Message) -> None:
    """Equal, and made of the same types all the way down."""
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert repr(fast) == repr(slow)
    assert type(fast.role) is Role
    assert type(fast.category) is MessageCategory
    if isinstance(slow.content, list):
        assert isinstance(fast.content, list)
        assert [type(b) for b in fast.content] == [type(b) for b in slow.content]


@given(messages)
def test_a_stored_message_reads_back_equal_to_the_one_written(message: Message) -> None:
    draft = message_draft(message)
    payload = loads(encode_json(draft.payload))  # as a store returns it
    fast = stored_message(payload, draft.id, draft.created_at)
    assert_same(fast, validated(payload, draft.id, draft.created_at))
    assert fast == message


@settings(max_examples=40, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6))
def test_messages_loaded_from_sqlite_equal_the_validated_ones(batch: list[Message]) -> None:
    async def load() -> tuple[list[Message], list[Message]]:
        with tempfile.TemporaryDirectory() as folder:
            async with open_store(f"sqlite:///{folder}/state.db") as store:
                session = await SessionManager(store, "alice", max_messages=None).create()
                await session.append(*batch)
                entries = await session.entries()
                slow = [validated(e.payload, e.id, e.created_at) for e in entries]
                return await session.messages(), slow

    fast, slow = asyncio.run(load())
    assert len(fast) == len(slow) == len(batch)
    for one, other, written in zip(fast, slow, batch, strict=True):
        assert_same(one, other)
        assert one.model_copy(update={"tokens": written.tokens}) == written  # counted on append


WHEN = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "wizard", "content": "x"},
        {"role": ["user"], "content": "x"},  # not even hashable
        {"role": "user", "content": 5},
        {"role": "user", "content": {"type": "text", "text": "x"}},
        {"role": "user", "content": "x", "category": 99},
        {"role": "user", "content": "x", "tokens": -1},
        {"role": "user", "content": "x", "metadata": None},
        {"role": "user", "content": None},
        {"role": "user", "content": "x", "surprise": True},
        {"role": "user", "content": [{"type": "text"}]},
        {"role": "user", "content": [{"type": "text", "text": 1}]},
        {"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]},
        {"role": "assistant", "content": [{"type": "tool_call", "id": "", "name": "f"}]},
        {"role": "tool", "content": [{"type": "tool_result", "content": "x", "is_error": 0}]},
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "user", "content": ["text"]},
        {"content": "x"},
    ],
)
def test_a_damaged_payload_is_refused_not_loaded(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayloadError):
        stored_message(payload, "m1", WHEN)


@pytest.mark.parametrize("entry_id", ["", "x" * 129, 5])
def test_a_damaged_entry_id_is_refused(entry_id: Any) -> None:
    with pytest.raises(InvalidPayloadError):
        stored_message({"role": "user", "content": "x"}, entry_id, WHEN)


def test_block_content_is_built_into_blocks() -> None:
    payload = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"},
        ],
    }
    message = stored_message(payload, "m1", WHEN)
    assert message.text == "hi"
    assert message.tool_calls == [ToolCallBlock(id="c1", name="f")]
    payload["content"][1]["name"] = "g"  # the entry's payload shares nothing with it
    assert message.tool_calls[0].name == "f"
