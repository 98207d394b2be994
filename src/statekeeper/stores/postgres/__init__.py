"""The PostgreSQL backend (``postgresql://...``, extra ``postgres``).

`store` opens it; `transcripts` holds session heads and entries, `records` records and
event logs, `schema` the SQL and its migrations, `conn` connections and error
translation, and `coordination` advisory-lock session locks and LISTEN/NOTIFY feeds.
"""

from statekeeper.stores.postgres.coordination import (
    PgEventListener,
    PgSessionLocks,
    refresh_bus,
)
from statekeeper.stores.postgres.store import PostgresStore, open_postgres

__all__ = ["PgEventListener", "PgSessionLocks", "PostgresStore", "open_postgres", "refresh_bus"]
