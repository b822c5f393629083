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
    """Create ``topic`` on the group's leader and wait until the NameServer routes it."""
    assert cluster.namesrv is not None
    leader = cluster.wait_leader()
    with grpc.insecure_channel(cluster.node(leader).client_addr) as ch:
        bpb_grpc.BrokerStub(ch).CreateTopic(
            bpb.CreateTopicRequest(
                topic=bpb.TopicConfig(
                    topic_name=topic, read_queue_nums=queues, write_queue_nums=queues
                )
            ),
            timeout=10,
        )
    with grpc.insecure_channel(cluster.namesrv.addr) as ch:
        stub = nspb_grpc.NameServerStub(ch)

        def routed() -> bool:
            try:
                r = stub.GetRouteInfoByTopic(
                    nspb.GetRouteInfoByTopicRequest(topic=topic), timeout=2
                )
            except grpc.RpcError:
                return False
            return len(r.groups) == 1 and bool(r.groups[0].leader_addr)

        wait_for(routed, ROUTE_DEADLINE_S, f"route of {topic}")
