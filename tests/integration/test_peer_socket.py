"""The peer socket in real groups (docs/RAFT.md "Peer sockets"): a group where one member has
it turned off (the others reach it over the gRPC stream, it reaches them the same way) elects,
commits and fails over; a follower paused with SIGSTOP is noticed by the leader's link (no
liveness frame for ~3 s), reconnected after SIGCONT, and nothing committed is lost."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Callable

import pytest
from integration.test_dledger_group import bodies_of, wait_converged
from log_writer import Writer, assert_exactly_once
from prometheus_client.parser import text_string_to_metric_families
from support import wait_for

from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

LINK_GAUGE = "raftmq_raft_peer_link_socket"
DEADLINE_S = 30.0


def links_on_socket(cluster: LocalCluster, node_id: str) -> dict[str, bool]:
    """Peer id -> whether ``node_id``'s link to it rides the peer socket (its /metrics)."""
    url = cluster.node(node_id).metrics_url
    try:
        with urllib.request.urlopen(url, timeout=2, context=cluster.metrics_ssl_context()) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, bool] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == LINK_GAUGE:
                out[s.labels["peer"]] = s.value == 1
    return out


def wait_links(cluster: LocalCluster, node_id: str, want: dict[str, bool]) -> None:
    seen: dict[str, bool] = {}

    def ok() -> bool:
        seen.clear()
        seen.update(links_on_socket(cluster, node_id))
        return all(seen.get(p) == v for p, v in want.items())

    wait_for(ok, DEADLINE_S, f"{node_id}'s links {want} (seen {seen})")


def restart_with(cluster: LocalCluster, node_id: str, line: str) -> None:
    """Stop ``node_id`` (SIGTERM), add ``line`` to its broker.conf, start it again."""
    n = cluster.node(node_id)
    cluster.signal(node_id, signal.SIGTERM)
    wait_for(lambda: cluster.pid(n) is None, DEADLINE_S, f"{node_id} to stop")
    with open(n.conf, "a") as f:
        f.write(line + "\n")
    cluster.start(node_id)


def test_a_group_with_one_member_without_the_socket_elects_commits_and_fails_over(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3)
    wait_links(cluster, "n0", {"n1": True, "n2": True})
    restart_with(cluster, "n2", "dLegerPeerSocketEnable=false")
    # n2 neither offers its socket nor uses the others': every link to or from it is gRPC.
    wait_links(cluster, "n2", {"n0": False, "n1": False})
    wait_links(cluster, "n0", {"n1": True, "n2": False})
    wait_links(cluster, "n1", {"n0": True, "n2": False})
    with cluster.client() as client:
        writer = Writer(cluster.client()).start()
        try:
            writer.wait_acks(200, DEADLINE_S)
            for _ in range(2):  # two failovers: the member without the socket votes in both
                leader = cluster.wait_leader()
                cluster.signal(leader, signal.SIGKILL)
                cluster.wait_leader(timeout_s=DEADLINE_S, exclude=leader)
                writer.wait_acks(200, DEADLINE_S)
                cluster.start(leader)
                writer.wait_acks(100, DEADLINE_S)
        finally:
            writer.stop()
        wait_converged(cluster, client, timeout_s=DEADLINE_S)
        logs = {addr: bodies_of(client, addr) for addr in cluster.client_addrs}
        assert_exactly_once(writer.acked, logs)
    wait_links(cluster, "n2", {"n0": False, "n1": False})
    wait_links(cluster, "n0", {"n1": True, "n2": False})


def test_a_paused_follower_is_noticed_reconnected_and_loses_nothing(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3)
    leader = cluster.wait_leader()
    follower = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    other = next(n.node_id for n in cluster.nodes if n.node_id not in (leader, follower))
    wait_links(cluster, leader, {follower: True, other: True})
    with cluster.client() as client:
        writer = Writer(cluster.client()).start()
        try:
            writer.wait_acks(200, DEADLINE_S)
            cluster.signal(follower, signal.SIGSTOP)
            try:
                # No PeerAck for LIVENESS_TIMEOUT_S: the leader's link closes (and keeps
                # failing to reconnect while the follower sleeps); the group goes on.
                wait_links(cluster, leader, {follower: False, other: True})
                writer.wait_acks(300, DEADLINE_S)
            finally:
                cluster.signal(follower, signal.SIGCONT)
            wait_links(cluster, leader, {follower: True, other: True})
            writer.wait_acks(200, DEADLINE_S)
        finally:
            writer.stop()
        wait_converged(cluster, client, timeout_s=DEADLINE_S)
        logs = {addr: bodies_of(client, addr) for addr in cluster.client_addrs}
        assert_exactly_once(writer.acked, logs)
