"""The PostgreSQL backend (``postgresql://...``, extra ``postgres``).

`store` opens it; `transcripts` holds session heads and entries, `records` records and
event logs, `schema` the SQL and its migrations, `conn` connections and error
translation, and `coordination` advisory-lock session locks and LISTEN/NOTIFY feeds
(implementations of the `statekeeper.runtime.coordination` protocols).
"""

from statekeeper.stores.postgres.coordination import PgEventFeed, PgSessionLocks
from statekeeper.stores.postgres.store import PostgresStore, open_postgres

__all__ = ["PgEventFeed", "PgSessionLocks", "PostgresStore", "open_postgres"]
