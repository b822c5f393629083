"""Issue 16 against a real NameServer process: an unknown role is INVALID_ARGUMENT (was
UNKNOWN), a registration above gRPC's default 4 MiB is received (the documented 100,000
topics need about 15 MB), huge values get short details, and nothing of it stops the process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc

from nameserver.server import MAX_RECEIVE_MESSAGE_BYTES

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 30.0
MIB = 1 << 20
# An error detail must stay far below gRPC's 16 KiB metadata limit (issue 16: < 1 KiB).
MAX_DETAIL_BYTES = 1024
# 40,000 topics of 127 characters: about 5.5 MB on the wire.
BIG_TABLE_TOPICS = 40_000


def _reg(**change: Any) -> pb.RegisterBrokerRequest:
    values: dict[str, Any] = {
        "cluster": "DefaultCluster",
        "broker_name": "broker-a",
        "node_id": "n0",
        "role": pb.LEADER,
        "client_addr": "127.0.0.1:10911",
        "term": 1,
        "heartbeat_period_ms": 30_000,
    }
    values.update(change)
    return pb.RegisterBrokerRequest(**values)


def _refused(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_unknown_role_is_invalid_argument(name_servers: Callable[..., Any]) -> None:
    ns = name_servers()
    with grpc.insecure_channel(ns.addr) as ch:
        stub = pb_grpc.NameServerStub(ch)
        exc = _refused(lambda: stub.RegisterBroker(_reg(role=99), timeout=RPC_TIMEOUT_S))
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        assert exc.details().startswith("INVALID_REQUEST role 99"), exc.details()
    assert ns.alive()


def test_huge_values_get_short_details(name_servers: Callable[..., Any]) -> None:
    ns = name_servers()
    with grpc.insecure_channel(ns.addr) as ch:
        stub = pb_grpc.NameServerStub(ch)
        for bad in (
            _reg(client_addr="h" * MIB + ":1"),
            _reg(cluster="c" * MIB),
            _reg(topics=[pb.TopicConfig(topic_name="t" * MIB)]),
        ):
            exc = _refused(lambda bad=bad: stub.RegisterBroker(bad, timeout=RPC_TIMEOUT_S))
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()[:200]
            assert exc.details().startswith("INVALID_REQUEST"), exc.details()[:200]
            assert len(exc.details().encode()) < MAX_DETAIL_BYTES

        exc = _refused(
            lambda: stub.GetRouteInfoByTopic(
                pb.GetRouteInfoByTopicRequest(topic="q" * MIB), timeout=RPC_TIMEOUT_S
            )
        )
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()[:200]
        assert len(exc.details().encode()) < MAX_DETAIL_BYTES
    assert ns.alive()


def test_receive_limit_fits_the_documented_tables(name_servers: Callable[..., Any]) -> None:
    ns = name_servers()
    with grpc.insecure_channel(ns.addr) as ch:
        stub = pb_grpc.NameServerStub(ch)
        # above gRPC's default 4 MiB, within the documented limits: received and served
        topics = [
            pb.TopicConfig(
                topic_name=f"{i:06d}".ljust(127, "t"), read_queue_nums=8, write_queue_nums=8, perm=6
            )
            for i in range(BIG_TABLE_TOPICS)
        ]
        big = _reg(topics=topics)
        assert big.ByteSize() > 4 * MIB
        stub.RegisterBroker(big, timeout=RPC_TIMEOUT_S)
        route = stub.GetRouteInfoByTopic(
            pb.GetRouteInfoByTopicRequest(topic=topics[-1].topic_name), timeout=RPC_TIMEOUT_S
        )
        assert [g.leader_addr for g in route.groups] == ["127.0.0.1:10911"]

        # above the NameServer's own receive limit: refused by gRPC, the process goes on
        huge = _reg(topics=[pb.TopicConfig(topic_name="x", perm=6)], node_id="n1")
        huge.cluster = "c" * (MAX_RECEIVE_MESSAGE_BYTES + 1)
        exc = _refused(lambda: stub.RegisterBroker(huge, timeout=RPC_TIMEOUT_S))
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        info = stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
        assert [m.topic_count for c in info.clusters for g in c.groups for m in g.members] == [
            BIG_TABLE_TOPICS
        ]
    assert ns.alive()
