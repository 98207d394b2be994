"""SQLite schema migrations. The position of a migration in the list is its version.

The applied version lives in ``PRAGMA user_version``. Never edit a released migration:
append a new one.
"""

from __future__ import annotations

__all__ = ["LIVE_COLUMNS", "MIGRATIONS", "SCHEMA_VERSION", "SEQ_BITS"]

MIGRATIONS: list[str] = [
    # 1: sessions, transcript entries, versioned records, event logs
    """
    CREATE TABLE sessions (
        sk INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: cached heads stay valid
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        agent_id TEXT,
        active_us INTEGER NOT NULL,
        created_us INTEGER NOT NULL,
        version INTEGER NOT NULL,
        doc TEXT NOT NULL,
        UNIQUE (tenant, id)
    );
    CREATE INDEX sessions_by_activity ON sessions (tenant, active_us DESC, id DESC);
    CREATE TABLE entries (
        session_sk INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        id TEXT NOT NULL,
        parent_seq INTEGER,
        kind TEXT NOT NULL,
        created_us INTEGER NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (session_sk, seq)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX entries_by_id ON entries (session_sk, id);
    CREATE TABLE records (
        tenant TEXT NOT NULL,
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER NOT NULL,
        updated_us INTEGER NOT NULL,
        expires_us INTEGER,
        value TEXT NOT NULL,
        PRIMARY KEY (tenant, namespace, key)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        tenant TEXT NOT NULL,
        log_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        stream TEXT NOT NULL,
        kind TEXT NOT NULL,
        ts_us INTEGER NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (tenant, log_id, seq)
    ) WITHOUT ROWID;
    """,
    # 2: entries in a rowid table keyed by session_sk * 2^32 + seq. A session's entries are
    # still one contiguous, seq-ordered range (reads scan it in place), and a row up to
    # about 4 KB stays on its page: in the WITHOUT ROWID table any row over about 1 KB
    # spilled into an overflow page of its own, so a 2 KB tool output cost 8 KB on disk.
    """
    CREATE TABLE entries_v2 (
        rid INTEGER PRIMARY KEY,
        session_sk INTEGER NOT NULL,
        id TEXT NOT NULL,
        parent_seq INTEGER,
        kind TEXT NOT NULL,
        created_us INTEGER NOT NULL,
        payload TEXT NOT NULL
    );
    INSERT INTO entries_v2 (rid, session_sk, id, parent_seq, kind, created_us, payload)
        SELECT session_sk * 4294967296 + seq, session_sk, id, parent_seq, kind, created_us,
               payload
        FROM entries ORDER BY session_sk, seq;
    DROP TABLE entries;
    ALTER TABLE entries_v2 RENAME TO entries;
    CREATE UNIQUE INDEX entries_by_id ON entries (session_sk, id);
    """,
    # 3: the head fields every append changes, as columns (`LIVE_COLUMNS`). An append
    # updates these integers and leaves the head document alone; the document is
    # rewritten only when other fields change. NULL (a head written before version 3)
    # means the document's own values are current.
    """
    ALTER TABLE sessions ADD COLUMN head_seq INTEGER;
    ALTER TABLE sessions ADD COLUMN last_seq INTEGER;
    ALTER TABLE sessions ADD COLUMN message_count INTEGER;
    ALTER TABLE sessions ADD COLUMN total_tokens INTEGER;
    ALTER TABLE sessions ADD COLUMN fresh_tokens INTEGER;
    """,
    # 4: a message's token count in a column of its own. The payload's last key, when it
    # is "tokens" with an integer, is stored here instead of as JSON text (about 10 bytes
    # less per message); reads put it back as the payload's last key. NULL: not split.
    """
    ALTER TABLE entries ADD COLUMN tokens INTEGER;
    """,
    # 5: a message's text in a column of its own. A payload whose first key is "role" and
    # second "content" with a string keeps that string here, as plain text, and the rest
    # of the payload as the JSON: the text takes no JSON escapes on disk and a read does
    # not unescape it; reads put it back as the payload's second key. NULL: not split.
    """
    ALTER TABLE entries ADD COLUMN body TEXT;
    """,
]

LIVE_COLUMNS = ("head_seq", "last_seq", "message_count", "total_tokens", "fresh_tokens")
"""Head fields kept in columns of their own since schema version 3 (with ``version`` and
``active_us``, the last activity, which were columns from the start)."""

SEQ_BITS = 32
"""An entry's rowid is ``session_sk << SEQ_BITS | seq`` (schema version 2)."""

SCHEMA_VERSION = len(MIGRATIONS)
