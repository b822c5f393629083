"""``mqadmin`` as subprocesses (``python -m client.mqadmin``) against a real 3-node group with
its NameServer: topic creation and routes, send / status / consume / lookup by key and id,
cluster and node status, a failed operation's exit code, and consumerProgress showing the lag
going to zero while a PullConsumer consumes and commits offsets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from client import PullConsumer
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 30.0
TOPIC = "AdminTopic"
GROUP = "admin-cg"
QUEUES = 4
MESSAGES = 8


def mqadmin(addr: str, *args: str, json_out: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "client.mqadmin", "-n", addr]
    if json_out:
        argv.append("--json")
    return subprocess.run(
        [*argv, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT_S,
        check=False,
    )


def ok_json(addr: str, *args: str) -> Any:
    proc = mqadmin(addr, *args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def test_mqadmin_against_a_group(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr

    # updateTopic: on the cluster's group leaders, returns once the NameServer routes it.
    cluster_name = ok_json(addr, "clusterList")[0]["cluster"]
    unknown = mqadmin(addr, "updateTopic", "-t", TOPIC, "-c", "NoSuchCluster")
    assert unknown.returncode == 1 and "CLUSTER_NOT_FOUND" in unknown.stderr
    rows = ok_json(
        addr, "updateTopic", "-t", TOPIC, "-c", cluster_name, "-r", str(QUEUES), "-w", str(QUEUES)
    )
    assert len(rows) == 1 and rows[0]["read_queues"] == QUEUES
    broker = rows[0]["broker"]

    assert TOPIC in ok_json(addr, "topicList")
    route = ok_json(addr, "topicRoute", "-t", TOPIC)
    assert len(route) == 1
    assert route[0]["read_queues"] == QUEUES and route[0]["write_queues"] == QUEUES
    assert route[0]["leader_addr"] and len(route[0]["followers"]) == 2

    # The human-readable form is an aligned table with a header.
    table = mqadmin(addr, "topicRoute", "-t", TOPIC, json_out=False)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:2] == ["cluster", "broker"]

    # sendMessage x MESSAGES (round robin over the queues).
    sent = [
        ok_json(
            addr,
            "sendMessage",
            "-t",
            TOPIC,
            "-p",
            f"body-{i}",
            "--tags",
            "TagA",
            "--keys",
            f"key-{i}",
        )
        for i in range(MESSAGES)
    ]
    assert all(s["msg_id"] and s["offset_msg_id"] for s in sent)

    status = ok_json(addr, "topicStatus", "-t", TOPIC)
    assert len(status) == QUEUES
    assert sum(s["max_offset"] - s["min_offset"] for s in status) == MESSAGES

    consumed = ok_json(addr, "consumeMessage", "-t", TOPIC, "-c", "100")
    assert sorted(m["body"] for m in consumed) == sorted(f"body-{i}" for i in range(MESSAGES))
    one_queue = ok_json(addr, "consumeMessage", "-t", TOPIC, "-q", "0", "-o", "1", "-c", "5")
    assert all(m["queue"] == 0 and m["offset"] >= 1 for m in one_queue)

    by_key = ok_json(addr, "queryMsgByKey", "-t", TOPIC, "-k", "key-3")
    assert [m["body"] for m in by_key] == ["body-3"]
    # Lookups answer with the message's queue offset too (what the send answered).
    assert (by_key[0]["queue"], by_key[0]["offset"]) == (sent[3]["queue"], sent[3]["queue_offset"])
    by_id = ok_json(addr, "queryMsgById", "-t", TOPIC, "-i", sent[5]["msg_id"])
    assert by_id["body"] == "body-5" and by_id["keys"] == ["key-5"]
    assert by_id["offset"] == sent[5]["queue_offset"]
    by_offset_id = ok_json(addr, "queryMsgById", "-t", TOPIC, "-i", sent[6]["offset_msg_id"])
    assert by_offset_id["body"] == "body-6" and by_offset_id["offset"] == sent[6]["queue_offset"]

    clusters = ok_json(addr, "clusterList")
    assert [(c["broker"], c["nodes"]) for c in clusters] == [(broker, 3)]
    nodes = ok_json(addr, "nodeStatus")
    assert len(nodes) == 3
    assert sorted(n["role"] for n in nodes) == ["FOLLOWER", "FOLLOWER", "LEADER"]
    assert all(n["addr"] and n["term"] >= 1 and n["heartbeat_age_ms"] >= 0 for n in nodes)

    # A failed operation: exit 1, one line on stderr with the stable code.
    missing = mqadmin(addr, "topicStatus", "-t", "NoSuchTopic")
    assert missing.returncode == 1
    assert len(missing.stderr.strip().splitlines()) == 1 and "NOT_FOUND" in missing.stderr

    # consumerProgress: all lag before consuming, zero once every offset is committed.
    progress = ok_json(addr, "consumerProgress", "-g", GROUP, "-t", TOPIC)
    assert progress["total_lag"] == MESSAGES
    lags = [progress["total_lag"]]
    with PullConsumer(GROUP, addr) as consumer:
        for mq in consumer.fetch_queues(TOPIC):
            res = consumer.pull(mq, 0, max_nums=1)
            if res.messages:
                consumer.update_offset(mq, res.next_begin_offset)
        lags.append(ok_json(addr, "consumerProgress", "-g", GROUP, "-t", TOPIC)["total_lag"])
        for mq in consumer.fetch_queues(TOPIC):
            res = consumer.pull(mq, consumer.fetch_offset(mq), max_nums=32)
            consumer.update_offset(mq, res.next_begin_offset)
    final = ok_json(addr, "consumerProgress", "-g", GROUP, "-t", TOPIC)
    lags.append(final["total_lag"])
    assert lags[0] > lags[1] > lags[2] == 0, lags
    assert all(r["lag"] == 0 and r["consumer_offset"] == r["broker_offset"] for r in final["rows"])

    # resetOffsetByTime to 0: everything is to be consumed again.
    reset = ok_json(addr, "resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", "0")
    assert len(reset["rows"]) == QUEUES
    assert ok_json(addr, "consumerProgress", "-g", GROUP, "-t", TOPIC)["total_lag"] == MESSAGES

    # deleteTopic: gone from the group.
    assert ok_json(addr, "deleteTopic", "-t", TOPIC)[0]["deleted"] is True
    wait_for(lambda: TOPIC not in ok_json(addr, "topicList"), 10.0, "the topic to be unlisted")
    gone = mqadmin(addr, "topicRoute", "-t", TOPIC)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1, gone.stderr


def test_rocketmq_flag_letters_against_a_group(local_group: Callable[..., LocalCluster]) -> None:
    """The command lines a RocketMQ user types: ``sendMessage -k -c -b -i`` lands in exactly
    that queue with those keys and tags; consumeMessage and nodeStatus take RocketMQ's
    letters; ``-n`` after the command."""
    cluster = local_group(1, namesrv=True)
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    topic = "LetterTopic"
    name = ok_json(addr, "clusterList")[0]["cluster"]
    rows = ok_json(addr, "updateTopic", "-t", topic, "-c", name, "-r", "4", "-w", "4", "-p", "6")
    broker = rows[0]["broker"]

    sent = ok_json(
        addr, "sendMessage", "-t", topic, "-p", "hello", "-k", "k1", "-c", "TagL", "-b", broker,
        "-i", "2",
    )  # fmt: skip
    assert (sent["broker"], sent["queue"]) == (broker, 2)
    found = ok_json(addr, "queryMsgByKey", "-t", topic, "-k", "k1")
    assert [(m["tags"], m["keys"], m["queue"]) for m in found] == [("TagL", ["k1"], 2)]
    consumed = ok_json(
        addr, "consumeMessage", "-t", topic, "-b", broker, "-i", "2", "-o", "0", "-c", "5",
        "-g", "letters-cg",
    )  # fmt: skip
    assert [(m["body"], m["queue"]) for m in consumed] == [("hello", 2)]
    assert ok_json(addr, "consumeMessage", "-t", topic, "-b", broker, "-i", "1") == []

    missing = mqadmin(addr, "sendMessage", "-t", topic, "-p", "x", "-b", broker, "-i", "9")
    assert missing.returncode == 1 and "QUEUE_NOT_FOUND" in missing.stderr

    node_addr = cluster.nodes[0].client_addr
    nodes = ok_json(addr, "nodeStatus", "-c", name, "-b", node_addr)
    assert [n["addr"] for n in nodes] == [node_addr]
    assert ok_json(addr, "nodeStatus", "-b", "127.0.0.1:1") == []

    after = subprocess.run(
        [sys.executable, "-m", "client.mqadmin", "topicList", "-n", addr, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT_S,
        check=False,
    )
    assert after.returncode == 0, after.stderr
    assert topic in json.loads(after.stdout)
