"""Reading stored messages: the trusted fast path builds what validation would build."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.core.messages import Message, MessageCategory, Role, stored_message
from statekeeper.errors import InvalidPayloadError
from statekeeper.jsoncodec import encode_json, loads
from statekeeper.sessions.view import message_draft

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
messages = st.builds(
    Message,
    role=st.sampled_from(list(Role)),
    content=st.text(max_size=40),
    category=st.none() | st.sampled_from(list(MessageCategory)),
    name=st.none() | st.text(max_size=8),
    metadata=st.dictionaries(st.text(max_size=5), json_scalars, max_size=3),
    tokens=st.none() | st.integers(min_value=0, max_value=10**6),
)


@given(messages)
def test_a_stored_message_reads_back_equal_to_the_one_written(message: Message) -> None:
    draft = message_draft(message)
    payload = loads(encode_json(draft.payload))  # as a store returns it
    fast = stored_message(payload, draft.id, draft.created_at)
    slow = Message.model_validate({**payload, "id": draft.id, "created_at": draft.created_at})
    assert fast == slow == message
    assert fast.model_dump() == slow.model_dump()
    assert type(fast.role) is Role
    assert type(fast.category) is MessageCategory


WHEN = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "wizard", "content": "x"},
        {"role": "user", "content": 5},
        {"role": "user", "content": "x", "category": 99},
        {"role": "user", "content": "x", "tokens": -1},
        {"role": "user", "content": "x", "surprise": True},
        {"role": "user", "content": [{"type": "text"}]},
        {"content": "x"},
    ],
)
def test_a_damaged_payload_is_refused_not_loaded(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayloadError):
        stored_message(payload, "m1", WHEN)


def test_block_content_is_validated_into_blocks() -> None:
    payload = {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}
    message = stored_message(payload, "m1", WHEN)
    assert message.text == "hi"
