"""A local Redis Cluster for the tests: start it once across pytest-xdist workers, read its
topology, fail a master over by killing it. Drives ``scripts/redis-cluster.sh``.

Not a test module: tests import it as ``from redis_cluster import ...`` (``tests/`` is on
``sys.path`` because ``tests/conftest.py`` sits in a folder without ``__init__.py``).
Uses only the stdlib and redis-py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from statekeeper.testing.services import (
    CLUSTER_SCRIPT,
    cluster_directory,
    cluster_lock,
    require_service,
)

__all__ = [
    "SCRIPT",
    "ClusterError",
    "ClusterHandle",
    "Node",
    "default_directory",
    "parse_nodes",
    "require_cluster_tools",
    "start_cluster",
    "stop_cluster",
]

SCRIPT = CLUSTER_SCRIPT
HOST = "127.0.0.1"
SLOTS = 16384
_SCRIPT_SECONDS = 120.0


class ClusterError(RuntimeError):
    """The cluster did not start, stop or reach the awaited state in time."""


def default_directory(port_base: int) -> Path:
    """The script's default DIR: ``${TMPDIR:-/tmp}/statekeeper-redis-cluster-PORT_BASE``."""
    return cluster_directory(port_base)


def require_cluster_tools() -> None:
    """Skip the test (fail under CI) when redis-server or redis-cli is not on PATH."""
    missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
    if missing:
        require_service(
            "redis-cluster",
            f"{' and '.join(missing)} not on PATH (install Redis 7: apt-get install redis-server)",
        )


_locked = cluster_lock
"""One start, stop or failover of a cluster at a time (the lock the suite's start takes)."""


def _script(*args: str) -> str:
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=_SCRIPT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise ClusterError(f"{SCRIPT.name} {' '.join(args)} took over {error.timeout}s") from error
    if done.returncode != 0:
        raise ClusterError(
            f"{SCRIPT.name} {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}"
        )
    return done.stdout


def start_cluster(port_base: int = 7100, directory: Path | None = None) -> ClusterHandle:
    """Start the 6-node cluster on ports port_base+1..+6 with files in ``directory``
    (default `default_directory`), or do nothing when it already answers ``cluster_state:ok``.
    Safe to call from several processes at once (flock)."""
    directory = default_directory(port_base) if directory is None else directory
    with _locked(directory):
        _script("start", str(port_base), str(directory))
    return ClusterHandle(port_base, directory)


def stop_cluster(port_base: int = 7100, directory: Path | None = None) -> None:
    """Shut the 6 nodes down (no save) and remove ``directory``."""
    directory = default_directory(port_base) if directory is None else directory
    with _locked(directory):
        _script("stop", str(port_base), str(directory))


