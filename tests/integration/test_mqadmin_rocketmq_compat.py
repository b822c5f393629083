"""Every command raftmq's mqadmin shares with RocketMQ's, typed with RocketMQ's letters, against a
real secure 3-node group with its NameServer: the command lines come from the table
"RocketMQ's letters, command by command" in docs/CLIENT.md (read by ``mqadmin_table``), run as
subprocesses in the table's order; an honoured run must exit 0 and have its effect (checked
here, command by command), a refused one must exit 2 saying why. ``consumeMessage -s`` is read
as RocketMQ's begin time: only the messages stored after it come back."""

from __future__ import annotations

import datetime
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mqadmin_table import Run, compat_rows
from raftmq.broker.v1 import broker_pb2 as pb
from support import wait_for

from client import MQAdmin, Producer, PullConsumer, PushConsumer
from client.consumer import ConsumeStatus
from client.message import Message, MessageQueue
from client.mqadmin import CLUSTER_RT_TOPIC
from client.mqadmin import main as mqadmin
from mqcluster.cluster import LocalCluster
from mqrelease import RELEASE

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 60.0
# A route or table change seen through the NameServer or every node (registrations, applies):
# seconds on a quiet machine; this bound is for a loaded 2-core one (CI runs two sessions).
ROUTE_WAIT_S = 30.0
EARLY = ("early-0", "early-1", "early-2")
LATE = ("late-0", "late-1", "late-2")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass
class Ctx:
    """The group and what the runs' placeholders stand for."""

    cluster: LocalCluster
    admin: MQAdmin
    values: dict[str, str]
    live: PushConsumer | None = None
    producer: Producer | None = None
    found: dict[str, Any] = field(default_factory=dict)

    def fill(self, line: str) -> list[str]:
        values = {**self.values, "now_ms": str(int(time.time() * 1000))}
        return shlex.split(_PLACEHOLDER.sub(lambda m: values[m.group(1)], line))

    def route(self, topic: str) -> Any:
        return self.admin.topic_route_info(topic).groups


