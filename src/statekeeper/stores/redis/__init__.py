"""The Redis backend (``redis://...`` and ``redis+cluster://...``, extra ``redis``).

`store` opens it; `scripts` holds the keys and Lua scripts, `base` the client and stored
forms, `records` records and event logs, and `coordination` leases with fencing tokens
and the cross-process event feed (implementations of the `statekeeper.runtime.coordination`
protocols).
"""

from statekeeper.stores.redis.store import RedisStore, open_redis, open_redis_cluster

from statekeeper.stores.redis.coordination import (  # isort: skip (needs RedisStore first)
    RedisEventFeed,
    RedisLeases,
)

__all__ = ["RedisEventFeed", "RedisLeases", "RedisStore", "open_redis", "open_redis_cluster"]