@dataclass(frozen=True)
class Node:
    """One line of ``CLUSTER NODES``."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    link: str
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?"})


def parse_nodes(text: str) -> list[Node]:
    """Parse the reply of ``CLUSTER NODES`` (slots being migrated, ``[...]``, are left out)."""
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        slots = []
        for item in fields[8:]:
            if item.startswith("["):
                continue
            low, _, high = item.partition("-")
            slots.append((int(low), int(high or low)))
        nodes.append(
            Node(
                id=fields[0],
                port=int(fields[1].split("@")[0].rpartition(":")[2] or 0),
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                link=fields[7],
                slots=tuple(sorted(slots)),
            )
        )
    return nodes


def _poll(what: str, check: Callable[[], bool], deadline: float) -> None:
    while not check():
        if time.monotonic() >= deadline:
            raise ClusterError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class ClusterHandle:
    """A running cluster: its seed URL and ports, and synchronous views and faults."""

    port_base: int
    directory: Path

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(self.port_base + i for i in range(1, 7))

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.ports[0]}"

    def client(self, port: int) -> Redis:
        """A plain (non-cluster) client of the node at ``port``; close it (``with``). It does
        not retry (redis-py's default retries a refused connection for ~4 s): the harness
        polls dead nodes on purpose."""
        return Redis(
            host=HOST,
            port=port,
            decode_responses=True,
            socket_timeout=2,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )

    def _ask(self, port: int, *command: str | int) -> str | None:
        """The node's reply, or None when it does not answer."""
        try:
            with self.client(port) as client:
                return str(client.execute_command(*command))
        except (RedisError, OSError):
            return None

    def cluster_info(self, port: int) -> dict[str, str]:
        """The node's ``CLUSTER INFO`` fields (``cluster_state`` ...); empty when it does not
        answer."""
        reply = self._ask(port, "CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in (reply or "").split() if ":" in line)

    def replication(self, port: int) -> dict[str, Any]:
        """The node's ``INFO replication`` (``role``, ``master_link_status`` ...); empty when
        it does not answer."""
        try:
            with self.client(port) as client:
                return dict(client.info("replication"))
        except (RedisError, OSError):
            return {}

    def _live(self) -> list[int]:
        return [port for port in self.ports if self._ask(port, "PING") is not None]

    def _view(self, port: int) -> dict[str, Node]:
        """The node's ``CLUSTER NODES`` by node id; empty when it does not answer."""
        reply = self._ask(port, "CLUSTER", "NODES")
        return {node.id: node for node in parse_nodes(reply or "")}

    def nodes(self, port: int | None = None) -> list[Node]:
        """``CLUSTER NODES`` as seen by the node at ``port`` (default: the first that answers)."""
        for asked in self.ports if port is None else (port,):
            reply = self._ask(asked, "CLUSTER", "NODES")
            if reply is not None:
                return parse_nodes(reply)
        raise ClusterError(f"no node of the cluster on {self.ports} answers")

    def masters(self) -> list[tuple[int, str, list[tuple[int, int]]]]:
        """(port, node id, slot ranges) of each master not flagged as failing, by port."""
        return sorted(
            (node.port, node.id, list(node.slots))
            for node in self.nodes()
            if node.is_master and not node.failing
        )

    def master_for_key(self, key: str) -> int:
        """The port of the master that owns ``key``'s slot."""
        slot = next(
            (
                int(reply)
                for port in self.ports
                if (reply := self._ask(port, "CLUSTER", "KEYSLOT", key)) is not None
            ),
            None,
        )
        if slot is None:
            raise ClusterError(f"no node of the cluster on {self.ports} answers")
        for port, _, ranges in self.masters():
            if any(low <= slot <= high for low, high in ranges):
                return port
        raise ClusterError(f"no master owns slot {slot} (key {key!r})")

    def healthy(self) -> bool:
        """Every node answers ``cluster_state:ok`` and knows all 6; every view shows the same 3
        masters with slots, each with one connected replica, nothing failing; every replica's
        link to its master is up (in sync)."""
        views = []
        for port in self.ports:
            info = self.cluster_info(port)
            if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != "6":
                return False
            replication = self.replication(port)
            if (
                replication.get("role") != "master"
                and replication.get("master_link_status") != "up"
            ):
                return False
            nodes = list(self._view(port).values())
            masters = {node.id: node.slots for node in nodes if node.is_master}
            replicas = sorted(node.master_id or "" for node in nodes if not node.is_master)
            if (
                any(node.failing or node.link != "connected" for node in nodes)
                or len(masters) != 3
                or not all(masters.values())
                or replicas != sorted(masters)
            ):
                return False
            views.append(masters)
        return all(view == views[0] for view in views)

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until `healthy` (polling), or raise `ClusterError` after ``timeout`` seconds."""
        _poll("the cluster to be ok", self.healthy, time.monotonic() + timeout)

    def failover_by_kill(self, port: int, timeout: float = 30) -> int:
        """SIGKILL the master at ``port``, wait for its replica's promotion, restart the node
        (it rejoins empty as the new master's replica) and wait until it is in sync and the
        cluster is `healthy`. Returns the new master's port. Holds the start lock meanwhile,
        so a concurrent `start_cluster` waits instead of rebuilding a cluster one node short."""
        deadline = time.monotonic() + timeout
        with _locked(self.directory):
            nodes = {node.port: node for node in self.nodes(port)}
            old = nodes.get(port)
            if old is None or not old.is_master:
                raise ClusterError(f"the node on port {port} is not a master of the cluster")
            replica = next((node for node in nodes.values() if node.master_id == old.id), None)
            if replica is None:
                raise ClusterError(f"the master on port {port} has no replica to take over")
            # The node's own paths, not self.directory: the cluster may have been started
            # with another DIR (start is a no-op when it is already up).
            with self.client(port) as client:
                pidfile = Path(client.config_get("pidfile")["pidfile"])
                node_dir = Path(client.config_get("dir")["dir"])
                running = int(client.info("server")["process_id"])
            pid = int(pidfile.read_text().strip())
            if pid != running:  # a stale or shared pidfile: never kill another process
                raise ClusterError(f"{pidfile} says {pid}, the node on {port} is {running}")
            os.kill(pid, signal.SIGKILL)
            _poll(
                f"the killed node on {port} to go",
                lambda: self._ask(port, "PING") is None,
                deadline,
            )

            def promoted() -> bool:
                if self.replication(replica.port).get("role") != "master":
                    return False
                for live in self._live():
                    if self.cluster_info(live).get("cluster_state") != "ok":
                        return False
                    seen = self._view(live).get(replica.id)
                    if seen is None or not seen.is_master or seen.slots != old.slots:
                        return False
                return True

            _poll(f"the replica on {replica.port} to take over", promoted, deadline)
            _script("start-node", str(port), str(self.port_base), str(node_dir.parent))

            def rejoined() -> bool:
                me = self._view(port).get(old.id)
                return me is not None and me.master_id == replica.id and self.healthy()

            _poll(f"the node on {port} to rejoin as a replica in sync", rejoined, deadline)
        return replica.port

    def stop(self) -> None:
        """`stop_cluster` for this cluster."""
        stop_cluster(self.port_base, self.directory)
