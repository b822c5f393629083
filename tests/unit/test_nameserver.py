"""The NameServer's route table and config, with an injected clock."""

from __future__ import annotations

import pytest

from nameserver import metrics
from nameserver.config import ConfigError, NameServerConfig, parse_config
from nameserver.routes import (
    InvalidRequestError,
    Registration,
    RouteTable,
    TooManyBrokersError,
    TopicNotExistError,
    TopicRoute,
)

TOPIC = TopicRoute("orders", 8, 8, 6)


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def reg(
    node: str,
    role: str = "FOLLOWER",
    term: int = 1,
    topics: tuple[TopicRoute, ...] = (TOPIC,),
    group: str = "broker-a",
    cluster: str = "DefaultCluster",
) -> Registration:
    port = 10911 + 10 * int(node[1:])
    return Registration(cluster, group, node, role, f"127.0.0.1:{port}", term, topics, 30_000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock) -> RouteTable:
    return RouteTable(broker_expired_time_ms=3000, clock_ms=clock)


def test_register_builds_routes_with_leader_and_followers(table: RouteTable) -> None:
    table.register(reg("n0", "LEADER"))
    table.register(reg("n1"))
    table.register(reg("n2"))
    [route] = table.route("orders")
    assert (route.cluster, route.broker_name, route.topic) == ("DefaultCluster", "broker-a", TOPIC)
    assert route.leader is not None and route.leader.node_id == "n0"
    assert route.leader.client_addr == "127.0.0.1:10911"
    assert [f.node_id for f in route.followers] == ["n1", "n2"]
    assert table.all_topics() == ["orders"]
    with pytest.raises(TopicNotExistError):
        table.route("payments")


def test_leader_is_the_leader_with_the_highest_term(table: RouteTable) -> None:
    table.register(reg("n0", "LEADER", term=3))
    table.register(reg("n1", "LEADER", term=4))  # n0's registration is stale (it was killed)
    table.register(reg("n2", "FOLLOWER", term=4))
    [route] = table.route("orders")
    assert route.leader is not None and route.leader.node_id == "n1"
    assert route.leader.term == 4
    assert [f.node_id for f in route.followers] == ["n0", "n2"]
    assert table.leader("DefaultCluster", "broker-a") == route.leader
    # A re-registration replaces the node's previous one.
    table.register(reg("n1", "FOLLOWER", term=5))
    table.register(reg("n2", "LEADER", term=5))
    [route] = table.route("orders")
    assert route.leader is not None and route.leader.node_id == "n2"


def test_no_leader_uses_the_freshest_members_topics(table: RouteTable, clock: Clock) -> None:
    table.register(reg("n0", "CANDIDATE", term=2, topics=()))
    clock.now_ms += 10
    table.register(reg("n1", "FOLLOWER", term=3))
    [route] = table.route("orders")
    assert route.leader is None
    assert [f.node_id for f in route.followers] == ["n0", "n1"]


def test_topic_removal_follows_the_leader(table: RouteTable) -> None:
    table.register(reg("n0", "LEADER", topics=(TOPIC, TopicRoute("tmp", 4, 4, 6))))
    table.register(reg("n1", topics=(TOPIC, TopicRoute("tmp", 4, 4, 6))))
    assert table.all_topics() == ["orders", "tmp"]
    table.register(reg("n0", "LEADER", topics=(TOPIC,)))  # deleted on the leader first
    assert table.all_topics() == ["orders"]
    with pytest.raises(TopicNotExistError):
        table.route("tmp")


def test_topics_over_two_groups(table: RouteTable) -> None:
    table.register(reg("n0", "LEADER", group="broker-a"))
    table.register(reg("n1", "LEADER", group="broker-b", topics=(TopicRoute("orders", 4, 4, 6),)))
    routes = table.route("orders")
    assert [(r.broker_name, r.topic.write_queue_nums) for r in routes] == [
        ("broker-a", 8),
        ("broker-b", 4),
    ]
    info = table.cluster_info()
    assert [(g.broker_name, g.leader_id) for g in info] == [("broker-a", "n0"), ("broker-b", "n1")]


