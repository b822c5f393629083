"""NameServers and broker registration with real processes on 127.0.0.1: two independent
NameServers, a 3-node group registering with both, leader kills, a NameServer kill, expiry."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc
from support import wait_for

from mqcluster.cluster import LocalCluster
from mqsecurity.channels import open_channel

pytestmark = pytest.mark.integration

# Registration on a change must reach the NameServers within this (the period is 30 s).
CHANGE_DEADLINE_S = 5.0
RPC_TIMEOUT_S = 2.0
# conftest's ``name_servers`` fixture: (**namesrv_conf) -> a started NameServerProc.
NameServerFactory = Callable[..., Any]


class Channels:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}

    def get(self, addr: str) -> grpc.Channel:
        if addr not in self._channels:
            self._channels[addr] = grpc.insecure_channel(addr)
        return self._channels[addr]

    def ns(self, addr: str) -> pb_grpc.NameServerStub:
        return pb_grpc.NameServerStub(self.get(addr))

    def broker(self, addr: str) -> bpb_grpc.BrokerStub:
        return bpb_grpc.BrokerStub(self.get(addr))

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()


@pytest.fixture
def channels() -> Iterator[Channels]:
    c = Channels()
    yield c
    c.close()


def route(ch: Channels, ns_addr: str, topic: str) -> pb.GetRouteInfoByTopicResponse | None:
    try:
        return ch.ns(ns_addr).GetRouteInfoByTopic(
            pb.GetRouteInfoByTopicRequest(topic=topic), timeout=RPC_TIMEOUT_S
        )
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
        assert exc.details().startswith("TOPIC_NOT_EXIST"), exc.details()
        return None


def members(ch: Channels, ns_addr: str) -> dict[str, pb.MemberInfo]:
    info = ch.ns(ns_addr).GetClusterInfo(pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
    return {m.node_id: m for c in info.clusters for g in c.groups for m in g.members}


def routed_leader(ch: Channels, ns_addr: str, topic: str) -> str:
    r = route(ch, ns_addr, topic)
    return r.groups[0].leader_addr if r is not None and len(r.groups) == 1 else ""


def test_routes_follow_topics_and_leaders_and_survive_a_namesrv_loss(
    name_servers: NameServerFactory,  # first: torn down last, so the nodes can unregister
    local_group: Callable[..., LocalCluster],
    channels: Channels,
) -> None:
    ns1, ns2 = name_servers(), name_servers()
    both = [ns1.addr, ns2.addr]
    # The 30 s period: every update below within seconds is a registration on change.
    cluster = local_group(3, namesrvAddr=";".join(both), registerBrokerPeriod=30_000)
    leader = cluster.wait_leader()
    leader_addr = cluster.node(leader).client_addr
    for addr in both:
        wait_for(
            lambda a=addr: (
                len(members(channels, a)) == 3 and members(channels, a)[leader].role == pb.LEADER
            ),
            CHANGE_DEADLINE_S,
            f"3 members and leader {leader} on {addr}",
        )

    # A topic created on the broker appears in both NameServers with the leader's address.
    channels.broker(leader_addr).CreateTopic(
        bpb.CreateTopicRequest(
            topic=bpb.TopicConfig(topic_name="Orders", read_queue_nums=4, write_queue_nums=4)
        ),
        timeout=10,
    )
    for addr in both:
        wait_for(
            lambda a=addr: routed_leader(channels, a, "Orders") == leader_addr,
            CHANGE_DEADLINE_S,
            f"route of Orders on {addr}",
        )
        r = route(channels, addr, "Orders")
        assert r is not None
        [g] = r.groups
        assert (g.cluster, g.broker_name, g.leader_id) == ("DefaultCluster", "broker-a", leader)
        assert (g.read_queue_nums, g.write_queue_nums, g.perm) == (4, 4, 6)
        assert sorted(f.addr for f in g.followers) == sorted(
            n.client_addr for n in cluster.nodes if n.node_id != leader
        )
        topics = channels.ns(addr).GetAllTopicList(pb.GetAllTopicListRequest()).topics
        assert list(topics) == ["Orders"]

    # Kill the leader: both NameServers route to the new one within seconds.
    cluster.signal(leader, signal.SIGKILL)
    new_leader = cluster.wait_leader(exclude=leader)
    new_addr = cluster.node(new_leader).client_addr
    for addr in both:
        wait_for(
            lambda a=addr: routed_leader(channels, a, "Orders") == new_addr,
            CHANGE_DEADLINE_S,
            f"new leader {new_leader} in the route on {addr}",
        )
    r = route(channels, ns2.addr, "Orders")
    assert r is not None and r.groups[0].leader_term > 1
    # The killed leader's stale registration is a follower entry until it expires.
    assert leader in {f.node_id for f in r.groups[0].followers}

    # Kill a NameServer: the broker keeps working and the other NameServer keeps hearing.
    ns1.stop(signal.SIGKILL)
    started = time.monotonic()
    sent = channels.broker(new_addr).SendMessage(
        bpb.SendMessageRequest(topic="Orders", messages=[bpb.Message(body=b"after ns1 died")]),
        timeout=10,
    )
    assert len(sent.packed_msg_ids) == 1
    channels.broker(new_addr).CreateTopic(
        bpb.CreateTopicRequest(topic=bpb.TopicConfig(topic_name="Payments")), timeout=10
    )
    assert time.monotonic() - started < 5.0, "a dead NameServer slowed the broker down"
    wait_for(
        lambda: routed_leader(channels, ns2.addr, "Payments") == new_addr,
        CHANGE_DEADLINE_S,
        "Payments on the surviving NameServer",
    )
    channels.broker(new_addr).DeleteTopic(bpb.DeleteTopicRequest(topic="Orders"), timeout=10)
    wait_for(
        lambda: route(channels, ns2.addr, "Orders") is None,
        CHANGE_DEADLINE_S,
        "Orders gone from the surviving NameServer",
    )
    assert list(channels.ns(ns2.addr).GetAllTopicList(pb.GetAllTopicListRequest()).topics) == [
        "Payments"
    ]

    # The killed node comes back as a follower with a newer term and says so.
    cluster.start(leader)
    wait_for(
        lambda: (
            (m := members(channels, ns2.addr).get(leader)) is not None
            and m.role == pb.FOLLOWER
            and m.term >= r.groups[0].leader_term
        ),
        CHANGE_DEADLINE_S + 5,
        f"{leader} re-registered as a follower",
    )


def test_silent_nodes_expire_and_stopped_nodes_unregister(
    name_servers: NameServerFactory,  # first: torn down last, so the nodes can unregister
    local_group: Callable[..., LocalCluster],
    channels: Channels,
) -> None:
    ns = name_servers(brokerExpiredTime=3000, scanNotActiveBrokerInterval=500)
    cluster = local_group(3, namesrvAddr=ns.addr, registerBrokerPeriod=1000)
    leader = cluster.wait_leader()
    followers = [n.node_id for n in cluster.nodes if n.node_id != leader]
    wait_for(lambda: len(members(channels, ns.addr)) == 3, CHANGE_DEADLINE_S, "3 members")

    # SIGKILL: no unregistration; the node stays listed until brokerExpiredTime passes.
    killed_at = time.monotonic()
    cluster.signal(followers[0], signal.SIGKILL)
    assert followers[0] in members(channels, ns.addr)
    wait_for(
        lambda: followers[0] not in members(channels, ns.addr),
        3.0 + 0.5 + 3.0,
        f"{followers[0]} expired",
    )
    assert time.monotonic() - killed_at > 2.0, "dropped before brokerExpiredTime"
    # The live nodes heartbeat every second, so they stayed (ages well under 3 s).
    live = members(channels, ns.addr)
    assert set(live) == {leader, followers[1]}
    assert all(m.last_heartbeat_age_ms < 3000 for m in live.values())
    assert all(m.heartbeat_period_ms == 1000 for m in live.values())

    # SIGTERM: a clean stop unregisters at once.
    stopped_at = time.monotonic()
    cluster.signal(followers[1], signal.SIGTERM)
    wait_for(
        lambda: followers[1] not in members(channels, ns.addr),
        CHANGE_DEADLINE_S,
        f"{followers[1]} unregistered",
    )
    assert time.monotonic() - stopped_at < 2.5, "removed by expiry, not by unregistration"
    info = channels.ns(ns.addr).GetClusterInfo(pb.GetClusterInfoRequest())
    [c] = info.clusters
    [g] = c.groups
    assert (c.name, g.broker_name, g.leader_id) == ("DefaultCluster", "broker-a", leader)


def test_mqnamesrv_cli(name_servers: NameServerFactory, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "nameserver"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "brokerExpiredTime" in out.stdout
    bad = tmp_path / "bad.conf"
    bad.write_text("listenPort=1\nbrokerExpireTime=5\n")
    out = subprocess.run([*cmd, "-c", str(bad)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip() == f"mqnamesrv: {bad}: unknown key 'brokerExpireTime' " + (
        "(did you mean 'brokerExpiredTime'?) (mqnamesrv --help lists the keys; RocketMQ's "
        "other keys are accepted and ignored)"
    )
    ns = name_servers()
    out = subprocess.run([*cmd, "-p", str(ns.port)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "port in use" in out.stderr, out.stderr
    # Health and reflection, like the broker nodes.
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(ns.addr) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="raftmq.nameserver.v1.NameServer"), timeout=5
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.NameServerStub(ch).GetRouteInfoByTopic(
                pb.GetRouteInfoByTopicRequest(topic="Nope"), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details().startswith("TOPIC_NOT_EXIST")
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.NameServerStub(ch).RegisterBroker(
                pb.RegisterBrokerRequest(cluster="c", broker_name="b", node_id="n0"), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("INVALID_REQUEST")
    assert ns.stop(signal.SIGTERM) == 0


def test_mqcluster_up_starts_and_stops_a_namesrv(tmp_path: Path) -> None:
    """The default `mqcluster up`: secure (TLS, member certificates, ACLs), the NameServer on
    127.0.0.1; the node registers over TLS and `status` reaches it with the admin's files."""
    base = tmp_path / "cluster"
    cmd = [sys.executable, "-m", "mqcluster.cluster", "--base-dir", str(base)]
    try:
        out = subprocess.run(
            [*cmd, "up", "--nodes", "1", "--auto-ports"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        cluster = LocalCluster(base)
        assert cluster.namesrv is not None
        ns_pid = cluster.namesrv_pid()
        assert ns_pid is not None
        assert f"namesrv: {cluster.namesrv.addr} pid {ns_pid}" in out.stdout
        assert f"namesrvAddr={cluster.namesrv.addr}" in Path(cluster.nodes[0].conf).read_text()
        assert cluster.secure and f"RAFTMQ_CREDENTIALS={base / 'admin.json'}" in out.stdout
        with open_channel(cluster.namesrv.addr, cluster.client_security()) as ch:
            stub = pb_grpc.NameServerStub(ch)

            def registered() -> bool:
                info = stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
                return [m.role for c in info.clusters for g in c.groups for m in g.members] == [
                    pb.LEADER
                ]

            wait_for(registered, CHANGE_DEADLINE_S, "the node registered as leader")
        out = subprocess.run([*cmd, "status"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and f"pid {ns_pid}" in out.stdout
    finally:
        out = subprocess.run([*cmd, "down"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert LocalCluster(base).namesrv_pid() is None
    # --no-namesrv: nodes only, as before.
    LocalCluster(base).configure(1, auto_ports=True, namesrv=False)
    assert LocalCluster(base).namesrv is None
