"""`StatekeeperSession` raises the exception types the OpenAI Agents SDK's callers catch
(its own tests expect ``TypeError`` for unknown ``SessionSettings`` fields and for items
``add_items`` cannot store, as ``SQLiteSession`` raises), while staying statekeeper's
typed errors; side by side with ``SQLiteSession`` where both refuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import SQLiteSession

from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.integrations.openai_agents import (
    InvalidItemsError,
    InvalidSessionSettingsError,
    StatekeeperSession,
)
from statekeeper.stores import Store, open_store

BAD_SETTINGS: list[Any] = [{"limitt": 1}, {"limit": 2, "other": True}, 5, "limit=2"]


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with open_store("memory://") as opened:
        yield opened


@pytest.mark.parametrize("settings", BAD_SETTINGS)
async def test_unknown_or_wrong_session_settings_are_a_type_error(
    settings: Any, store: Store, tmp_path: Path
) -> None:
    with pytest.raises(TypeError) as theirs:
        SQLiteSession("s", tmp_path / "sdk.db", session_settings=settings)
    with pytest.raises(TypeError) as ours:
        StatekeeperSession("s", store, session_settings=settings)
    assert isinstance(ours.value, InvalidSessionSettingsError)
    assert isinstance(ours.value, InvalidInputError)
    assert str(theirs.value) in str(ours.value)  # e.g. "Unknown session settings: limitt"
    with pytest.raises(TypeError):
        StatekeeperSession.from_url("s", "memory://", session_settings=settings)


def test_the_sdks_own_check_of_unknown_settings_passes(store: Store) -> None:
    # tests/memory/test_session.py::test_session_settings_rejects_unknown_dictionary_fields
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        StatekeeperSession("invalid_settings_test", store, session_settings={"limitt": 1})


async def test_a_bad_settings_value_is_also_a_value_error(store: Store) -> None:
    # The SDK's SessionSettings raise pydantic's ValidationError (a ValueError) for it.
    with pytest.raises(ValueError) as ours:
        StatekeeperSession("s", store, session_settings={"limit": "many"})
    assert isinstance(ours.value, InvalidSessionSettingsError)
    assert isinstance(ours.value, TypeError)  # whichever of the two a caller catches


BAD_ITEMS: list[Any] = [
    [{"role": "user", "content": object()}],  # SQLiteSession: json.dumps raises TypeError
    [{"role": "user", "content": b"bytes"}],
    [{"role": "user", "content": "fine"}, {"blob": {1, 2}}],
]


@pytest.mark.parametrize("items", BAD_ITEMS)
async def test_items_that_cannot_be_stored_are_a_type_error(
    items: list[Any], store: Store, tmp_path: Path
) -> None:
    theirs = SQLiteSession("s", tmp_path / "sdk.db")
    try:
        with pytest.raises(TypeError):
            await theirs.add_items(items)
    finally:
        theirs.close()
    ours = StatekeeperSession("s", store)
    with pytest.raises(TypeError) as raised:
        await ours.add_items(items)
    assert isinstance(raised.value, InvalidItemsError | InvalidPayloadError)
    assert await ours.get_items() == []  # nothing stored


@pytest.mark.parametrize("items", [["a string"], [["a", "list"]], {"role": "user"}, "text"])
async def test_items_that_are_not_a_list_of_objects_are_a_type_error(
    items: Any, store: Store
) -> None:
    session = StatekeeperSession("s", store)
    with pytest.raises(TypeError) as raised:
        await session.add_items(items)
    assert isinstance(raised.value, InvalidPayloadError)
    assert await session.get_items() == []
