"""Redis Cluster: ``redis+cluster://[[user]:password@]host:port[,host:port...]``.

redis-py's cluster client (`RedisCluster`) learns the slot map from the seed nodes and
serves the plain commands (reads, leases, the event feed). The store's scripts, every
write among them, run on connections of its own per node (`ClusterScripts`), routed by
the slot of their first key through that same slot map, as on one server (see
`statekeeper.stores.redis.wire`).

Placement (`statekeeper.stores.redis.keys.Keys` with ``spread=True``): a session's head,
entries and entry ids share the slot of ``{tenant/session}``, so a tenant's sessions
spread over every master; the tenant's session index, records, event logs, leases and
notices keep the tenant's slot. Each script still touches one slot, so what a session
script does is atomic as on one server. What crosses two slots is done in order, each
step atomic, and a process that dies between two steps leaves only what the next step
tolerates:

- creating a session adds it to the index first (so a created session is always listed);
  a session whose creation did not finish leaves an index member without a head, which
  listings skip;
- a write touches the index after it committed (the index orders by last activity;
  a later write moves it again);
- deleting a session removes the head, then the index member;
- an append's events (``append_entries(events=...)``) are logged right after its entries
  commit, as on the files backend: a crash between leaves the entries without their
  events, never events without their entries.

Redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) mean nothing ran: they are followed
(the slot map is read again). A lost connection is not retried here (the write may
have been applied): it raises `StoreUnavailableError`, the slot map is read again before
the next call, and the caller repeats the call; appends repeated with the same entry ids
replay instead of writing twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

from statekeeper.errors import InvalidInputError, MissingExtraError, StoreUnavailableError
from statekeeper.stores.redis.keys import Keys
from statekeeper.stores.redis.scripts import Script
from statekeeper.stores.redis.wire import (
    CLIENT_ERRORS,
    REDIRECTS,
    Replicas,
    ScriptArg,
    ScriptConnections,
    translate,
)

try:
    import redis.exceptions as rx
    from redis._parsers.commands import AsyncCommandsParser
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingExtraError("Redis store", "redis") from None

__all__ = ["ClusterScripts", "RedisCluster", "connect_cluster", "listed_heads", "seeds_of"]

MAX_REDIRECTS = 16
"""Redirections one call follows before it gives up (a slot moving many times)."""
NODE_CONNECTIONS = 1000
"""Connections redis-py's cluster client opens per node at most (plain commands)."""


