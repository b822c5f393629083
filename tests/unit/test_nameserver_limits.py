"""Issue 16, the NameServer: every field and table bounded, every refusal INVALID_REQUEST (or
TOO_MANY_*) with a short detail, and a receive limit that fits the largest valid registration."""

from __future__ import annotations

import dataclasses

import pytest
from raftmq.nameserver.v1 import nameserver_pb2 as pb

from nameserver.routes import (
    ECHO_MAX_CHARS,
    MAX_HEARTBEAT_PERIOD_MS,
    MAX_HOST_LEN,
    MAX_NAME_LEN,
    MAX_QUEUE_NUMS,
    MAX_TOPICS_PER_NODE,
    InvalidRequestError,
    Registration,
    RouteTable,
    TooManyTopicsError,
    TopicRoute,
)
from nameserver.server import (
    MAX_RECEIVE_MESSAGE_BYTES,
    SERVER_OPTIONS,
    registration_from_pb,
)

# gRPC's default receive limit, which the NameServer used to keep.
GRPC_DEFAULT_RECEIVE_BYTES = 4 << 20
MIB = 1 << 20


def reg(node: str = "n0", topics: tuple[TopicRoute, ...] = (), **change: object) -> Registration:
    base = Registration(
        "DefaultCluster", "broker-a", node, "LEADER", "127.0.0.1:10911", 1, topics, 30_000
    )
    return dataclasses.replace(base, **change)  # type: ignore[arg-type]


def test_unknown_role_number_is_invalid_request() -> None:
    """Role 99 used to raise ValueError in the enum lookup: gRPC answered UNKNOWN."""
    req = pb.RegisterBrokerRequest(
        cluster="c",
        broker_name="b",
        node_id="n",
        role=99,  # type: ignore[arg-type]
        client_addr="h:1",
    )
    with pytest.raises(InvalidRequestError, match="role 99"):
        registration_from_pb(req)
    req.role = pb.BROKER_ROLE_UNSPECIFIED
    with pytest.raises(InvalidRequestError, match="role"):
        RouteTable().register(registration_from_pb(req))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cluster": "c" * MIB}, "cluster"),
        ({"broker_name": "b" * MIB}, "broker_name"),
        ({"node_id": "n" * MIB}, "node_id"),
        ({"role": "R" * MIB}, "role"),
        ({"client_addr": "h" * MIB + ":1"}, "client_addr"),
        ({"client_addr": "h" * (MAX_HOST_LEN + 1) + ":1"}, "client_addr"),
        ({"client_addr": "bad host:1"}, "client_addr"),
        ({"client_addr": "h:" + "1" * 40}, "client_addr"),
        ({"client_addr": "h:١٢"}, "client_addr"),  # unicode digits are not a port
        ({"heartbeat_period_ms": MAX_HEARTBEAT_PERIOD_MS + 1}, "heartbeat_period_ms"),
        ({"heartbeat_period_ms": -1}, "heartbeat_period_ms"),
        ({"topics": (TopicRoute("t" * MIB, 1, 1, 6),)}, "topic"),
        ({"topics": (TopicRoute("t", 1, 1, 6), TopicRoute("t", 2, 2, 6))}, "listed twice"),
    ],
)
def test_bad_fields_are_refused_with_a_short_detail(change: dict[str, object], field: str) -> None:
    table = RouteTable()
    with pytest.raises(InvalidRequestError, match=field) as info:
        table.register(reg(**change))
    detail = f"{info.value.code} {info.value}"
    assert len(detail.encode()) < 400, detail[:200]
    assert len(table) == 0 and table.topic_entries == 0


def test_longest_valid_values_are_accepted() -> None:
    table = RouteTable()
    name = "n" * MAX_NAME_LEN
    table.register(
        reg(
            cluster=name,
            broker_name=name,
            node_id=name,
            client_addr="h" * MAX_HOST_LEN + ":65535",
            heartbeat_period_ms=MAX_HEARTBEAT_PERIOD_MS,
            topics=(TopicRoute("t" * MAX_NAME_LEN, MAX_QUEUE_NUMS, MAX_QUEUE_NUMS, 7),),
        )
    )
    table.register(reg("n1", client_addr="[fe80::1%eth0]:10911"))
    assert len(table) == 2


def test_unregister_and_route_validate_names_and_bound_the_echo() -> None:
    table = RouteTable()
    with pytest.raises(InvalidRequestError) as info:
        table.unregister("c" * MIB, "b", "n")
    assert len(str(info.value)) < 200 and f"({MIB} chars)" in str(info.value)
    with pytest.raises(InvalidRequestError, match="topic"):
        table.route("q" * MIB)
    with pytest.raises(InvalidRequestError, match="topic"):
        table.route("")
    assert ECHO_MAX_CHARS < 100


def test_topic_entries_are_bounded_over_all_registrations() -> None:
    table = RouteTable(max_topic_entries=10)
    five = tuple(TopicRoute(f"t{i}", 1, 1, 6) for i in range(5))
    table.register(reg("n0", five))
    table.register(reg("n1", five))
    assert table.topic_entries == 10
    with pytest.raises(TooManyTopicsError):
        table.register(reg("n2", five[:1]))
    table.register(reg("n1", five))  # the same size again: an update is accepted
    table.register(reg("n1", five[:2]))  # shrinking frees entries
    assert table.topic_entries == 7
    table.register(reg("n2", five[:3]))
    assert table.unregister("DefaultCluster", "broker-a", "n0")
    assert table.topic_entries == 5
    assert [g.broker_name for g in table.route("t1")] == ["broker-a"]


def _largest_valid_registration() -> pb.RegisterBrokerRequest:
    name = "x" * MAX_NAME_LEN
    req = pb.RegisterBrokerRequest(
        cluster=name,
        broker_name=name,
        node_id=name,
        role=pb.LEADER,
        client_addr="h" * MAX_HOST_LEN + ":65535",
        term=2**63 - 1,
        heartbeat_period_ms=MAX_HEARTBEAT_PERIOD_MS,
    )
    for i in range(MAX_TOPICS_PER_NODE):
        req.topics.add(
            topic_name=f"{i:06d}".ljust(MAX_NAME_LEN, "t"),
            read_queue_nums=MAX_QUEUE_NUMS,
            write_queue_nums=MAX_QUEUE_NUMS,
            perm=7,
        )
    return req


def test_receive_limit_holds_the_largest_valid_registration() -> None:
    """The docs allow 100,000 topics per registration: about 15 MB, which gRPC's default
    4 MiB receive limit refused before the request reached the NameServer."""
    req = _largest_valid_registration()
    size = req.ByteSize()
    assert size > GRPC_DEFAULT_RECEIVE_BYTES
    assert size < MAX_RECEIVE_MESSAGE_BYTES
    assert ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES) in SERVER_OPTIONS
    RouteTable().register(registration_from_pb(req))  # and it is valid
