"""RouteClient against an in-process fake NameServer: fall-over from a dead NameServer, the
route cache and its refresh, error codes, and the no-import rule of client/."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc

from client.errors import MQClientError
from client.message import MessageQueue
from client.route import ChannelPool, RouteClient, first_namesrv_answer, parse_namesrv_addr
from mqcluster.cluster import _free_port


class FakeNameServer(pb_grpc.NameServerServicer):
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def GetRouteInfoByTopic(
        self, request: pb.GetRouteInfoByTopicRequest, context: grpc.ServicerContext
    ) -> pb.GetRouteInfoByTopicResponse:
        with self.lock:
            self.calls += 1
        if request.topic != "T":
            context.abort(grpc.StatusCode.NOT_FOUND, f"TOPIC_NOT_EXIST {request.topic}")
        return pb.GetRouteInfoByTopicResponse(
            topic="T",
            groups=[
                pb.GroupRoute(
                    broker_name="broker-a",
                    read_queue_nums=2,
                    write_queue_nums=2,
                    perm=6,
                    leader_id="n0",
                    leader_addr="127.0.0.1:1",
                    followers=[pb.NodeAddr(node_id="n1", addr="127.0.0.1:2")],
                ),
                pb.GroupRoute(
                    broker_name="broker-b", read_queue_nums=1, write_queue_nums=1, perm=4
                ),
            ],
        )


@pytest.fixture
def fake() -> Iterator[tuple[FakeNameServer, str]]:
    servicer = FakeNameServer()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_NameServerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None).wait()


def test_falls_over_from_a_dead_namesrv_and_caches(fake: tuple[FakeNameServer, str]) -> None:
    servicer, addr = fake
    channels = ChannelPool()
    try:
        for _ in range(5):  # the random first pick hits the dead one about half the time
            routes = RouteClient(f"127.0.0.1:{_free_port()};{addr}", channels)
            route = routes.get_route("T")
            assert route.write_queues() == [
                MessageQueue("T", "broker-a", 0),
                MessageQueue("T", "broker-a", 1),
            ]
            assert len(route.read_queues()) == 3
            group = route.group("broker-a")
            assert group is not None and group.addrs == ("127.0.0.1:1", "127.0.0.1:2")
        calls = servicer.calls
        routes.get_route("T")
        assert servicer.calls == calls  # cached
        routes.get_route("T", force=True)
        assert servicer.calls == calls + 1
        expiring = RouteClient(addr, channels, poll_interval_s=0.0)
        expiring.get_route("T")
        expiring.get_route("T")
        assert servicer.calls == calls + 3  # older than the poll interval: asked again
        with pytest.raises(MQClientError) as info:
            routes.get_route("Nope")
        assert (info.value.code, info.value.status) == ("TOPIC_NOT_EXIST", "NOT_FOUND")
    finally:
        channels.close()


def test_all_namesrvs_dead_and_bad_addr() -> None:
    channels = ChannelPool()
    try:
        routes = RouteClient(f"127.0.0.1:{_free_port()}", channels)
        with pytest.raises(MQClientError) as info:
            routes.get_route("T")
        assert info.value.status in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    finally:
        channels.close()
    assert parse_namesrv_addr(" a:1 ; b:2 ;") == ["a:1", "b:2"]
    with pytest.raises(MQClientError):
        parse_namesrv_addr(" ; ")


def test_first_namesrv_answer_passes_over_a_dead_one_only(
    fake: tuple[FakeNameServer, str],
) -> None:
    """The admin tool's and the dashboard's NameServer reads: a dead NameServer passes the
    call on, an error answer is final (asking the next one would get the same)."""
    servicer, addr = fake
    dead = f"127.0.0.1:{_free_port()}"
    channels = ChannelPool()

    def route(topic: str) -> Callable[[pb_grpc.NameServerStub], pb.GetRouteInfoByTopicResponse]:
        def call(stub: pb_grpc.NameServerStub) -> pb.GetRouteInfoByTopicResponse:
            resp: pb.GetRouteInfoByTopicResponse = stub.GetRouteInfoByTopic(
                pb.GetRouteInfoByTopicRequest(topic=topic), timeout=2
            )
            return resp

        return call

    try:
        resp = first_namesrv_answer(channels, [dead, addr], route("T"))
        assert resp.topic == "T"
        calls = servicer.calls
        with pytest.raises(MQClientError) as info:
            first_namesrv_answer(channels, [addr, addr], route("Nope"))
        assert info.value.code == "TOPIC_NOT_EXIST" and servicer.calls == calls + 1
        with pytest.raises(MQClientError) as info:
            first_namesrv_answer(channels, [dead], route("T"))
        assert info.value.status in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    finally:
        channels.close()