def test_expiry_with_injected_clock(table: RouteTable, clock: Clock) -> None:
    table.register(reg("n0", "LEADER"))
    table.register(reg("n1"))
    clock.now_ms += 2000
    table.register(reg("n1"))  # n1 keeps heartbeating, n0 went silent
    clock.now_ms += 1000
    assert table.scan_expired() == []  # n0 silent exactly 3000 ms: not more than the limit
    [group] = table.cluster_info()
    assert [(r.node_id, age) for r, age in group.members] == [("n0", 3000), ("n1", 1000)]
    clock.now_ms += 1
    assert table.scan_expired() == [("DefaultCluster", "broker-a", "n0")]
    [route] = table.route("orders")
    assert route.leader is None and [f.node_id for f in route.followers] == ["n1"]
    clock.now_ms += 5000
    assert table.scan_expired() == [("DefaultCluster", "broker-a", "n1")]
    assert len(table) == 0 and table.cluster_info() == [] and table.all_topics() == []


def test_unregister(table: RouteTable) -> None:
    table.register(reg("n0", "LEADER"))
    table.register(reg("n1"))
    assert table.unregister("DefaultCluster", "broker-a", "n0")
    assert not table.unregister("DefaultCluster", "broker-a", "n0")
    assert not table.unregister("OtherCluster", "broker-a", "n1")
    [route] = table.route("orders")
    assert route.leader is None
    assert table.unregister("DefaultCluster", "broker-a", "n1")
    with pytest.raises(TopicNotExistError):
        table.route("orders")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cluster": ""}, "cluster"),
        ({"broker_name": "a b"}, "broker_name"),
        ({"node_id": "x" * 128}, "node_id"),
        ({"role": "BROKER_ROLE_UNSPECIFIED"}, "role"),
        ({"client_addr": "localhost"}, "client_addr"),
        ({"client_addr": "h:70000"}, "client_addr"),
        ({"term": -1}, "term"),
        ({"topics": (TopicRoute("bad topic", 1, 1, 6),)}, "topic"),
        ({"topics": (TopicRoute("t", 2000, 1, 6),)}, "queue nums"),
        ({"topics": (TopicRoute("t", 1, 1, 9),)}, "perm"),
        ({"topics": (TopicRoute("t", 1, 1, 6, "ORDERED"),)}, "message type"),
        ({"rmq5_addr": "no-port"}, "rmq5_addr"),
        ({"rmq5_addr": "h o st:8081"}, "rmq5_addr"),
        ({"release": "0.3.0 " * 2}, "release"),
        ({"release": "9" * 33}, "release"),
        ({"supported_feature_level": (1 << 16) + 1}, "feature levels"),
        ({"feature_level": -1}, "feature levels"),
    ],
)
def test_bad_registration_names_the_field(
    table: RouteTable, change: dict[str, object], field: str
) -> None:
    import dataclasses

    bad = dataclasses.replace(reg("n0"), **change)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match=field):
        table.register(bad)
    assert len(table) == 0


def test_routes_carry_the_rmq5_addresses_and_message_type(table: RouteTable) -> None:
    import dataclasses

    fifo = (TopicRoute("orders", 4, 4, 6, "FIFO"),)
    table.register(dataclasses.replace(reg("n0", "LEADER", 2, fifo), rmq5_addr="127.0.0.1:8081"))
    table.register(dataclasses.replace(reg("n1", "FOLLOWER", 2, fifo), rmq5_addr="127.0.0.1:8082"))
    [route] = table.route("orders")
    assert route.topic.message_type == "FIFO"
    assert route.leader is not None and route.leader.rmq5_addr == "127.0.0.1:8081"
    assert [f.rmq5_addr for f in route.followers] == ["127.0.0.1:8082"]


