"""The key names of the Redis store (the hash tag ``{tenant}`` keeps a tenant's keys in
one Redis Cluster slot, so one script can touch all of them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys"]


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one store: ``{prefix}/{{tenant}}/<kind>/<ids...>``.

    Ids never contain ``/`` (see `statekeeper.ids`), and each kind has a fixed number of
    parts, so a key splits back into exactly one (tenant, kind, ids) and ``a:b`` + ``c``
    can never meet ``a`` + ``b:c``. The tenant is a hash tag (``{...}``): every key of a
    tenant hashes to the same Redis Cluster slot, so each script touches one slot.
    """

    prefix: str

    def tenant(self, tenant: str) -> str:
        return f"{self.prefix}/{{{tenant}}}"

    def head(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/s/{session_id}"

    def heads(self, tenant: str) -> str:
        """What every head key of the tenant starts with (the session id follows)."""
        return f"{self.prefix}/{{{tenant}}}/s/"

    def entries(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/e/{session_id}"

    def entry_ids(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/i/{session_id}"

    def sessions(self, tenant: str) -> str:
        return f"{self.prefix}/{{{tenant}}}/sessions"

    def session_keys(self, tenant: str, session_id: str) -> list[str]:
        """The four keys every session script takes, in the order they expect."""
        return [
            self.head(tenant, session_id),
            self.entries(tenant, session_id),
            self.entry_ids(tenant, session_id),
            self.sessions(tenant),
        ]

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
