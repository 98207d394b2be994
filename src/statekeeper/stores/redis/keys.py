"""The key names of the Redis store: which keys share a Redis Cluster slot (hash tags)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys"]


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one store: ``{prefix}/{{tenant}}/<kind>/<ids...>``.

    Ids never contain ``/`` or braces (see `statekeeper.ids`), and each kind has a fixed
    number of parts, so a key splits back into exactly one (tenant, kind, ids) and
    ``a:b`` + ``c`` can never meet ``a`` + ``b:c``. The hash tag (``{...}``) decides the
    Redis Cluster slot, and each script touches one slot:

    - on one server (``spread=False``) the tag is the tenant, so every key of a tenant
      shares a slot and a session's scripts also keep the tenant's session index;
    - on a cluster (``spread=True``) a session's head, entries and entry ids are tagged
      ``{tenant/session}``: a tenant's sessions spread over every master, and the
      session index (with records, event logs, leases) stays in the tenant's slot,
      written by a script of its own (`statekeeper.stores.redis.cluster`).
    """

    prefix: str
    spread: bool = False

    def _session(self, tenant: str, session_id: str, kind: str) -> str:
        if self.spread:
            return f"{self.prefix}/{{{tenant}/{session_id}}}/{kind}"
        return f"{self.prefix}/{{{tenant}}}/{kind}/{session_id}"

    def tenant(self, tenant: str) -> str:
        return f"{self.prefix}/{{{tenant}}}"

    def head(self, tenant: str, session_id: str) -> str:
        return self._session(tenant, session_id, "s")

    def heads(self, tenant: str) -> str:
        """What every head key of the tenant starts with (the session id follows; one
        server only: on a cluster each head has its own tag)."""
        return f"{self.prefix}/{{{tenant}}}/s/"

    def entries(self, tenant: str, session_id: str) -> str:
        return self._session(tenant, session_id, "e")

    def entry_ids(self, tenant: str, session_id: str) -> str:
        return self._session(tenant, session_id, "i")

    def settled(self, tenant: str, session_id: str) -> str:
        """A short-lived key in the session's slot whose write proves, once a replica
        confirms it, that the replica holds everything the session's master wrote
        before (see `scripts.SETTLE`)."""
        return self._session(tenant, session_id, "w")

    def sessions(self, tenant: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/sessions"

    def session_keys(self, tenant: str, session_id: str) -> list[str]:
        """The keys every session script takes, in the order they expect: head, entries,
        entry ids, and on one server the session index (a script given no index key
        leaves the index to the caller: on a cluster it lives in another slot)."""
        keys = [
            self.head(tenant, session_id),
            self.entries(tenant, session_id),
            self.entry_ids(tenant, session_id),
        ]
        if not self.spread:
            keys.append(self.sessions(tenant))
        return keys

    def record(self, tenant: str, namespace: str, key: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/r/{namespace}/{key}"

    def records(self, tenant: str, namespace: str) -> str:
        """What every record key of the namespace starts with (the key follows)."""
        return f"{self.prefix}/{{{tenant}}}/r/{namespace}/"

    def record_index(self, tenant: str, namespace: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/rk/{namespace}"

    def events(self, tenant: str, log_id: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/ev/{log_id}"

    def event_notices(self, tenant: str) -> str:
        """A capped stream of (log id, first seq, last seq): which logs grew, tenant-wide."""
        return f"{self.prefix}/{{{tenant}}}/evnotices"

    def lease(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/lease/{session_id}"

    def fence(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/fence/{session_id}"