def test_cluster_info_carries_release_and_feature_levels() -> None:
    """What brokerStatus shows per node (docs/RAFT.md section 14); a node of a release before
    feature levels registers none (""/0)."""
    from raftmq.nameserver.v1 import nameserver_pb2 as pb

    from nameserver.server import registration_from_pb

    new = pb.RegisterBrokerRequest(
        cluster="c",
        broker_name="b",
        node_id="n0",
        role=pb.LEADER,
        client_addr="127.0.0.1:1",
        release="0.3.0.dev0",
        supported_feature_level=2,
        feature_level=1,
    )
    r = registration_from_pb(new)
    assert (r.release, r.supported_feature_level, r.feature_level) == ("0.3.0.dev0", 2, 1)
    old = pb.RegisterBrokerRequest(
        cluster="c", broker_name="b", node_id="n1", role=pb.FOLLOWER, client_addr="127.0.0.1:2"
    )
    r = registration_from_pb(old)
    assert (r.release, r.supported_feature_level, r.feature_level) == ("", 0, 0)


def test_node_limit(clock: Clock) -> None:
    table = RouteTable(clock_ms=clock, max_nodes=2)
    table.register(reg("n0"))
    table.register(reg("n1"))
    table.register(reg("n1", "LEADER", term=2))  # an update is always accepted
    with pytest.raises(TooManyBrokersError):
        table.register(reg("n2"))


def test_config_keys_are_strict() -> None:
    assert parse_config("") == NameServerConfig()
    cfg = parse_config("listenPort=9877\nbrokerExpiredTime=3000\nscanNotActiveBrokerInterval=500\n")
    assert (cfg.listenPort, cfg.brokerExpiredTime, cfg.scanNotActiveBrokerInterval) == (
        9877,
        3000,
        500,
    )
    assert NameServerConfig().listenPort == 9876
    assert NameServerConfig().brokerExpiredTime == 120_000
    assert NameServerConfig().scanNotActiveBrokerInterval == 10_000
    with pytest.raises(ConfigError, match="unknown key 'listenport'"):
        parse_config("listenport=1\n")
    with pytest.raises(ConfigError, match=r"'brokerExpiredTime'.*out of range"):
        parse_config("brokerExpiredTime=5\n")
    with pytest.raises(ConfigError, match="set twice"):
        parse_config("listenPort=1\nlistenPort=2\n")


def _samples(table: RouteTable) -> dict[str, dict[tuple[str, ...], float]]:
    """The NameServer's families: sample name -> label values -> value."""
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in metrics.nameserver_families(table, metrics.NameServerStats()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(s.labels.values())] = s.value
    return out


def test_groups_per_cluster_and_nodes_per_group_are_gauges(table: RouteTable, clock: Clock) -> None:
    for node in ("n0", "n1", "n2"):
        table.register(reg(node))
    table.register(reg("n3", group="broker-b"))
    table.register(reg("n4", group="broker-c", cluster="Other"))
    got = _samples(table)
    assert got["raftmq_nameserver_cluster_groups"] == {("DefaultCluster",): 2, ("Other",): 1}
    assert got["raftmq_nameserver_group_brokers"] == {
        ("DefaultCluster", "broker-a"): 3,
        ("DefaultCluster", "broker-b"): 1,
        ("Other", "broker-c"): 1,
    }
    # A group whose last node expired is gone from both.
    clock.now_ms += 10 * table.broker_expired_time_ms
    table.register(reg("n0"))
    assert len(table.scan_expired()) == 4
    got = _samples(table)
    assert got["raftmq_nameserver_group_brokers"] == {("DefaultCluster", "broker-a"): 1}
    assert got["raftmq_nameserver_cluster_groups"] == {("DefaultCluster",): 1}


def test_the_group_families_are_capped_and_the_cut_counted(
    table: RouteTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    for g in range(5):
        table.register(reg("n0", group=f"broker-{g}", cluster=f"C{g % 3}"))
    monkeypatch.setattr(metrics, "MAX_GROUP_SERIES", 2)
    got = _samples(table)
    assert len(got["raftmq_nameserver_group_brokers"]) == 2
    assert len(got["raftmq_nameserver_cluster_groups"]) == 2
    omitted = got["raftmq_metrics_series_omitted"]
    assert omitted == {
        ("raftmq_nameserver_cluster_groups",): 1,
        ("raftmq_nameserver_group_brokers",): 3,
    }
