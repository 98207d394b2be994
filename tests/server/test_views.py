"""`entry_json` writes a stored message as `Message.to_dict` does, whether it builds the
usual text message from the payload or reads anything else through `stored_message`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.core.messages import Message, Role, stored_message
from statekeeper.errors import InvalidPayloadError
from statekeeper.server.views import entry_json
from statekeeper.stores.base import Entry

_TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(0))]),
)


def _entry(payload: dict[str, Any], created_at: datetime, entry_id: str = "ent_1") -> Entry:
    return Entry(7, entry_id, 6, "message", created_at, payload)


def _agrees(entry: Entry) -> None:
    shown = entry_json(entry, {}, {entry.id})
    message = stored_message(entry.payload, entry.id, entry.created_at)
    assert shown["message"] == message.to_dict()
    assert shown["category"] == message.category.name.lower()
    assert shown["created_at"] == entry.created_at.isoformat()


@given(
    role=st.sampled_from([r.value for r in Role]),
    content=st.text(),
    tokens=st.none() | st.integers(min_value=0),
    with_tokens=st.booleans(),
    created_at=_TIMES,
)
def test_a_text_message_is_written_as_to_dict(
    role: str, content: str, tokens: int | None, with_tokens: bool, created_at: datetime
) -> None:
    payload: dict[str, Any] = {"role": role, "content": content}
    if with_tokens:
        payload["tokens"] = tokens
    _agrees(_entry(payload, created_at))


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "user", "content": "hi", "category": 1},
        {"role": "user", "content": "hi", "name": "bob", "metadata": {"a": [1]}},
        {"role": "user"},
        {"role": "user", "content": "hi", "tokens": True},
        {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
        Message.user("with fields", metadata={"k": "v"}).to_dict()
        | {"id": None, "created_at": None},
    ],
)
def test_other_messages_are_written_as_to_dict(payload: dict[str, Any]) -> None:
    payload = {k: v for k, v in payload.items() if v is not None or k == "name"}
    _agrees(_entry(payload, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)))


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "user", "content": "hi", "tokens": -1},
        {"role": "nobody", "content": "hi"},
        {"role": "user", "content": 3},
    ],
)
def test_a_damaged_message_is_refused_as_stored_message_refuses_it(
    payload: dict[str, Any],
) -> None:
    entry = _entry(payload, datetime(2026, 1, 2, tzinfo=UTC))
    with pytest.raises(InvalidPayloadError):
        stored_message(entry.payload, entry.id, entry.created_at)
    with pytest.raises(InvalidPayloadError):
        entry_json(entry, {}, set())


def test_an_overlong_id_is_refused_too() -> None:
    entry = _entry({"role": "user", "content": "hi"}, datetime(2026, 1, 2, tzinfo=UTC), "e" * 129)
    with pytest.raises(InvalidPayloadError):
        entry_json(entry, {}, set())
