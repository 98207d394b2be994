"""How SQLite splits an entry's payload into columns and rebuilds it (schema 4 and 5)."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.jsoncodec import encode_json, loads
from statekeeper.stores.sqlite.rows import split_payload, stored_payload

texts = st.text(st.characters(codec="utf-8") | st.sampled_from('"\\\x00\n\u2028é😀/'), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(["role", "content", "tokens", "category", "name", "", 'a"\\'])


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    """Dicts shaped like messages (role, then content of any kind or none) and not."""
    items: list[tuple[str, Any]] = []
    if draw(st.booleans()):
        items.append(("role", draw(json_values)))
        content = draw(st.sampled_from(["absent", "text", "json"]))
        if content != "absent":
            items.append(("content", draw(texts if content == "text" else json_values)))
    items += draw(st.lists(st.tuples(keys | texts, json_values), max_size=4))
    tokens = draw(st.none() | st.integers() | st.booleans())
    if tokens is not None:
        items.append(("tokens", tokens))
    # As the plan hands it to the store: plain data, as a read returns it.
    return loads(encode_json(dict(items)))  # type: ignore[no-any-return]


@given(payloads())
def test_a_payload_round_trips_through_its_columns_exactly(payload: dict[str, Any]) -> None:
    text = encode_json(payload)
    columns = split_payload(payload, text)
    stored, tokens, body = columns
    rebuilt = stored_payload(*columns)
    # Equal to the last type and key order, nested ones included.
    assert rebuilt == payload
    assert encode_json(rebuilt) == text
    keys = list(payload)
    if keys[:2] == ["role", "content"] and type(payload["content"]) is str:
        assert body == payload["content"]
        assert "content" not in loads(stored)
    else:
        assert body is None
    if tokens is not None:
        assert keys[-1] == "tokens"
        assert "tokens" not in loads(stored)
    # And through a real SQLite file's column types (a body may hold NUL, quotes ...).
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE entries (payload TEXT NOT NULL, tokens INTEGER, body TEXT)")
    db.execute("INSERT INTO entries VALUES (?, ?, ?)", columns)
    assert stored_payload(*db.execute("SELECT * FROM entries").fetchone()) == rebuilt
    db.close()


def test_a_message_text_is_stored_without_json_escapes() -> None:
    content = 'say "hi"\\n\n\t\x00é'
    payload = {"role": "tool", "content": content, "category": 3, "tokens": 9}
    assert split_payload(payload, encode_json(payload)) == (
        '{"role":"tool","category":3}',
        9,
        content,
    )


def test_a_token_count_an_integer_column_cannot_hold_stays_in_the_json() -> None:
    for count in (2**63, -(2**63) - 1):
        payload = {"role": "user", "content": "x", "tokens": count}
        assert split_payload(payload, encode_json(payload)) == (
            f'{{"role":"user","tokens":{count}}}',
            None,
            "x",
        )
    payload = {"role": "user", "content": "x", "tokens": 2**63 - 1}
    assert split_payload(payload, encode_json(payload))[1] == 2**63 - 1


@pytest.mark.parametrize(
    ("stored", "body", "error"),
    [
        ("{not json", "b", "EOF|expected|key"),
        ('["role", "user"]', "b", "JSON object"),
        ('{"content": "x"}', "b", '"role"'),
        ('{"role": "user", "content": "x"}', "b", '"content"'),
        ('{"role": "user"}', b"b", "bytes"),
        ('{"role": "user"}', 7, "int"),
    ],
)
def test_columns_that_do_not_make_a_message_are_refused(stored: str, body: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        stored_payload(stored, None, body)
