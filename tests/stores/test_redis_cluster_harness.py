"""The local Redis Cluster harness (``scripts/redis-cluster.sh``, ``tests/redis_cluster.py``)
on ports of its own (7300s) and in tmp dirs, so it never meets another test's cluster (the
shared one is on 7100). Each test starts and stops its own cluster, so xdist may run them
on any worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from redis_cluster import ClusterHandle, require_cluster_tools, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterHandle]:
    require_cluster_tools()
    port_base: int = request.param
    handle = start_cluster(port_base, tmp_path / "cluster")
    try:
        yield handle
    finally:
        stop_cluster(port_base, tmp_path / "cluster")


@pytest.mark.parametrize("cluster", [7300], indirect=True)
def test_three_masters_cover_every_slot_each_with_one_connected_replica(
    cluster: ClusterHandle,
) -> None:
    assert cluster.url == "redis+cluster://127.0.0.1:7301"
    assert cluster.ports == (7301, 7302, 7303, 7304, 7305, 7306)
    masters = cluster.masters()
    assert len(masters) == 3
    covered = sorted(
        slot for _, _, ranges in masters for low, high in ranges for slot in range(low, high + 1)
    )
    assert covered == list(range(16384))
    nodes = cluster.nodes()
    master_ids = sorted(node_id for _, node_id, _ in masters)
    assert sorted(node.master_id or "" for node in nodes if not node.is_master) == master_ids
    assert {node.link for node in nodes} == {"connected"}
    for port in cluster.ports:
        assert cluster.cluster_info(port)["cluster_state"] == "ok"
    assert cluster.healthy()


@pytest.mark.parametrize("cluster", [7310], indirect=True)
def test_starting_again_is_a_no_op_and_stopping_removes_the_directory(
    cluster: ClusterHandle,
) -> None:
    ids = {node.port: node.id for node in cluster.nodes()}
    again = start_cluster(cluster.port_base, cluster.directory)
    assert again == cluster
    assert {node.port: node.id for node in again.nodes()} == ids  # the same nodes, not new ones
    assert cluster.directory.is_dir()

    stop_cluster(cluster.port_base, cluster.directory)
    assert not cluster.directory.exists()
    for port in cluster.ports:
        with cluster.client(port) as client, pytest.raises(RedisConnectionError):
            client.ping()


@pytest.mark.parametrize("cluster", [7320], indirect=True)
def test_failover_by_kill_promotes_the_replica_and_keeps_the_data(
    cluster: ClusterHandle,
) -> None:
    key = "harness:failover"
    old = cluster.master_for_key(key)
    with cluster.client(old) as client:
        client.set(key, "kept")
        assert client.execute_command("WAIT", 1, 1000) == 1  # the replica has it
    old_id = next(node_id for port, node_id, _ in cluster.masters() if port == old)
    replica = next(node.port for node in cluster.nodes() if node.master_id == old_id)

    new = cluster.failover_by_kill(old)

    assert new == replica
    assert cluster.master_for_key(key) == new
    with cluster.client(new) as client:
        assert client.get(key) == "kept"
    rejoined = next(node for node in cluster.nodes() if node.port == old)
    new_id = next(node_id for port, node_id, _ in cluster.masters() if port == new)
    assert not rejoined.is_master
    assert rejoined.master_id == new_id
    with cluster.client(old) as client:
        replication = client.info("replication")
    assert (replication["role"], replication["master_port"]) == ("slave", new)
    assert replication["master_link_status"] == "up"
    for port in cluster.ports:
        assert cluster.cluster_info(port)["cluster_state"] == "ok"
    seed = RedisCluster(host="127.0.0.1", port=cluster.ports[0], decode_responses=True)
    try:
        assert seed.get(key) == "kept"
    finally:
        seed.close()
