"""Helpers shared by the test modules (pytest puts `tests/` on sys.path: `pythonpath`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as nspb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as nspb_grpc

from broker.cluster import LocalCluster

# How long a topic may take to appear in the NameServer's routes (registration on change).
ROUTE_DEADLINE_S = 10.0
# Names of the threads the client library starts; none may outlive its client.
CLIENT_THREAD_PREFIXES = ("producer", "consume", "rebalance")


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def client_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(CLIENT_THREAD_PREFIXES)]


def create_topic(cluster: LocalCluster, topic: str, queues: int) -> None:
    """Create ``topic`` on the group's leader and wait until its NameServer routes it."""
    assert cluster.namesrv is not None
    create_topic_on([cluster], [cluster.namesrv.addr], topic, queues)


def create_topic_on(
    groups: list[LocalCluster], namesrv_addrs: list[str], topic: str, queues: int
) -> None:
    """Create ``topic`` on every group's leader; wait until every NameServer routes it to every
    group with a leader address."""
    for g in groups:
        with grpc.insecure_channel(g.node(g.wait_leader()).client_addr) as ch:
            bpb_grpc.BrokerStub(ch).CreateTopic(
                bpb.CreateTopicRequest(
                    topic=bpb.TopicConfig(
                        topic_name=topic, read_queue_nums=queues, write_queue_nums=queues
                    )
                ),
                timeout=10,
            )
    for addr in namesrv_addrs:
        with grpc.insecure_channel(addr) as ch:
            stub = nspb_grpc.NameServerStub(ch)

            def routed(stub: nspb_grpc.NameServerStub = stub) -> bool:
                try:
                    r = stub.GetRouteInfoByTopic(
                        nspb.GetRouteInfoByTopicRequest(topic=topic), timeout=2
                    )
                except grpc.RpcError:
                    return False
                return len(r.groups) == len(groups) and all(g.leader_addr for g in r.groups)

            wait_for(routed, ROUTE_DEADLINE_S, f"route of {topic} on {addr}")


def pull_ids(addr: str, topic: str, queue_id: int) -> list[str]:
    """The msg ids of every message in one queue, as the node at ``addr`` serves them."""
    ids: list[str] = []
    with grpc.insecure_channel(addr) as ch:
        stub = bpb_grpc.BrokerStub(ch)
        offset = 0
        while True:
            resp = stub.PullMessage(
                bpb.PullMessageRequest(
                    consumer_group="test-pull-ids",
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msgs=1024,
                    no_suspend=True,
                ),
                timeout=10,
            )
            ids += [m.msg_id for m in resp.messages]
            if not resp.messages:
                return ids
            offset = resp.next_begin_offset
