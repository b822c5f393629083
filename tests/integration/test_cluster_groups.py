"""Several secure broker groups under one NameServer, one CA and one set of users
(mqcluster.groups): produce and consume across them, a user recorded once or made with
mqadmin createUser reaches a group added later, a group added while a producer runs gets its
share of the sends, and mqadmin copyUser / copyAcl copy users and rules between groups."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import TEST_INDEX_FILE_BYTES, TEST_SEGMENT_BYTES
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from support import wait_for

from client import Message, MessageQueue, MQClientError, Producer, PullConsumer, SendResult
from client.admin import PERM_READ_WRITE, MQAdmin
from client.mqadmin import main as mqadmin
from client.route import PERM_READ
from mqcluster.cluster import ClusterError
from mqcluster.groups import Groups
from mqsecurity.channels import open_channel
from mqsecurity.credentials import Credentials

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

TOPIC = "Spread"
QUEUES = 2
# The producer asks the NameServer for routes this often (RocketMQ's pollNameServerInterval,
# 30 s by default): a new group's queues are used within it.
POLL_S = 0.5
DEADLINE_S = 30.0
# Sends the background producer makes at most (bounds the test).
MAX_SENDS = 5000


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Groups]:
    cluster = Groups(tmp_path / "cluster")
    extra = {
        "mappedFileSizeCommitLog": str(TEST_SEGMENT_BYTES),
        "mappedFileSizeEntryIndex": str(TEST_INDEX_FILE_BYTES),
    }
    try:
        cluster.configure(2, 3, auto_ports=True, extra=extra, namesrv=True, secure=True)
        cluster.up()
        yield cluster
    finally:
        Groups(tmp_path / "cluster").down(grace_s=5.0)


def _read_all(groups: Groups, topic: str) -> set[str]:
    security = groups.security()
    got: set[str] = set()
    with PullConsumer("groups-reader", groups.namesrv_addr, security=security) as reader:
        for mq in reader.fetch_queues(topic):
            offset = 0
            for _ in range(MAX_SENDS):  # bounded: each pull returns at least one message
                r = reader.pull(mq, offset, max_nums=256)
                if not r.messages:
                    break
                got.update(m.msg_id for m in r.messages)
                offset = r.next_begin_offset
    return got


def _users_of(groups: Groups, name: str) -> set[str]:
    g = groups.group(name)
    leader = g.node(g.wait_leader())
    with open_channel(leader.client_addr, groups.security()) as ch:
        users = bpb_grpc.BrokerStub(ch).ListUser(bpb.ListUserRequest(), timeout=10).users
    return {u.username for u in users}


# A user made with mqadmin createUser (mqcluster keeps no secret of it).
CAROL = Credentials("carol", "carol-secret-1")


class _OnGroup:
    """A queue selector: the first queue of one broker group."""

    def __init__(self, group: str) -> None:
        self.group = group

    def select(self, queues: Sequence[MessageQueue], msg: Message, arg: object) -> MessageQueue:
        return next(q for q in queues if q.broker_name == self.group)


def _send_as(groups: Groups, creds: Credentials, group: str) -> SendResult:
    """One send by ``creds`` to a queue of ``group``."""
    security = dataclasses.replace(groups.security(), credentials=creds)
    with Producer(f"groups-{creds.access_key}", groups.namesrv_addr, security=security) as p:
        return p.send(Message(TOPIC, creds.access_key.encode()), _OnGroup(group))


def test_two_secure_groups_then_a_third_added_under_load(groups: Groups) -> None:
    security = groups.security()
    admin = MQAdmin(groups.namesrv_addr, security)
    assert admin.create_topic(TOPIC, QUEUES) == ["broker-a", "broker-b"]
    _, made_on = groups.add_user("alice")
    assert made_on == ["broker-a", "broker-b"]
    assert set(admin.create_user(CAROL.access_key, CAROL.secret_key)) == {"broker-a", "broker-b"}
    admin.put_acl(f"User:{CAROL.access_key}", [f"Topic:{TOPIC}"], ["Pub"])

    acked: dict[str, str] = {}  # msg id -> group
    stop = threading.Event()
    failures: list[BaseException] = []
    producer = Producer(
        "groups-p", groups.namesrv_addr, security=security, poll_name_server_interval_s=POLL_S
    )

    def produce() -> None:
        for i in range(MAX_SENDS):
            if stop.is_set():
                return
            try:
                r = producer.send(Message(TOPIC, f"m{i}".encode()))
            except MQClientError as exc:  # not acknowledged: not counted
                failures.append(exc)
                continue
            acked[r.msg_id] = r.message_queue.broker_name

    with producer:
        sender = threading.Thread(target=produce, name="groups-producer")
        sender.start()
        try:
            wait_for(
                lambda: {"broker-a", "broker-b"} <= set(acked.values()),
                DEADLINE_S,
                "sends acknowledged by both groups",
            )
            added = groups.add_group()
            assert added.group == "broker-c"
            assert added.topics == [TOPIC] and added.users == ["alice", "carol"]
            assert added.acl_subjects == ["User:carol"]
            wait_for(lambda: "broker-c" in acked.values(), DEADLINE_S, "a send on the added group")
            on_c = sum(1 for g in list(acked.values()) if g == "broker-c")
            deadline = time.monotonic() + DEADLINE_S
            while sum(1 for g in list(acked.values()) if g == "broker-c") < on_c + 20:
                assert time.monotonic() < deadline, "the added group's queues are not used"
                time.sleep(0.05)
        finally:
            stop.set()
            sender.join(timeout=DEADLINE_S)
    assert not sender.is_alive()
    assert len(failures) < len(acked) // 10, failures[:3]
    assert {"alice", "carol"} <= _users_of(groups, "broker-c")
    # carol's secret reached broker-c sealed, and her rule with it: she can send there.
    assert _send_as(groups, CAROL, "broker-c").message_queue.broker_name == "broker-c"
    read: set[str] = set()
    wait_for(
        lambda: read.update(_read_all(groups, TOPIC)) or set(acked) <= read,
        DEADLINE_S,
        "every acknowledged send read back",
    )
    by_group = {g: sum(1 for x in acked.values() if x == g) for g in set(acked.values())}
    assert set(by_group) == {"broker-a", "broker-b", "broker-c"}, by_group


def _leader_addr(groups: Groups, name: str) -> str:
    g = groups.group(name)
    return g.node(g.wait_leader()).client_addr


def _follower_addr(groups: Groups, name: str) -> str:
    g = groups.group(name)
    leader = g.wait_leader()
    return next(n.client_addr for n in g.nodes if n.node_id != leader)


def test_mqadmin_copies_users_and_rules_between_groups(
    groups: Groups, capsys: pytest.CaptureFixture[str]
) -> None:
    """copyUser / copyAcl from broker-a to broker-b (named by a follower: the leader is found),
    twice (the second changes nothing)."""
    admin = MQAdmin(groups.namesrv_addr, groups.security())
    admin.create_topic(TOPIC, QUEUES)
    a = _leader_addr(groups, "broker-a")
    admin.create_user(CAROL.access_key, CAROL.secret_key, broker_addr=a)
    admin.put_acl("User:carol", [f"Topic:{TOPIC}"], ["Pub"], broker_addr=a)
    with pytest.raises(MQClientError, match="unknown or disabled"):
        _send_as(groups, CAROL, "broker-b")
    tool = ["-n", groups.namesrv_addr, *groups.first.tool_argv(), "--json"]
    to_b = ["-f", a, "-t", _follower_addr(groups, "broker-b")]
    outcomes = []
    for _ in range(2):
        assert mqadmin([*tool, "copyUser", *to_b, "-u", "carol"]) == 0
        outcomes.append(capsys.readouterr().out)
        assert mqadmin([*tool, "copyAcl", *to_b, "-u", "carol"]) == 0
        assert '"resource": "Topic:Spread"' in capsys.readouterr().out
    assert '"created"' in outcomes[0] and '"unchanged"' in outcomes[1], outcomes
    assert _send_as(groups, CAROL, "broker-b").message_queue.broker_name == "broker-b"
    # Every user at once: the admin and carol are there already.
    assert mqadmin([*tool, "copyUser", *to_b]) == 0
    assert '"created"' not in capsys.readouterr().out


def test_remove_group_makes_its_topics_read_only_and_stops_it(groups: Groups) -> None:
    admin = MQAdmin(groups.namesrv_addr, groups.security())
    admin.create_topic(TOPIC, QUEUES)
    wait_for(
        lambda: len({g.broker_name for g in admin.topic_route_info(TOPIC).groups}) == 2,
        DEADLINE_S,
        "the topic routed to both groups",
    )
    _remove_waits_for_a_lagging_consumer(groups, admin)
    # The refused removal made the topic read-only already: this one has nothing to freeze.
    assert groups.remove_group("broker-b") == []
    assert [g.group for g in groups.all()] == ["broker-a"]
    wait_for(
        lambda: [g.broker_name for g in admin.topic_route_info(TOPIC).groups] == ["broker-a"],
        DEADLINE_S,
        "the removed group gone from the route",
    )
    with pytest.raises(Exception, match="runs the cluster's NameServer"):
        groups.remove_group("broker-a")


def _remove_waits_for_a_lagging_consumer(groups: Groups, admin: MQAdmin) -> None:
    """A consumer group with unread messages on broker-b: remove-group waits for it, and
    when its drain time runs out refuses with what is left, broker-b still running; once
    the consumer has read them the removal goes ahead (the caller removes it)."""
    security = groups.security()
    with Producer("groups-drain", groups.namesrv_addr, security=security) as p:
        sent = [p.send(Message(TOPIC, b"unread-%d" % i), _OnGroup("broker-b")) for i in range(3)]
    with PullConsumer("drainers", groups.namesrv_addr, security=security) as consumer:
        mq = next(q for q in consumer.fetch_queues(TOPIC) if q.broker_name == "broker-b")
        consumer.update_offset(mq, 0)
        with pytest.raises(ClusterError, match=r"drainers on Spread: 3"):
            groups.remove_group("broker-b", drain_timeout_s=1.0)
        assert [g.group for g in groups.all()] == ["broker-a", "broker-b"]
        wait_for(
            lambda: (
                {g.broker_name: g.perm for g in admin.topic_route_info(TOPIC).groups}
                == {"broker-a": PERM_READ_WRITE, "broker-b": PERM_READ}
            ),
            DEADLINE_S,
            "broker-b's topic routed read-only",
        )
        b = groups.group("broker-b")
        assert all(b.pid(n) is not None for n in b.nodes)
        got = consumer.pull(mq, 0, max_nums=16)
        assert sorted(m.msg_id for m in got.messages) == sorted(r.msg_id for r in sent)
        consumer.update_offset(mq, got.next_begin_offset)
