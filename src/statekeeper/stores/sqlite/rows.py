"""The SQLite store's rows: the SQL of heads and entries, and how a row maps to data.

A head is its document plus the live columns of schema version 3; an entry's payload is
its JSON plus, since version 4, a token count kept in a column and, since version 5, a
message's text kept in a column (see `schema`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from statekeeper.jsoncodec import encode_json, gc_paused, loads
from statekeeper.stores.base import Entry
from statekeeper.stores.rules import corrupt_entry, document_fields
from statekeeper.stores.sqlite.records import _dt
from statekeeper.stores.sqlite.schema import LIVE_COLUMNS

__all__ = [
    "DOC_FIELDS",
    "HEAD_COLUMNS",
    "SAVE_ALL",
    "SAVE_LIVE",
    "SELECT_ENTRIES",
    "entries_of",
    "joined_payload",
    "metadata_conditions",
    "split_payload",
    "split_tokens",
    "stored_entry",
    "stored_payload",
]

SELECT_ENTRIES = (
    "SELECT rid & 4294967295, id, parent_seq, kind, created_us, payload, tokens, body FROM entries"
)
HEAD_COLUMNS = f"doc, active_us, version, {', '.join(LIVE_COLUMNS)}"
_LIVE_SET = ", ".join(f"{name}=?" for name in LIVE_COLUMNS)
SAVE_LIVE = f"UPDATE sessions SET active_us=?, version=?, {_LIVE_SET} WHERE sk=? AND version=?"
SAVE_ALL = (
    f"UPDATE sessions SET active_us=?, version=?, {_LIVE_SET}, agent_id=?, doc=? "
    "WHERE sk=? AND version=?"
)
DOC_FIELDS = document_fields(LIVE_COLUMNS)
"""Head fields kept only in the head document (an append leaves them as stored)."""


_INT64 = 2**63  # what an INTEGER column holds: -2^63 <= n < 2^63
_EXACT_US = 2**52  # times whose float seconds convert exactly (see rules.from_micros)


def _count(payload: dict[str, Any]) -> int | None:
    """The token count to keep in its column: the last key's, when that is ``"tokens"``
    with an int the column holds (schema version 4)."""
    tokens = payload.get("tokens")
    if type(tokens) is int and -_INT64 <= tokens < _INT64 and next(reversed(payload)) == "tokens":
        return tokens
    return None


def split_tokens(payload: dict[str, Any], text: str) -> tuple[str, int | None]:
    """The payload's JSON without its last key when that is ``"tokens"`` with an int (the
    usual message), and that count; else the JSON as is and None (schema version 4)."""
    tokens = _count(payload)
    if tokens is not None:
        tail = f',"tokens":{tokens}}}'
        if text.endswith(tail):
            return text[: -len(tail)] + "}", tokens
    return text, None


def split_payload(payload: dict[str, Any], text: str) -> tuple[str, int | None, str | None]:
    """The payload as the entry's columns: its JSON, token count and body (version 5).

    A message (first key ``"role"``, second ``"content"`` with a str) keeps its content
    in the body as plain text, and its JSON is the rest of the payload: the text is
    neither encoded again here nor decoded on a read, and stored without JSON escapes.
    Only the rest, a few small keys, is encoded. Anything else is stored as ``text``
    with no body. The token count is split off as `split_tokens` does.
    """
    if len(payload) > 1:
        keys = iter(payload)
        if next(keys) == "role" and next(keys) == "content":
            content = payload["content"]
            if type(content) is str:
                rest = payload.copy()
                del rest["content"]
                tokens = _count(rest)
                if tokens is not None:
                    del rest["tokens"]
                # Part of a payload the plan encoded and sized already: no limit of its own.
                return encode_json(rest, what="entry payload", limit=_INT64), tokens, content
    return (*split_tokens(payload, text), None)


def stored_payload(text: str, tokens: int | None, body: str | None = None) -> dict[str, Any]:
    """A stored payload (JSON, token and body columns) as a dict; ValueError if the
    columns do not make one (see `split_payload`)."""
    loaded = loads(text)
    if not isinstance(loaded, dict):
        raise ValueError(f"expected a JSON object, got {type(loaded).__name__}")
    payload: dict[str, Any] = loaded if body is None else joined_payload(loaded, body)
    if tokens is not None:
        payload["tokens"] = tokens
    return payload


def joined_payload(rest: dict[str, Any], body: object) -> dict[str, Any]:
    """The message a body and the rest of its payload were split from (`split_payload`):
    ``"role"``, then ``"content"``, then the rest's other keys in order."""
    if type(body) is not str:
        raise ValueError(f"the body column holds {type(body).__name__}, not text")
    if "role" not in rest or "content" in rest:
        raise ValueError('a body needs a payload with "role" and without "content"')
    return {"role": rest.pop("role"), "content": body, **rest}