def run(ctx: Ctx, r: Run) -> subprocess.CompletedProcess[str]:
    assert ctx.cluster.namesrv is not None
    argv = [sys.executable, "-m", "client.mqadmin", "-n", ctx.cluster.namesrv.addr, "--json"]
    return subprocess.run(
        [*argv, *ctx.cluster.tool_argv(), *ctx.fill(r.line)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT_S,
        check=False,
    )


def local_date(ms: int) -> str:
    """RocketMQ's yyyy-MM-dd#HH:mm:ss:SSS, local time."""
    t = datetime.datetime.fromtimestamp(ms / 1000)
    return t.strftime("%Y-%m-%d#%H:%M:%S:") + f"{ms % 1000:03d}"


def setup(cluster: LocalCluster) -> Ctx:
    """Names, a one-queue topic with three messages stored before a time ``mid`` and three
    after it, a consumer group that committed the first three, a live push consumer."""
    assert cluster.namesrv is not None
    ns = cluster.namesrv.addr
    security = cluster.client_security()
    admin = MQAdmin(ns, security)
    leader = cluster.node(cluster.wait_leader()).client_addr
    info = admin.cluster_info().clusters[0]
    values = {
        "cluster": info.name,
        "broker": info.groups[0].broker_name,
        "leader": leader,
        "follower": next(a for a in cluster.client_addrs if a != leader),
        "topic": "CompatTopic",
        "topic2": "CompatTopic2",
        "wtopic": "CompatWindow",
        "key": "compat-key",
        "group": "compat-cg",
        "group2": "compat-sub",
        "live_group": "compat-live",
        "producer_group": "compat-producer",
        "ptopic": "CompatProducerTopic",
        "user": "compatuser",
        "password": "compat-pass-1234",
    }
    wtopic = values["wtopic"]
    admin.create_topic(wtopic, queues=1)
    with Producer("compat-producer", ns, security=security) as producer:
        for body in EARLY:
            producer.send(Message(wtopic, body.encode()))
        mid_ms = int(time.time() * 1000) + 1
        wait_for(lambda: time.time() * 1000 > mid_ms + 1, 5.0, "the clock to pass mid")
        for body in LATE:
            producer.send(Message(wtopic, body.encode()))
    values.update(mid_ms=str(mid_ms), mid_date=local_date(mid_ms))
    with PullConsumer(values["group"], ns, security) as consumer:
        consumer.update_offset(MessageQueue(wtopic, values["broker"], 0), len(EARLY))
    ctx = Ctx(cluster, admin, values)
    # updateBrokerConfig's record is proposed from feature level 2 (a new group is at 1); the
    # raise is retried while a member has not reported its support to the leader yet.
    wait_for(
        lambda: mqadmin(["-n", ns, *cluster.tool_argv(), "setFeatureLevel", "-a", leader]) == 0,
        ROUTE_WAIT_S,
        "the group at feature level 2",
    )
    ctx.live = PushConsumer(values["live_group"], ns, security=security)
    ctx.live.subscribe(wtopic)
    ctx.live.register_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    ctx.live.start()
    ctx.values["live_client"] = ctx.live.client_id
    # A producer that stays up (producerConnection lists it; its first send heartbeats).
    ctx.producer = Producer(values["producer_group"], ns, security=security)
    ctx.producer.start()
    admin.create_topic(values["ptopic"], queues=1)
    ctx.producer.send(Message(values["ptopic"], b"from-the-live-producer"))
    return ctx


# -- the effect of each command's honoured runs (their --json output, in order) -----------

Check = Callable[[Ctx, list[Any]], None]


def bodies(rows: list[Any]) -> list[str]:
    return sorted(r["body"] for r in rows)


def check_cluster_list(ctx: Ctx, outs: list[Any]) -> None:
    assert [(r["cluster"], r["nodes"]) for r in outs[0]] == [(ctx.values["cluster"], 3)]


def check_update_topic(ctx: Ctx, outs: list[Any]) -> None:
    assert [g.read_queue_nums for g in ctx.route(ctx.values["topic"])] == [4]
    assert [(g.read_queue_nums, g.write_queue_nums) for g in ctx.route(ctx.values["topic2"])] == [
        (2, 2)
    ]


def check_update_topic_perm(ctx: Ctx, outs: list[Any]) -> None:
    topic = ctx.values["topic2"]
    wait_for(lambda: [g.perm for g in ctx.route(topic)] == [4], ROUTE_WAIT_S, "perm 4 routed")
    have = ctx.admin._on_groups(lambda s, t: s.GetTopic(pb.GetTopicRequest(topic=topic), timeout=t))
    assert [(h.topic.perm, h.topic.message_type) for h in have.values()] == [(4, "FIFO")]


def check_topic_list(ctx: Ctx, outs: list[Any]) -> None:
    pairs = {(r["cluster"], r["topic"], r["consumer_group"]) for r in outs[0]}
    assert (ctx.values["cluster"], ctx.values["topic"], "") in pairs
    assert (ctx.values["cluster"], ctx.values["wtopic"], ctx.values["group"]) in pairs


def check_topic_route(ctx: Ctx, outs: list[Any]) -> None:
    assert [(r["broker"], r["read_queues"]) for r in outs[0]] == [(ctx.values["broker"], 4)]


def check_send_message(ctx: Ctx, outs: list[Any]) -> None:
    assert (outs[0]["broker"], outs[0]["queue"]) == (ctx.values["broker"], 1)
    ctx.values["msg_id"] = outs[0]["msg_id"]


def check_topic_status(ctx: Ctx, outs: list[Any]) -> None:
    assert sum(r["max_offset"] - r["min_offset"] for r in outs[0]) == 1


def check_query_msg_by_key(ctx: Ctx, outs: list[Any]) -> None:
    assert [(m["body"], m["keys"]) for m in outs[0]] == [("hello", [ctx.values["key"]])]
    assert outs[1] == []  # -e before the send


def check_query_msg_by_id(ctx: Ctx, outs: list[Any]) -> None:
    assert (outs[0]["body"], outs[0]["tags"]) == ("hello", "TagA")


def check_query_msg_by_offset(ctx: Ctx, outs: list[Any]) -> None:
    assert (outs[0]["body"], outs[0]["queue"], outs[0]["offset"]) == ("hello", 1, 0)


def check_print_msg(ctx: Ctx, outs: list[Any]) -> None:
    assert bodies(outs[0]) == sorted(LATE)


def check_consume_message(ctx: Ctx, outs: list[Any]) -> None:
    assert bodies(outs[0]) == sorted(LATE), "-s is the begin time"
    assert bodies(outs[1]) == sorted(EARLY), "-e is the end time"


def check_consumer_progress(ctx: Ctx, outs: list[Any]) -> None:
    assert outs[0]["total_lag"] == len(LATE)
    assert {r["topic"] for r in outs[1]["rows"]} == {ctx.values["wtopic"]}
    summary = {r["group"]: r for r in outs[2]}
    assert summary[ctx.values["group"]]["total_lag"] == len(LATE)


def check_reset_offset_by_time(ctx: Ctx, outs: list[Any]) -> None:
    assert [r["offset"] for r in outs[0]["rows"]] == [len(EARLY)]  # the first late message
    assert [(r["queue"], r["offset"]) for r in outs[1]] == [(0, 1)]
    progress = ctx.admin.consumer_progress(ctx.values["group"], ctx.values["wtopic"])
    assert [p.consumer_offset for p in progress] == [1]


def check_consumer_connection(ctx: Ctx, outs: list[Any]) -> None:
    assert ctx.live is not None
    assert [r["client_id"] for r in outs[0]] == [ctx.live.client_id]
    row = outs[0][0]
    assert (row["language"], row["version"], row["protocol"]) == ("PYTHON", RELEASE, "v1")
    assert row["address"].startswith("127.0.0.1:"), row
    assert f"{ctx.values['wtopic']}:*" in row["subscriptions"]


def check_stats_all(ctx: Ctx, outs: list[Any]) -> None:
    rows = {r["consumer_group"]: r for r in outs[0]}
    total = len(EARLY) + len(LATE)
    assert (rows[ctx.values["group"]]["stored"], rows[ctx.values["group"]]["accumulation"]) == (
        total,
        total - 1,
    )


def check_update_sub_group(ctx: Ctx, outs: list[Any]) -> None:
    row = outs[0][0]
    assert (row["consumeMessageOrderly"], row["retryMaxTimes"]) == (True, 3)
    assert row["retryPolicy"] == "CUSTOMIZED 1000ms,2000ms"


def check_get_consumer_config(ctx: Ctx, outs: list[Any]) -> None:
    assert [(r["group"], r["retryMaxTimes"]) for r in outs[0]] == [(ctx.values["group2"], 3)]


def check_delete_sub_group(ctx: Ctx, outs: list[Any]) -> None:
    assert [r["deleted"] for r in outs[0]] == [True]
    left = ctx.admin.sub_groups(ctx.values["cluster"])
    assert all(c.group != ctx.values["group2"] for cs in left.values() for c in cs)


def user_check(status: str) -> Check:
    def check(ctx: Ctx, outs: list[Any]) -> None:
        for out in outs:
            assert [(r["username"], r["status"]) for r in out] == [(ctx.values["user"], status)]

    return check


def acl_check(actions: list[str]) -> Check:
    def check(ctx: Ctx, outs: list[Any]) -> None:
        for out in outs:
            assert [(r["resource"], r["actions"]) for r in out] == [
                (f"Topic:{ctx.values['topic']}", actions)
            ]

    return check


def check_copy_user(ctx: Ctx, outs: list[Any]) -> None:
    assert [(r["username"], r["outcome"]) for r in outs[0]] == [(ctx.values["user"], "unchanged")]


def check_delete_acl(ctx: Ctx, outs: list[Any]) -> None:
    subject = f"User:{ctx.values['user']}"
    assert not ctx.admin.list_acls(subject, ctx.values["topic"]).get(ctx.values["broker"])


def check_delete_user(ctx: Ctx, outs: list[Any]) -> None:
    assert not ctx.admin.list_users(ctx.values["user"]).get(ctx.values["broker"])


def check_delete_topic(ctx: Ctx, outs: list[Any]) -> None:
    gone = {ctx.values["topic"], ctx.values["topic2"]}
    wait_for(lambda: not gone & set(ctx.admin.topic_list()), ROUTE_WAIT_S, "topics unlisted")


def check_broker_status(ctx: Ctx, outs: list[Any]) -> None:
    def by_node(rows: list[Any]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for r in rows:
            out.setdefault(r["node"], {})[r["key"]] = r["value"]
        return out

    leader = by_node(outs[0])
    assert list(leader) == [ctx.values["leader"]]
    assert leader[ctx.values["leader"]]["raftRole"] == "LEADER"
    every = by_node(outs[1])
    assert set(every) == set(ctx.cluster.client_addrs)
    assert sorted(n["raftRole"] for n in every.values()) == ["FOLLOWER", "FOLLOWER", "LEADER"]
    assert all(int(n["commitLogMaxOffset"]) > 0 for n in every.values())


def check_get_broker_config(ctx: Ctx, outs: list[Any]) -> None:
    follower = ctx.values["follower"]
    mine = {r["key"]: r["value"] for r in outs[0]}
    assert {r["node"] for r in outs[0]} == {follower}
    node = next(n for n in ctx.cluster.nodes if n.client_addr == follower)
    assert mine["dLegerSelfId"] == node.node_id
    assert mine["brokerName"] == ctx.values["broker"]
    assert mine["innerClientAuthenticationCredentials"] in ("(set)", "")
    assert {r["node"] for r in outs[1]} == set(ctx.cluster.client_addrs)
    creds = ctx.cluster.client_security().credentials
    assert creds is not None
    assert all(creds.secret_key not in r["value"] for out in outs for r in out)


def check_update_broker_config(ctx: Ctx, outs: list[Any]) -> None:
    """Both live changes reached every member (each node's GetBrokerConfig shows them as
    live overrides); the refused runs changed nothing."""
    assert [r["value"] for out in outs for r in out] == ["777", "6"], outs

    def every_node_has_them() -> bool:
        answers = ctx.admin.broker_configs(ctx.values["cluster"]).values()
        return all(
            a.config["topicsPerUser"] == "777"
            and a.source["topicsPerUser"] == "live"
            and a.config["defaultTopicQueueNums"] == "6"
            and a.config["fileReservedTime"] != "48"
            for a in answers
        )

    wait_for(every_node_has_them, ROUTE_WAIT_S, "every node to apply the live changes")


def check_consumer_status(ctx: Ctx, outs: list[Any]) -> None:
    """Both runs name the live consumer with its release and subscription, and the lag of the
    one queue of the topic it reads, as the brokers' offsets give it."""
    assert ctx.live is not None
    wtopic = ctx.values["wtopic"]
    for out in outs:
        assert [(c["client_id"], c["version"]) for c in out["clients"]] == [
            (ctx.live.client_id, RELEASE)
        ]
        assert f"{wtopic}:*" in out["clients"][0]["subscriptions"]
        rows = [q for q in out["queues"] if q["topic"] == wtopic]
        assert [(q["broker"], q["queue"]) for q in rows] == [(ctx.values["broker"], 0)]
        q = rows[0]
        assert q["lag"] == q["max_offset"] - max(q["committed_offset"], 0), q


def check_producer_connection(ctx: Ctx, outs: list[Any]) -> None:
    assert ctx.producer is not None
    rows = outs[0]
    assert [(r["broker"], r["group"], r["client_id"]) for r in rows] == [
        (ctx.values["broker"], ctx.values["producer_group"], ctx.producer.client_id)
    ]
    assert (rows[0]["language"], rows[0]["version"]) == ("PYTHON", RELEASE)
    assert rows[0]["address"].startswith("127.0.0.1:"), rows


def check_cluster_rt(ctx: Ctx, outs: list[Any]) -> None:
    """Two rounds of five sends to the one group, all answered; the ten messages are in the
    benchmark topic."""
    rows = outs[0]
    assert [(r["round"], r["broker"], r["success"], r["fail"]) for r in rows] == [
        (1, ctx.values["broker"], 5, 0),
        (2, ctx.values["broker"], 5, 0),
    ]
    assert all(r["rt_ms"] > 0 and r["machine_room"] == "room1" for r in rows)
    stored = ctx.admin.consumer_progress("compat-rt-reader", CLUSTER_RT_TOPIC)
    assert sum(p.broker_offset for p in stored) == 10


CHECKS: dict[str, Check] = {
    "clusterList": check_cluster_list,
    "updateTopic": check_update_topic,
    "updateTopicPerm": check_update_topic_perm,
    "topicList": check_topic_list,
    "topicRoute": check_topic_route,
    "sendMessage": check_send_message,
    "topicStatus": check_topic_status,
    "queryMsgByKey": check_query_msg_by_key,
    "queryMsgById": check_query_msg_by_id,
    "queryMsgByOffset": check_query_msg_by_offset,
    "printMsg": check_print_msg,
    "consumeMessage": check_consume_message,
    "consumerProgress": check_consumer_progress,
    "resetOffsetByTime": check_reset_offset_by_time,
    "consumerConnection": check_consumer_connection,
    "statsAll": check_stats_all,
    "updateSubGroup": check_update_sub_group,
    "getConsumerConfig": check_get_consumer_config,
    "deleteSubGroup": check_delete_sub_group,
    "createUser": user_check("enable"),
    "updateUser": user_check("disable"),
    "getUser": user_check("disable"),
    "listUser": user_check("disable"),
    "createAcl": acl_check(["Pub"]),
    "updateAcl": acl_check(["Pub", "Sub"]),
    "getAcl": acl_check(["Pub", "Sub"]),
    "listAcl": acl_check(["Pub", "Sub"]),
    "copyUser": check_copy_user,
    "copyAcl": acl_check(["Pub", "Sub"]),
    "deleteAcl": check_delete_acl,
    "deleteUser": check_delete_user,
    "deleteTopic": check_delete_topic,
    "brokerStatus": check_broker_status,
    "consumerStatus": check_consumer_status,
    "producerConnection": check_producer_connection,
    "clusterRT": check_cluster_rt,
    "getBrokerConfig": check_get_broker_config,
    "updateBrokerConfig": check_update_broker_config,
}


def test_every_shared_command_with_rocketmqs_letters(
    local_group: Callable[..., LocalCluster],
) -> None:
    rows = compat_rows()
    assert [r.command for r in rows] == list(CHECKS), "the doc's table and CHECKS differ"
    ctx = setup(local_group(3, namesrv=True, secure=True))
    try:
        for row in rows:
            outs = []
            for r in row.runs:
                done = run(ctx, r)
                if r.refused:
                    assert done.returncode == 2, (r.line, done.stdout, done.stderr)
                    assert "raftmq" in done.stderr or "refused" in done.stderr, done.stderr
                    assert "unrecognized" not in done.stderr, done.stderr
                else:
                    assert done.returncode == 0, (r.line, done.stdout, done.stderr)
                    outs.append(json.loads(done.stdout))
            CHECKS[row.command](ctx, outs)
    finally:
        assert ctx.live is not None and ctx.producer is not None
        ctx.live.shutdown()
        ctx.producer.shutdown()
