"""SQLite schema migrations. The position of a migration in the list is its version.

The applied version lives in ``PRAGMA user_version``. Never edit a released migration:
append a new one.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

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
]

SCHEMA_VERSION = len(MIGRATIONS)
