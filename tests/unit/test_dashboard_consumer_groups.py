"""The Consumers page's data (GroupReader.consumer_groups) over a fake cluster: every node of
each broker group is asked, so a group whose only clients are RocketMQ 5 consumers connected to
a follower is listed, and a client known to several nodes or broker groups is counted once."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb

from mqdashboard.reader import GroupReader


class Down(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "node down"


def info(group: str, v1: int = 0, v2: int = 0, topics: tuple[str, ...] = ()) -> Any:
    return pb.ConsumerGroupInfo(
        consumer_group=group, topics=topics, online_clients=v1, online_v2_clients=v2
    )


def conn(client_id: str, protocol: str) -> Any:
    return pb.ClientConnection(client_id=client_id, protocol=protocol)


class FakeNode:
    """One node's answers: its ListConsumerGroups rows and each group's connections."""

    def __init__(self, groups: list[Any], clients: dict[str, list[Any]]) -> None:
        self.groups = groups
        self.clients = clients

    def ListConsumerGroups(self, req: Any, timeout: float) -> Any:
        return pb.ListConsumerGroupsResponse(groups=self.groups)

    def GetConsumerList(self, req: Any, timeout: float) -> Any:
        found = self.clients.get(req.consumer_group, [])
        return pb.GetConsumerListResponse(
            client_ids=[c.client_id for c in found if c.protocol == "v1"], connections=found
        )


class DownNode:
    def ListConsumerGroups(self, req: Any, timeout: float) -> Any:
        raise Down()

    def GetConsumerList(self, req: Any, timeout: float) -> Any:
        raise Down()


V1 = [conn("c1", "v1"), conn("c2", "v1")]
# broker-a: a0 the leader, a1 and a2 followers. Every node knows the raftmq clients c1 and c2
# of "orders". "pop-only" has one RocketMQ 5 client on a1 and no offset yet: a1 alone lists it.
# "mixed": raftmq's c3 on every node, the RocketMQ 5 client "x" connected to a1 and a2.
# broker-b: c1 heartbeats it too (its topic "audit" is served there); b2 is down.
NODES: dict[str, Any] = {
    "a0": FakeNode(
        [info("orders", v1=2, topics=("Orders",)), info("mixed", v1=1)],
        {"orders": V1, "mixed": [conn("c3", "v1")]},
    ),
    "a1": FakeNode(
        [info("orders", v1=2, topics=("Orders",)), info("pop-only", v2=1), info("mixed", 1, 1)],
        {
            "orders": V1,
            "pop-only": [conn("p1", "v2")],
            "mixed": [conn("c3", "v1"), conn("x", "v2")],
        },
    ),
    "a2": FakeNode(
        [info("orders", v1=2, topics=("Orders",)), info("mixed", v1=1, v2=1)],
        {"orders": V1, "mixed": [conn("c3", "v1"), conn("x", "v2")]},
    ),
    "b0": FakeNode([info("orders", v1=1, topics=("Audit",))], {"orders": V1[:1]}),
    "b1": FakeNode([info("orders", v1=1, topics=("Audit",))], {"orders": V1[:1]}),
    "b2": DownNode(),
}


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Any:
    r = GroupReader("127.0.0.1:1")
    members = {"broker-a": ["a0", "a1", "a2"], "broker-b": ["b0", "b1", "b2"]}
    monkeypatch.setattr(r, "_leaders", lambda: members)
    monkeypatch.setattr(r.channels, "broker", lambda addr: NODES[addr])
    yield r
    r.close()


def test_every_node_is_asked_and_each_client_counted_once(reader: GroupReader) -> None:
    views = {g.name: (g.topics, g.online_clients) for g in reader.consumer_groups()}
    assert views == {
        "mixed": ([], 2),  # c3 on three nodes, x on two: two clients
        "orders": (["Audit", "Orders"], 2),  # c1 on both broker groups
        "pop-only": ([], 1),  # known to the follower a1 only
    }


def test_the_samplers_estimate_lists_the_follower_only_group(reader: GroupReader) -> None:
    views = {g.name: g.online_clients for g in reader.consumer_groups(exact_clients=False)}
    assert views == {"mixed": 3, "orders": 3, "pop-only": 1}
