"""Backend services (a database server) the suite needs: skip locally, fail under CI.

A backend whose server is not running calls `require_service`: the test is skipped with
the reason, unless ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1`` is set, when it
fails instead, so a CI run cannot go green without having tested the backend.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

__all__ = [
    "CLUSTER_SCRIPT",
    "cluster_directory",
    "cluster_lock",
    "require_service",
    "services_required",
    "start_local_cluster",
    "tcp_reachable",
]

_TRUE = {"1", "true", "yes", "on"}


def services_required(environ: Mapping[str, str] | None = None) -> bool:
    """True when a missing backend service must fail the run instead of skipping."""
    env = os.environ if environ is None else environ
    return (
        env.get("CI", "").strip().lower() in _TRUE
        or env.get("STATEKEEPER_REQUIRE_SERVICES", "").strip().lower() in _TRUE
    )


def require_service(name: str, reason: str) -> NoReturn:
    """Stop the current test because backend ``name``'s service is unavailable.

    Skips with ``reason`` normally; fails when ``CI=true`` or
    ``STATEKEEPER_REQUIRE_SERVICES=1`` is set, so a CI run cannot silently miss it.
    """
    import pytest

    message = f"{name} backend unavailable: {reason}"
    if services_required():
        pytest.fail(
            f"{message} (required because CI=true or STATEKEEPER_REQUIRE_SERVICES=1 is set)",
            pytrace=False,
        )
    pytest.skip(f"{message} (set STATEKEEPER_REQUIRE_SERVICES=1 to make this an error)")


_reachable: dict[tuple[str, int], bool] = {}


async def tcp_reachable(host: str, port: int, *, seconds: float = 1.0) -> bool:
    """Whether a TCP server answers at host:port. Cached, so only the first test waits."""
    if (host, port) not in _reachable:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
        except (OSError, TimeoutError):
            _reachable[host, port] = False
        else:
            writer.close()
            await writer.wait_closed()
            _reachable[host, port] = True
    return _reachable[host, port]


CLUSTER_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "redis-cluster.sh"
"""Starts the suite's local Redis Cluster (in a source checkout of statekeeper)."""


def cluster_directory(port_base: int) -> Path:
    """The script's default DIR for a cluster on ``port_base``+1..+6:
    ``${TMPDIR:-/tmp}/statekeeper-redis-cluster-PORT_BASE``, as the script computes it."""
    temp = os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 (the script's own default)
    return Path(temp) / f"statekeeper-redis-cluster-{port_base}"


@contextmanager
def cluster_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive flock on DIR.lock (beside DIR): one start, stop or failover of
    that cluster at a time across processes (xdist workers). Not reentrant."""
    lock = directory.with_name(directory.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def start_local_cluster(port: int, host: str = "127.0.0.1") -> bool:
    """Start the suite's Redis Cluster (3 masters, 3 replicas, ports ``port``..``port+5``)
    with ``scripts/redis-cluster.sh`` when it exists and redis-server is installed;
    whether the cluster now answers. Several test processes may call it at once: the
    script runs under `cluster_lock`, and does nothing when the cluster already runs."""
    bash = shutil.which("bash")
    if not CLUSTER_SCRIPT.exists() or bash is None or shutil.which("redis-server") is None:
        return False

    def start() -> bool:
        with cluster_lock(cluster_directory(port - 1)):
            done = subprocess.run(  # noqa: S603 (our own script, our own arguments)
                [bash, str(CLUSTER_SCRIPT), "start", str(port - 1)],
                capture_output=True,
                timeout=120,
                check=False,
            )
        return done.returncode == 0

    started = await asyncio.to_thread(start)
    if started:
        _reachable[host, port] = True
    return started
