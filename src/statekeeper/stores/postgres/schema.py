"""PostgreSQL schema: migrations, the statements the store runs, and metadata filter tokens.

The position of a migration in `MIGRATIONS` is its version (the first is version 1).
The versions applied to a schema are recorded in its ``schema_migrations`` table, one row
each with the migration's summary. Never edit a released migration: append a new one.

Every table lives in one PostgreSQL schema (``statekeeper`` unless the ``schema`` option
names another), and every statement names it explicitly, so the store never depends on
a connection's ``search_path``. Ids are compared with the "C" collation so that ordering
(record keys, listing ties) is plain code-point order on every server, whatever the
database's locale.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from statekeeper.errors import InvalidInputError
from statekeeper.jsoncodec import encode_json

__all__ = [
    "COUNTERS",
    "DEFAULT_SCHEMA",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Statements",
    "metadata_tokens",
    "validate_channel",
    "validate_schema_name",
]

DEFAULT_SCHEMA = "statekeeper"

MIGRATIONS: list[tuple[str, str]] = [
    (
        "sessions, transcript entries, versioned records, event logs",
        """
        CREATE TABLE {s}.sessions (
            tenant text COLLATE "C" NOT NULL,
            id text COLLATE "C" NOT NULL,
            -- Never reused, so a head cached by sk stays valid. Not indexed: every
            -- statement finds a session by (tenant, id), and one index fewer to update
            -- makes each append cheaper.
            sk bigint GENERATED ALWAYS AS IDENTITY,
            agent_id text COLLATE "C",
            last_active timestamptz NOT NULL,
            created_at timestamptz NOT NULL,
            version bigint NOT NULL,
            meta text[] NOT NULL,  -- metadata filter tokens (see metadata_tokens)
            doc text NOT NULL,     -- the SessionRecord as JSON text, exactly as encoded
            PRIMARY KEY (tenant, id)
        );
        CREATE INDEX sessions_by_activity ON {s}.sessions (tenant, last_active DESC, id DESC);
        CREATE INDEX sessions_by_metadata ON {s}.sessions USING gin (meta);
        CREATE TABLE {s}.entries (
            session_sk bigint NOT NULL,
            seq bigint NOT NULL,
            id text COLLATE "C" NOT NULL,
            parent_seq bigint,
            kind text NOT NULL,
            created_at timestamptz NOT NULL,
            payload text NOT NULL,  -- JSON text: keeps big ints, -0.0 and key order
            PRIMARY KEY (session_sk, seq)
        );
        CREATE UNIQUE INDEX entries_by_id ON {s}.entries (session_sk, id);
        CREATE TABLE {s}.records (
            tenant text COLLATE "C" NOT NULL,
            namespace text COLLATE "C" NOT NULL,
            key text COLLATE "C" NOT NULL,
            version bigint NOT NULL,
            updated_at timestamptz NOT NULL,
            expires_at timestamptz,
            value text NOT NULL,
            PRIMARY KEY (tenant, namespace, key)
        );
        CREATE TABLE {s}.event_logs (
            tenant text COLLATE "C" NOT NULL,
            log_id text COLLATE "C" NOT NULL,
            last_seq bigint NOT NULL,
            PRIMARY KEY (tenant, log_id)
        );
        CREATE TABLE {s}.events (
            tenant text COLLATE "C" NOT NULL,
            log_id text COLLATE "C" NOT NULL,
            seq bigint NOT NULL,
            stream text NOT NULL,
            kind text NOT NULL,
            ts timestamptz NOT NULL,
            payload text NOT NULL,
            PRIMARY KEY (tenant, log_id, seq)
        );
        """,
    ),
    (
        "session counters as columns: an append writes them, not the whole head",
        """
        -- NULL in rows written before (their doc holds the values). Once set, these and
        -- version and last_active are the head's: the doc holds the other fields.
        ALTER TABLE {s}.sessions ADD COLUMN head_seq bigint, ADD COLUMN last_seq bigint,
            ADD COLUMN total_tokens bigint, ADD COLUMN fresh_tokens bigint,
            ADD COLUMN message_count bigint, ADD COLUMN compaction_count bigint
        """,
    ),
]
"""(one-line summary, SQL with ``{s}`` for the quoted schema name) per version."""

COUNTERS = (
    "head_seq",
    "last_seq",
    "total_tokens",
    "fresh_tokens",
    "message_count",
    "compaction_count",
)
"""Head fields an append changes, stored as columns of their own (migration 2)."""
_COUNTER_COLUMNS = ", ".join(COUNTERS)
_SET_COUNTERS = ", ".join(f"{name} = %s" for name in COUNTERS)
_HEAD_COLUMNS = "version, last_active, " + _COUNTER_COLUMNS

SCHEMA_VERSION = len(MIGRATIONS)

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def validate_channel(name: str) -> str:
    """A LISTEN / NOTIFY channel name statekeeper accepts (the same rules as a schema)."""
    if not _SCHEMA_RE.fullmatch(name):
        raise InvalidInputError(
            f"notify channel {name[:70]!r} is not usable: use 1-63 lower-case letters, "
            "digits and _, starting with a letter or _"
        )
    return name


def validate_schema_name(name: str) -> str:
    """A PostgreSQL schema name statekeeper accepts: lower-case letters, digits and _."""
    if not _SCHEMA_RE.fullmatch(name) or name.startswith("pg_"):
        raise InvalidInputError(
            f"schema={name[:70]!r} is not a usable schema name: use 1-63 lower-case letters, "
            "digits and _, starting with a letter or _ (and not with 'pg_')"
        )
    return name


_ENTRY = "seq, id, parent_seq, kind, created_at, payload"
_LIVE = "(expires_at IS NULL OR expires_at > $now)"


class Statements:
    """Every statement, rendered once for one schema (bytes: ready for psycopg)."""

    def __init__(self, schema: str) -> None:
        self.schema = validate_schema_name(schema)
        q = f'"{self.schema}"'  # validated above: nothing to escape
        self.quoted = q
        self._migrations_and_sessions(q)
        self._transcripts(q)
        self._records(q)
        self._events(q)

    def _migrations_and_sessions(self, q: str) -> None:
        # -- migrations
        self.versions_table = f"{q}.schema_migrations"  # for to_regclass
        self.has_versions = _sql("SELECT to_regclass(%s) IS NOT NULL")
        self.max_version = _sql("SELECT coalesce(max(version), 0) FROM {s}.schema_migrations", q)
        self.lock_schema = _sql("SELECT pg_advisory_xact_lock(hashtext(%s))", q)
        self.create_schema = _sql("CREATE SCHEMA IF NOT EXISTS {s}", q)
        self.create_versions = _sql(
            "CREATE TABLE IF NOT EXISTS {s}.schema_migrations (version integer PRIMARY KEY, "
            "summary text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
            q,
        )
        self.record_migration = _sql(
            "INSERT INTO {s}.schema_migrations (version, summary) VALUES (%s, %s)", q
        )
        # -- sessions
        self.create_session = _sql(
            "INSERT INTO {s}.sessions (tenant, id, agent_id, last_active, created_at, version,"
            f" meta, doc, {_COUNTER_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, id) DO NOTHING RETURNING sk",
            q,
        )
        # The doc is sent only when the caller's cached copy (sk, version) is not current.
        head = (
            "SELECT sk, CASE WHEN sk = %s AND version = %s THEN NULL ELSE doc END, "
            + _HEAD_COLUMNS
            + " FROM {s}.sessions WHERE tenant = %s AND id = %s"
        )
        self.get_head = _sql(head, q)
        self.lock_head = _sql(head + " FOR UPDATE", q)
        self.save_head = _sql(
            "UPDATE {s}.sessions SET agent_id = %s, last_active = %s, version = %s,"
            f" meta = coalesce(%s, meta), doc = %s, {_SET_COUNTERS}"
            " WHERE tenant = %s AND id = %s AND sk = %s AND version = %s",
            q,
        )
        self.delete_session = _sql(
            "DELETE FROM {s}.sessions WHERE tenant = %s AND id = %s RETURNING sk", q
        )
        self.delete_entries = _sql("DELETE FROM {s}.entries WHERE session_sk = %s", q)

    def _transcripts(self, q: str) -> None:
        # -- transcripts
        # One statement: the head moves (compare-and-set on its version) and the entries
        # go in, or neither happens. The UPDATE's row lock orders writers of one session.
        # The usual append changes only version, last_active and the COUNTERS: its head
        # update (the ``_counted`` statements) sends and writes those, not the doc.
        where = " WHERE tenant = %s AND id = %s AND sk = %s AND version = %s RETURNING sk)"
        insert = " INSERT INTO {s}.entries (session_sk, " + _ENTRY + ")"
        one = (
            " SELECT sk, %s::bigint, %s::text, %s::bigint, %s::text, %s::timestamptz,"
            " %s::text FROM head"
        )
        # Text arrays go in binary (%b): in text form psycopg escapes every quote and
        # backslash of every JSON payload with a Python regex callback, hundreds per
        # tool output; in binary the strings go as they are.
        many = (
            " SELECT head.sk, e.* FROM head, unnest(%s::bigint[], %b::text[],"
            " %s::bigint[], %b::text[], %s::timestamptz[], %b::text[]) AS e"
        )
        whole = (
            "WITH head AS (UPDATE {s}.sessions SET agent_id = %s, last_active = %s,"
            f" version = %s, meta = coalesce(%s, meta), doc = %s, {_SET_COUNTERS}"
        )
        counted = (
            "WITH head AS (UPDATE {s}.sessions SET last_active = %s, version = %s, " + _SET_COUNTERS
        )
        self.append_one = _sql(whole + where + insert + one, q)
        self.append = _sql(whole + where + insert + many, q)
        self.append_one_counted = _sql(counted + where + insert + one, q)
        self.append_counted = _sql(counted + where + insert + many, q)
        self.entries_by_id = _sql(
            "SELECT " + _ENTRY + " FROM {s}.entries WHERE session_sk = %s AND id = ANY(%s)", q
        )
        self.read_entries = _sql(
            "SELECT s.sk, e.* FROM {s}.sessions s LEFT JOIN LATERAL (SELECT " + _ENTRY + " FROM"
            " {s}.entries WHERE session_sk = s.sk AND seq > %s AND seq <= %s ORDER BY seq"
            " LIMIT %s) e ON true WHERE s.tenant = %s AND s.id = %s",
            q,
        )
        self.get_entry = _sql(
            "SELECT s.sk, e.* FROM {s}.sessions s LEFT JOIN LATERAL (SELECT " + _ENTRY + " FROM"
            " {s}.entries WHERE session_sk = s.sk AND id = %s) e ON true"
            " WHERE s.tenant = %s AND s.id = %s",
            q,
        )
        self.prune = _sql(
            "DELETE FROM {s}.entries WHERE session_sk = %s AND kind = %s AND seq < %s"
            " AND seq <> %s AND id >= %s AND id < %s AND seq NOT IN (SELECT parent_seq FROM"
            " {s}.entries WHERE session_sk = %s AND parent_seq IS NOT NULL)",
            q,
        )
        # Payload rewrites in place (docs/stores.md): the rows are locked until commit.
        self.entry_payloads = _sql(
            "SELECT id, payload FROM {s}.entries WHERE session_sk = %s AND id = ANY(%s) FOR UPDATE",
            q,
        )
        self.rewrite_entry = _sql(
            "UPDATE {s}.entries SET payload = %s WHERE session_sk = %s AND id = %s", q
        )
        self.list_sessions = (
            "SELECT last_active, id, doc, " + _HEAD_COLUMNS + " FROM " + q + ".sessions WHERE "
        )

    def _records(self, q: str) -> None:
        # -- records (%(now)s: the caller's clock, so expiry agrees with other backends)
        live = _LIVE.replace("$now", "%(now)s")
        fields = "key, version, updated_at, expires_at, value"
        upsert = (
            "INSERT INTO {s}.records AS r (tenant, namespace, key, version, updated_at,"
            " expires_at, value) VALUES (%(t)s, %(ns)s, %(k)s, 1, %(now)s, %(exp)s, %(v)s)"
            " ON CONFLICT (tenant, namespace, key) DO UPDATE SET version = CASE WHEN"
            " r.expires_at IS NULL OR r.expires_at > %(now)s THEN r.version + 1 ELSE 1 END,"
            " updated_at = excluded.updated_at, expires_at = excluded.expires_at,"
            " value = excluded.value"
        )
        where_key = "WHERE tenant = %(t)s AND namespace = %(ns)s AND key = %(k)s"
        self.put_record = _sql(upsert + " RETURNING version", q)
        self.create_record = _sql(
            upsert + " WHERE r.expires_at IS NOT NULL AND r.expires_at <= %(now)s"
            " RETURNING version",
            q,
        )
        self.replace_record = _sql(
            "UPDATE {s}.records SET version = version + 1, updated_at = %(now)s,"
            f" expires_at = %(exp)s, value = %(v)s {where_key} AND version = %(ver)s AND {live}"
            " RETURNING version",
            q,
        )
        self.get_record = _sql(f"SELECT {fields} FROM {{s}}.records {where_key} AND {live}", q)
        self.record_version = _sql(f"SELECT version FROM {{s}}.records {where_key} AND {live}", q)
        self.delete_record = _sql(
            f"DELETE FROM {{s}}.records {where_key} AND {live}"
            " AND (%(ver)s::bigint IS NULL OR version = %(ver)s) RETURNING version",
            q,
        )
        self.list_records = _sql(
            f"SELECT {fields} FROM {{s}}.records WHERE tenant = %(t)s AND namespace = %(ns)s"
            f" AND key >= %(low)s AND key < %(high)s AND key > %(after)s AND {live}"
            " ORDER BY key LIMIT %(limit)s",
            q,
        )

    def _events(self, q: str) -> None:
        # -- events: the log's row hands out the numbers, so they have no gaps
        log = (
            "WITH log AS (INSERT INTO {s}.event_logs AS l (tenant, log_id, last_seq)"
            " VALUES (%s, %s, %s) ON CONFLICT (tenant, log_id) DO UPDATE"
            " SET last_seq = l.last_seq + excluded.last_seq RETURNING last_seq)"
        )
        insert = (
            " INSERT INTO {s}.events (tenant, log_id, seq, stream, kind, ts, payload)"
            " SELECT %s, %s, log.last_seq - %s + e.n, e.stream, e.kind, e.ts, e.payload"
            " FROM log, unnest(%b::text[], %b::text[], %s::timestamptz[], %b::text[])"
            " WITH ORDINALITY AS e(stream, kind, ts, payload, n) RETURNING seq"
        )
        self.append_events = _sql(log + insert, q)
        # The same, and a NOTIFY (sent at commit) naming the log and its last seq, for
        # feeds in other processes (postgres.coordination.PgEventFeed).
        self.append_events_notify = _sql(
            log + ", added AS (" + insert + ") SELECT min(seq), pg_notify(%s,"
            " json_build_object('schema', %s::text, 'tenant', %s::text, 'log_id', %s::text,"
            " 'seq', max(seq))::text) FROM added",
            q,
        )
        self.read_events = _sql(
            "SELECT seq, stream, kind, ts, payload FROM {s}.events WHERE tenant = %s"
            " AND log_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            q,
        )
        self.delete_event_log = _sql(
            "DELETE FROM {s}.event_logs WHERE tenant = %s AND log_id = %s", q
        )
        self.delete_events = _sql("DELETE FROM {s}.events WHERE tenant = %s AND log_id = %s", q)
        self.event_payloads = _sql(
            "SELECT seq, payload FROM {s}.events WHERE tenant = %s AND log_id = %s"
            " AND seq = ANY(%s) FOR UPDATE",
            q,
        )
        self.rewrite_event = _sql(
            "UPDATE {s}.events SET payload = %s WHERE tenant = %s AND log_id = %s AND seq = %s",
            q,
        )

    def migration(self, version: int) -> list[bytes]:
        """The statements of migration ``version`` (1-based) for this schema."""
        text = MIGRATIONS[version - 1][1].replace("{s}", self.quoted)
        return [s.strip().encode() for s in text.split(";") if s.strip()]


def _sql(text: str, q: str = "") -> bytes:
    return text.replace("{s}", q).encode()


def metadata_tokens(metadata: Mapping[str, Any]) -> list[str]:
    """The filter tokens of a session's metadata: one per top-level scalar value.

    Two values get the same token exactly when `json_scalar_equal` says they are equal:
    numbers by exact value (1 and 1.0 alike, 2**53 + 1 and 2.0**53 not), booleans apart
    from numbers, strings exactly (NUL included). A filter is then an array containment
    (``meta @> tokens``) that the GIN index answers.
    """
    tokens = []
    for key, value in metadata.items():
        token = _token(key, value)
        if token is not None:
            tokens.append(token)
    return tokens


def _token(key: str, value: Any) -> str | None:
    if value is None:
        canonical = "z"
    elif isinstance(value, bool):
        canonical = "b1" if value else "b0"
    elif isinstance(value, int):
        canonical = f"n{value}"
    elif isinstance(value, float):
        # An integral float equals the int of the same value; repr is exact for the rest.
        canonical = f"n{int(value)}" if value.is_integer() else f"n{value!r}"
    elif isinstance(value, str):
        canonical = "s" + value
    else:
        return None  # lists and objects cannot be filtered on
    text = encode_json([key, canonical])  # JSON text: injective, and NUL becomes \u0000
    if len(text) > 200:  # keep index entries small; a SHA-256 collision is not a concern
        return "#" + hashlib.sha256(text.encode()).hexdigest()
    return text
