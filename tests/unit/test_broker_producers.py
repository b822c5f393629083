"""The producer registry (broker.components.producers) and what consumer heartbeats now keep
of their client, without gRPC: expiry, bounds, the per-user quota, owners, RocketMQ 5 clients
registered per topic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_world import world
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.consumers import (
    MAX_CLIENT_INFO_CHARS,
    MAX_KEPT_SUBSCRIPTION_CHARS,
    ConsumerGroups,
)
from broker.components.producers import (
    MAX_PRODUCERS_PER_GROUP,
    PRODUCER_EXPIRE_MS,
    ProducerRegistry,
    TooManyProducersError,
    peer_address,
)
from broker.state.errors import ClientIdTakenError, InvalidRequestError, QuotaExceededError
from client.admin import merged_consumers, merged_producers

V1 = ("127.0.0.1:5000", "PYTHON", "0.3.0")


def registry(per_user: int = 1000) -> tuple[ProducerRegistry, list[int]]:
    reg = ProducerRegistry(per_user)
    clock = [1_000_000]
    reg.clock_ms = lambda: clock[0]
    return reg, clock


def listed(reg: ProducerRegistry, group: str = "") -> list[tuple[str, str, str, str, int]]:
    live, _ = reg.connections(group)
    return [(c.group, c.client_id, c.info.language, c.info.version, age) for c, age in live]


def test_a_producer_is_listed_with_what_it_said_and_forgotten_after_the_expiry() -> None:
    reg, clock = registry()
    reg.heartbeat("pg", "a", V1)
    clock[0] += 1000
    reg.heartbeat("pg", "b", ("127.0.0.1:5001", "", ""))  # a client before 0.3.0: no version
    assert listed(reg, "pg") == [("pg", "a", "PYTHON", "0.3.0", 1000), ("pg", "b", "", "", 0)]
    assert reg.connections("pg")[0][0][0].info.address == "127.0.0.1:5000"
    clock[0] += PRODUCER_EXPIRE_MS - 1000
    reg.heartbeat("pg", "b", V1)  # b beats again, a stays silent
    assert [c for _, c, *_ in listed(reg)] == ["b"]
    assert reg.unregister("pg", "b") and not reg.unregister("pg", "b")
    assert listed(reg) == [] and len(reg) == 0


def test_bad_self_descriptions_are_refused_and_change_nothing() -> None:
    reg, _ = registry()
    for bad in ("x" * (MAX_CLIENT_INFO_CHARS + 1), "PY\nTHON", "é"):
        with pytest.raises(InvalidRequestError):
            reg.heartbeat("pg", "a", ("127.0.0.1:1", bad, "1"))
        with pytest.raises(InvalidRequestError):
            reg.heartbeat("pg", "a", ("127.0.0.1:1", "JAVA", bad))
    with pytest.raises(InvalidRequestError):
        reg.heartbeat("pg", "", V1)
    with pytest.raises(InvalidRequestError):
        reg.heartbeat("bad group name!", "a", V1)
    assert len(reg) == 0


def test_the_table_is_bounded_per_group_and_per_user_and_another_user_is_served() -> None:
    reg, _ = registry(per_user=3)
    for i in range(3):
        reg.heartbeat("pg", f"c{i}", V1, ("alice", False))
    with pytest.raises(QuotaExceededError, match="quota producersPerUser"):
        reg.heartbeat("pg", "c3", V1, ("alice", False))
    reg.heartbeat("pg", "c0", V1, ("alice", False))  # a known producer is still refreshed
    reg.heartbeat("pg", "d0", V1, ("bob", False))
    reg.heartbeat("pg", "root-0", V1, ("root", True))  # a Super user: the table's bound only
    with pytest.raises(ClientIdTakenError):
        reg.heartbeat("pg", "c0", V1, ("bob", False))
    assert not reg.unregister("pg", "c0", ("bob", False))  # not bob's: left alone
    assert len(reg) == 5
    big, _ = registry()
    for i in range(MAX_PRODUCERS_PER_GROUP):
        big.heartbeat("pg", f"c{i}", V1)
    with pytest.raises(TooManyProducersError, match="maxProducersPerGroup"):
        big.heartbeat("pg", "one-more", V1)
    big.heartbeat("other", "one-more", V1)


def test_a_listing_is_bounded_and_says_it_is_truncated() -> None:
    reg, _ = registry()
    for i in range(5):
        reg.heartbeat(f"g{i % 2}", f"c{i}", V1)
    live, more = reg.connections(limit=3)
    assert [(c.group, c.client_id) for c, _ in live] == [("g0", "c0"), ("g0", "c2"), ("g0", "c4")]
    assert more
    live, more = reg.connections("g1", limit=3)
    assert [c.client_id for c, _ in live] == ["c1", "c3"] and not more


def test_a_rocketmq5_producer_is_registered_per_topic_and_kept_alive_by_its_heartbeat() -> None:
    reg, clock = registry()
    reg.v2_settings("v2c", ["TopicA", "TopicB"], ("10.0.0.1:7000", "JAVA", "5.0.7"))
    assert [(g, c, lang) for g, c, lang, *_ in listed(reg)] == [
        ("TopicA", "v2c", "JAVA"),
        ("TopicB", "v2c", "JAVA"),
    ]
    assert {c.info.protocol for c, _ in reg.connections()[0]} == {"v2"}
    reg.v2_settings("v2c", ["TopicA", "TopicB", "TopicC"], ("10.0.0.1:7000", "JAVA", "5.0.7"))
    reg.v2_settings("v2c", ["TopicA", "TopicB"], ("10.0.0.1:7000", "JAVA", "5.0.7"))
    assert [g for g, *_ in listed(reg)] == ["TopicA", "TopicB"]  # TopicC no longer published
    clock[0] += PRODUCER_EXPIRE_MS - 1
    reg.v2_heartbeat("v2c")
    clock[0] += PRODUCER_EXPIRE_MS - 1
    assert len(listed(reg)) == 2  # the heartbeat renewed both
    reg.v2_heartbeat("v2c", ("mallory", False))  # another user's heartbeat renews nothing
    reg.v2_terminated("v2c", ("mallory", False))
    assert len(listed(reg)) == 2
    reg.v2_terminated("v2c")
    assert listed(reg) == []


def test_peer_addresses_are_host_and_port() -> None:
    assert peer_address("ipv4:127.0.0.1:5000") == "127.0.0.1:5000"
    assert peer_address("ipv6:[::1]:5000") == "[::1]:5000"
    assert peer_address("unix:/tmp/s") == "unix:/tmp/s"


def test_consumer_heartbeats_keep_the_clients_version_and_some_subscriptions(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        _, _, topics, _ = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        groups = ConsumerGroups(topics)
        groups.clock_ms = lambda: 5_000_000  # a heartbeat's age is read against this clock
        many = [(f"T{i:03d}", "A || B") for i in range(400)]
        groups.heartbeat("g", "a", many, [], described=("127.0.0.1:9", "PYTHON", "0.3.0"))
        groups.heartbeat("g", "old", [("T", "*")], [])  # a client before 0.3.0
        groups.lock("g", "a", [("T", 1)])
        (a, age, held), (old, _, none) = groups.connections("g")
        assert (a.info.address, a.info.language, a.info.version, age) == (
            "127.0.0.1:9", "PYTHON", "0.3.0", 0,
        )  # fmt: skip
        kept = sum(len(t) + len(e) for t, e in a.info.subscriptions)
        assert 0 < kept <= MAX_KEPT_SUBSCRIPTION_CHARS and a.info.subscriptions_truncated
        assert a.info.subscriptions == tuple(many[: len(a.info.subscriptions)])
        assert held == [("T", 1)]
        assert (old.info.version, old.info.subscriptions, none) == ("", (("T", "*"),), [])

    asyncio.run(body())


def test_the_nodes_answers_are_merged_each_producer_once_as_heard_last() -> None:
    """A RocketMQ 5 client heartbeats only the node it is connected to, raftmq's every node:
    producerConnection and the dashboard merge the nodes' answers, freshest first."""

    def answer(*rows: tuple[str, str, int, str]) -> pb.GetProducerConnectionsResponse:
        return pb.GetProducerConnectionsResponse(
            producers=[
                pb.ProducerConnection(
                    producer_group=g,
                    connection=pb.ClientConnection(
                        client_id=c, last_heartbeat_age_ms=age, address=addr
                    ),
                )
                for g, c, age, addr in rows
            ]
        )

    merged = merged_producers(
        [
            answer(("pg", "b", 900, "n0-view"), ("pg", "a", 10, "n0-view")),
            answer(("pg", "b", 100, "n1-view"), ("T", "v2-only-here", 5, "n1-view")),
        ]
    )
    assert [(p.producer_group, p.connection.client_id, p.connection.address) for p in merged] == [
        ("T", "v2-only-here", "n1-view"),
        ("pg", "a", "n0-view"),
        ("pg", "b", "n1-view"),
    ]


def test_the_nodes_consumer_answers_are_merged_by_protocol_and_client_id() -> None:
    """consumerConnection and the dashboard ask every node: raftmq's consumers heartbeat each,
    a RocketMQ 5 consumer only the node it is connected to; an old broker answers ids only."""

    def conn(client_id: str, protocol: str, age_ms: int, addr: str) -> pb.ClientConnection:
        return pb.ClientConnection(
            client_id=client_id, protocol=protocol, last_heartbeat_age_ms=age_ms, address=addr
        )

    n0 = pb.GetConsumerListResponse(
        client_ids=["a"], connections=[conn("a", "v1", 900, "n0"), conn("same", "v2", 5, "n0")]
    )
    n1 = pb.GetConsumerListResponse(
        client_ids=["a", "same"],
        connections=[conn("a", "v1", 100, "n1"), conn("same", "v1", 50, "n1")],
    )
    old = pb.GetConsumerListResponse(client_ids=["b"])
    merged = merged_consumers([n0, n1, old])
    assert [(c.client_id, c.protocol, c.address) for c in merged] == [
        ("a", "v1", "n1"),
        ("b", "v1", ""),
        ("same", "v1", "n1"),
        ("same", "v2", "n0"),
    ]
