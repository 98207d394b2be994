"""The SQLite backend (``sqlite:///path.db``): the embedded default.

`store` holds the store and its append primitives, `records` the records and event logs,
`schema` the migrations (a list whose position is the version).
"""

from statekeeper.stores.sqlite.store import SQLiteStore, open_sqlite

__all__ = ["SQLiteStore", "open_sqlite"]
