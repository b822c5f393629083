"""What the RocketMQ 5 integration tests share: where the official clients are, and the
generated stubs' helpers to make a topic every node routes, read a status, find a follower."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from support import create_topic_on, wait_for

from broker.cluster import LocalCluster
from broker.rmq5 import stubs

v2, v2_service, v2_grpc = stubs.load()

ROOT = Path(__file__).resolve().parents[1]
RMQ5 = ROOT / "build" / "rmq5"
SCRIPTS = ROOT / "tests" / "rmq5"
PYTHON = RMQ5 / "pyclient" / "bin" / "python"
NODE_MODULES = RMQ5 / "node" / "node_modules"
# Small commitlog and log index files (each allocated in full at start: 1 MiB, not 32, per
# node), and disk marks a shared test machine's disk never reaches.
GROUP_CONF = {
    "mappedFileSizeCommitLog": str(8 << 20),
    "mappedFileSizeEntryIndex": str(1 << 20),
    "diskMaxUsedSpaceRatio": "99",
    "diskSpaceResumeRatio": "98",
}


@contextmanager
def running_group(root: Path, extra: Mapping[str, str]) -> Iterator[LocalCluster]:
    """A 3-node group with v2 ports (``extra``: more broker.conf keys), up until the end."""
    cluster = LocalCluster(root)
    cluster.configure(3, auto_ports=True, extra={**GROUP_CONF, **extra})
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def topic_on_every_node(cluster: LocalCluster, name: str, queues: int) -> str:
    """Create ``name``; return once every member routes it (any node may then be asked)."""
    create_topic_on([cluster], [], name, queues)
    for n in cluster.nodes:
        with grpc.insecure_channel(n.grpc_addr) as ch:
            stub = v2_grpc.MessagingServiceStub(ch)
            ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=name))
            wait_for(lambda s=stub, a=ask: _route_ok(s, a), 10, f"{name} on {n.node_id}")
    return name


def _route_ok(stub: Any, ask: Any) -> bool:
    try:
        return code(stub.QueryRoute(ask, timeout=5).status) == "OK"
    except grpc.RpcError:
        return False


def code(status: Any) -> str:
    """The name of a body status's code."""
    return str(v2.Code.Name(status.code))


def follower_v2_addr(cluster: LocalCluster) -> str:
    leader = cluster.wait_leader()
    return next(n.grpc_addr for n in cluster.nodes if n.node_id != leader)


ROUTE_WAIT_S = 10


def v2_code(status: Any) -> str:
    """The name of a body status's ``apache.rocketmq.v2.Code``."""
    return code(status)


def wait_v2_routes(cluster: LocalCluster, topic: str) -> None:
    """Wait until every member's v2 port routes ``topic`` (each applied its creation)."""
    ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=topic))
    for n in cluster.nodes:
        with grpc.insecure_channel(n.grpc_addr) as ch:
            stub = v2_grpc.MessagingServiceStub(ch)
            wait_for(
                lambda s=stub: _route_ok(s, ask), ROUTE_WAIT_S, f"{topic} routed by {n.node_id}"
            )
