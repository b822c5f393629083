"""A group whose ports bind one address (bindAddress) while it advertises another (brokerIP1):
the NameServer routes name the advertised one, and a client that knows only the NameServer
reaches the group through it; a group bound to one interface answers on no other."""

from __future__ import annotations

import socket
from collections.abc import Callable

import grpc
import pytest
from raftmq.nameserver.v1 import nameserver_pb2 as nspb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as nspb_grpc
from support import create_topic, wait_for

from client import Message, Producer, PullConsumer
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

DEADLINE_S = 15.0


def _routed_addrs(cluster: LocalCluster, topic: str) -> set[str]:
    assert cluster.namesrv is not None
    with grpc.insecure_channel(cluster.namesrv.addr) as ch:
        r = nspb_grpc.NameServerStub(ch).GetRouteInfoByTopic(
            nspb.GetRouteInfoByTopicRequest(topic=topic), timeout=5
        )
    followers = {f.addr for g in r.groups for f in g.followers}
    rmq5 = {a for g in r.groups for a in g.rmq5_addrs}
    return {g.leader_addr for g in r.groups} | followers | rmq5


def _round_trip(cluster: LocalCluster, topic: str, count: int) -> None:
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    with Producer("bind-p", addr) as producer, PullConsumer("bind-c", addr) as reader:
        sent = {producer.send(Message(topic, f"m{i}".encode())).msg_id for i in range(count)}
        got: set[str] = set()

        def all_read() -> bool:
            for mq in reader.fetch_queues(topic):
                got.update(m.msg_id for m in reader.pull(mq, 0, max_nums=256).messages)
            return sent <= got

        wait_for(all_read, DEADLINE_S, f"{count} messages read back through the routes")


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_bind_every_interface_advertise_another_loopback_address(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, namesrv=True, bindAddress="0.0.0.0", brokerIP1="127.0.0.2")
    create_topic(cluster, "BindAnyT", 4)
    routed = _routed_addrs(cluster, "BindAnyT")
    assert routed and all(a.startswith("127.0.0.2:") for a in routed), routed
    _round_trip(cluster, "BindAnyT", 20)
    # Bound on every interface: another address of the machine reaches the client port too.
    assert _accepts("127.0.0.3", cluster.nodes[0].client_port)


def test_bind_one_interface_serves_no_other(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(1, namesrv=True, bindAddress="127.0.0.1", brokerIP1="127.0.0.1")
    create_topic(cluster, "BindOneT", 2)
    _round_trip(cluster, "BindOneT", 5)
    # Bound on 127.0.0.1 only: every port kind, and nothing answers on 127.0.0.2.
    n = cluster.nodes[0]
    for port in (n.client_port, n.peer_port, n.grpc_port, n.metrics_port):
        assert _accepts("127.0.0.1", port), port
        assert not _accepts("127.0.0.2", port), port
