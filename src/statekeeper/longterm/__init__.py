"""Long-term memory: namespaced JSON items over any statekeeper store.

    memories = LongTermStore(store, tenant="alice")
    await memories.put(("users", "alice"), "theme", {"value": "dark"})
    await memories.search(("users",), filter={"value": "dark"})

Put / get / delete, hierarchical namespaces, search by filter (``$eq $ne $gt $gte $lt
$lte $in $nin``) with limit and offset, TTL refreshed on read, and semantic search when
an embedding function is given. See docs/longterm.md.
"""

from statekeeper.longterm.rules import OPERATORS, match_namespace, matches
from statekeeper.longterm.store import DEFAULT_TTL, EmbedFunc, LongTermStore, MemoryItem

__all__ = [
    "DEFAULT_TTL",
    "OPERATORS",
    "EmbedFunc",
    "LongTermStore",
    "MemoryItem",
    "match_namespace",
    "matches",
]