def seeds_of(location: str) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The credentials and the seed nodes of ``[[user]:password@]host:port[,...][/]``."""
    userinfo, at, rest = location.rpartition("@")
    settings: dict[str, Any] = {}
    if at:
        username, colon, password = userinfo.partition(":")
        settings["username"] = username or None
        settings["password"] = password if colon else None
    if "/" in rest.rstrip("/"):
        raise InvalidInputError(
            f"invalid Redis Cluster address {rest!r}: a cluster has no databases; "
            "use redis+cluster://host:port[,host:port]"
        )
    seeds: list[tuple[str, int]] = []
    for part in rest.rstrip("/").split(","):
        host, colon, port = part.strip().rpartition(":")
        if part.startswith("["):
            host = host.strip("[]")
        try:
            seeds.append((host or "localhost", int(port) if colon else 6379))
        except ValueError:
            raise InvalidInputError(
                f"invalid Redis Cluster node {part!r}; use redis+cluster://host:port[,host:port]"
            ) from None
    return settings, seeds


class _KnownCommands(AsyncCommandsParser):
    """redis-py's table of commands (where each keeps its keys), read with ``COMMAND``
    once per node address and process rather than at every (re)initialisation of every
    client: that reply is the bulk of opening a cluster store (~40 ms)."""

    _tables: ClassVar[dict[str, dict[str, Any]]] = {}

    async def initialize(self, node: ClusterNode | None = None) -> None:
        if node:
            self.node = node
        known = self._tables.get(self.node.name)
        if known is None:
            await super().initialize()
            known = self._tables[self.node.name] = self.commands
        self.commands = known


def connect_cluster(location: str, *, socket_timeout: float) -> RedisCluster:
    """A cluster client for the seeds of ``location`` (see `seeds_of`); commands are
    not retried after a lost connection (see the module docstring)."""
    settings, seeds = seeds_of(location)
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in seeds],
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        max_connections=NODE_CONNECTIONS,
        protocol=2,
        **settings,
    )
    client.commands_parser = _KnownCommands()
    return client


class ClusterScripts:
    """Scripts on a cluster: each on the master of its first key's slot, on connections
    of the store's own there (`ScriptConnections`), following redirections."""

    def __init__(self, client: RedisCluster, where: str, wait: Replicas | None) -> None:
        self._client = client
        self._where = where
        self._wait = wait
        self._nodes: dict[str, ScriptConnections] = {}
        self._slots: dict[str, int] = {}
        self._stale = False

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        """Run ``script`` where its keys live; errors translated (see `translate`)."""
        if self._client._initialize:  # a new client: it knows no slots yet
            await self.refresh()
        slot = self._slot(keys[0])
        ask: ClusterNode | None = None
        for attempt in range(MAX_REDIRECTS):
            if self._stale:
                await self.refresh()
            node = ask or self._master(slot)
            try:
                return await self._on(node).run(script, keys, args, asking=ask is not None)
            except rx.AskError as exc:
                if isinstance(exc, rx.MovedError):  # redis-py's MOVED is a kind of ASK
                    ask = None
                    self._stale = True
                    continue
                # The slot is moving, and these keys are at the node named already.
                ask = self._client.nodes_manager.get_node(exc.host, exc.port) or ClusterNode(
                    exc.host, exc.port, **self._client.connection_kwargs
                )
            except REDIRECTS:
                ask = None
                self._stale = True
                if attempt:  # the cluster is between two states: give it a moment
                    await asyncio.sleep(min(0.05 * attempt, 0.5))
            except StoreUnavailableError:
                self._stale = True  # the node may be gone: read the slot map again
                raise
        raise StoreUnavailableError(
            f"Redis Cluster at {self._where} kept redirecting slot {slot} "
            f"({MAX_REDIRECTS} times); retry when the cluster is stable"
        )

    async def refresh(self) -> None:
        """Read the slot map again, through the client's own initialisation (its lock
        makes concurrent refreshes one; redis-py sets the same flag after a lost node)."""
        self._client._initialize = True
        try:
            await self._client.initialize()
        except CLIENT_ERRORS as exc:
            raise translate(exc, self._where) from exc
        self._stale = False

    def _slot(self, key: str) -> int:
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= 65536:
                self._slots.clear()
            slot = self._slots[key] = self._client.keyslot(key)
        return slot

    def _master(self, slot: int) -> ClusterNode:
        try:
            return self._client.nodes_manager.get_node_from_slot(slot)
        except rx.SlotNotCoveredError as exc:
            self._stale = True
            raise StoreUnavailableError(
                f"no master of Redis Cluster at {self._where} serves slot {slot} ({exc}); "
                "retry when the cluster is whole"
            ) from None

    def _on(self, node: ClusterNode) -> ScriptConnections:
        conns = self._nodes.get(node.name)
        if conns is None:
            conns = self._nodes[node.name] = ScriptConnections(
                node.connection_class,
                node.connection_kwargs,
                f"{self._where} (node {node.name})",
                wait=self._wait,
                redirects=True,
            )
        return conns

    async def close(self) -> None:
        """Close the idle connections on every node."""
        for conns in self._nodes.values():
            await conns.close()


async def listed_heads(
    client: RedisCluster,
    keys: Keys,
    where: str,
    tenant: str,
    high: str,
    low: str,
    start: int,
    count: int,
) -> list[Any]:
    """One batch of a tenant's session heads in list order, answered as the one-server
    ``list_sessions`` script answers (``[scanned, b"<score> <id>\\n<head>", ...]``):
    the index rows, then their heads from every slot they live in (one pipeline, a round
    trip per node). Not one snapshot; index members whose head is gone are left out."""
    try:
        rows: Any = await client.zrevrangebyscore(
            keys.sessions(tenant), high, low, start=start, num=count, withscores=True
        )
        if not rows:
            return [0]
        pipe = client.pipeline(transaction=False)
        for member, _ in rows:
            pipe.hmget(keys.head(tenant, _text(member)), "doc", "live")
        heads: Any = await pipe.execute()
    except CLIENT_ERRORS as exc:
        raise translate(exc, where) from exc
    out: list[Any] = [len(rows)]
    for (member, score), (doc, live) in zip(rows, heads, strict=True):
        if doc is not None:
            head = doc if live is None else doc + b"\n" + live
            out.append(b"%d %s\n%s" % (int(score), _bytes(member), head))
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value