def entries_of(db: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Entry]:
    """The entries ``sql`` (`SELECT_ENTRIES` ...) selects; a row that cannot be decoded
    is a corrupt entry in its place, never skipped."""
    # The loop that reads whole transcripts: the usual row is decoded right here,
    # anything else (not a JSON object, a time far from now, a body that does not go
    # with its payload) by `stored_entry`. Entries are made with tuple.__new__, as
    # Entry(...) does, minus its Python-level call. A message's body is its content as
    # is (`split_payload`): only the small rest of its payload is JSON.
    out: list[Entry] = []
    append, timestamp, new = out.append, datetime.fromtimestamp, tuple.__new__
    with gc_paused():
        for row in db.execute(sql, params):
            try:
                payload = loads(row[5])
            except ValueError:
                payload = None
            body = row[7]
            if body is not None and type(payload) is dict:
                # joined_payload, inline: this runs once per message.
                if type(body) is str and "role" in payload and "content" not in payload:
                    payload = {"role": payload.pop("role"), "content": body, **payload}
                else:
                    payload = None  # stored_entry says what is wrong
            created_us = row[4]
            if type(payload) is dict and -_EXACT_US < created_us < _EXACT_US:
                if row[6] is not None:
                    payload["tokens"] = row[6]
                created = timestamp(created_us / 1e6, UTC)
                append(new(Entry, (row[0], row[1], row[2], row[3], created, payload)))
            else:
                append(stored_entry(*row))
    return out


def stored_entry(
    seq: int,
    entry_id: str,
    parent: int | None,
    kind: str,
    created_us: int,
    text: str,
    tokens: int | None,
    body: str | None,
) -> Entry:
    """One row of `SELECT_ENTRIES` as an entry, or as a corrupt entry reporting why not."""
    created = _dt(created_us)
    try:
        payload = stored_payload(text, tokens, body)
    except ValueError as exc:
        return corrupt_entry(seq, entry_id, parent, created, str(text), str(exc))
    return Entry(seq, entry_id, parent, kind, created, payload)


def metadata_conditions(metadata: Mapping[str, Any], params: list[Any]) -> list[str]:
    """SQL conditions (appending their parameters) for equality on metadata keys."""
    where: list[str] = []
    for key, value in metadata.items():
        path = f'$.metadata."{key}"'  # keys are validated ids: nothing to escape
        if value is None or isinstance(value, bool):
            where.append("json_type(doc, ?) = ?")
            params += [path, "null" if value is None else str(value).lower()]
        elif (isinstance(value, int) and not -(2**63) <= value < 2**63) or (
            isinstance(value, str) and "\x00" in value
        ):
            # SQLite's own values cannot hold these: compare the stored JSON text.
            where.append("doc -> ? = ?")
            params += [path, encode_json(value)]
        elif isinstance(value, int | float):
            where.append("json_type(doc, ?) IN ('integer', 'real') AND json_extract(doc, ?) = ?")
            params += [path, path, value]
        else:
            where.append("json_type(doc, ?) = 'text' AND json_extract(doc, ?) = ?")
            params += [path, path, value]
    return where
