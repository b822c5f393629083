"""RocketMQ 4.x clients, unmodified, on a real 3-node group with a NameServer (docs/REMOTING.md):
the npm package ali-ons (build/ons, pinned by protos/ons) speaks RocketMQ's remoting protocol to
the NameServer's and the brokers' remoting ports.

- an ali-ons producer and two clustering push consumers of one group across a SIGKILL of the
  leader: every acknowledged send consumed, each queue in its stored order;
- two broadcasting push consumers each see every message;
- a delay level holds a message for its delay; a failed message comes back (retries, through
  CONSUMER_SEND_MSG_BACK) until the consumer takes it;
- mixed clients on one topic: an ali-ons producer read by the official RocketMQ 5 Node.js
  consumer, and the RocketMQ 5 producer read by an ali-ons consumer.

ali-ons has no orderly consumer: LOCK_BATCH_MQ/UNLOCK_BATCH_MQ are tested with the remoting
package's client (tests/unit/test_remoting_broker.py).
"""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rmq5_support import GROUP_CONF, SCRIPTS, ClientProcess, client_env
from rmq5_support import NODE_MODULES as RMQ5_MODULES
from support import create_topic_on, wait_for

from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
ONS_MODULES = ROOT / "build" / "ons" / "node" / "node_modules"
ONS_SCRIPTS = ROOT / "tests" / "remoting"
QUEUES = 4
# Sends of the failover test; the leader is SIGKILLed once KILL_AFTER are acknowledged.
FAILOVER_SENDS = 120
KILL_AFTER = 40
# Short delay levels, so that a retry (level 3 + reconsume times) and a delayed message come
# back within seconds: level 2 is 2 s.
DELAY_LEVELS = "1s 2s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s"
DELAY_LEVEL = 2
DELAY_MS = 2000
# A consumer's first rebalance and pulls; a failover (election, re-registration with the
# NameServer, the clients' route refresh every 30 s at the latest).
WAIT_S = 90
FAIL_TIMES = 2

pytestmark.append(
    pytest.mark.skipif(
        not (ONS_MODULES / "ali-ons").is_dir(), reason="build/ons is missing: run make venv"
    )
)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("ons"))
    extra = {**GROUP_CONF, "messageDelayLevel": DELAY_LEVELS}
    cluster.configure(3, auto_ports=True, namesrv=True, extra=extra)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def _namesrv(cluster: LocalCluster) -> str:
    assert cluster.namesrv is not None and cluster.namesrv.remoting_addr
    return cluster.namesrv.remoting_addr


def _topic(cluster: LocalCluster, name: str) -> str:
    assert cluster.namesrv is not None
    create_topic_on([cluster], [cluster.namesrv.addr], name, QUEUES)
    return name


def _ons(script: str, args: list[str], home: Path, stdin: bool = False) -> ClientProcess:
    env = {**client_env(home), "NODE_PATH": str(ONS_MODULES)}
    return ClientProcess(["node", str(ONS_SCRIPTS / script), *args], home, env, stdin=stdin)


def _consumer(
    cluster: LocalCluster,
    topic: str,
    grp: str,
    home: Path,
    model: str = "clustering",
    fail: str = "",
) -> ClientProcess:
    args = [_namesrv(cluster), topic, grp, model, str(FAIL_TIMES if fail else 0), fail]
    proc = _ons("ons_push_consumer.js", args, home, stdin=True)
    proc.wait_lines(lambda ls: any(e.get("event") == "ready" for e in ls), WAIT_S)
    return proc


def _consumed(*procs: ClientProcess) -> list[dict[str, Any]]:
    return [e for p in procs for e in p.lines() if e.get("event") == "consumed"]


def _bodies(events: list[dict[str, Any]]) -> set[str]:
    return {e["body"] for e in events}


def test_clustering_consumers_get_every_acknowledged_send_across_a_leader_kill(
    group: LocalCluster, tmp_path: Path
) -> None:
    topic = _topic(group, "OnsFailover")
    consumers = [_consumer(group, topic, "GFailover", tmp_path) for _ in range(2)]
    producer = _ons("ons_producer.js", [_namesrv(group), topic, str(FAILOVER_SENDS), "f"], tmp_path)
    try:
        producer.wait_lines(
            lambda ls: sum(e.get("event") == "sent" for e in ls) >= KILL_AFTER, WAIT_S
        )
        killed = group.wait_leader()
        group.signal(killed, signal.SIGKILL)
        sent = [e for e in producer.finish(WAIT_S * 2) if e.get("event") == "sent"]
        assert len(sent) == FAILOVER_SENDS
        acked = {f"f-body-{e['i']}" for e in sent}
        wait_for(
            lambda: acked <= _bodies(_consumed(*consumers)), WAIT_S, "every acked send consumed"
        )
        events = _consumed(*consumers)
        # Each queue in its stored order: by queue offset, the first delivery of each message
        # has increasing send numbers (the producer sends one after the other).
        first: dict[tuple[int, int], int] = {}
        for e in events:
            first.setdefault((e["queue"], e["offset"]), int(e["seq"]))
        by_queue: dict[int, list[int]] = defaultdict(list)
        for (queue, _offset), seq in sorted(first.items()):
            by_queue[queue].append(seq)
        for queue, seqs in by_queue.items():
            kept = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
            assert kept == sorted(kept), f"queue {queue} out of order: {kept}"
        errors = [e for e in producer.lines() if e.get("event") == "error"]
        print(
            f"failover: {killed} killed after {KILL_AFTER} acks; {len(errors)} send errors;"
            f" {len(events)} deliveries of {len(acked)} acked"
        )
    finally:
        for c in consumers:
            c.close()
            c.wait(30)
        group.start(killed) if "killed" in locals() else None


def test_broadcasting_consumers_each_get_every_message(group: LocalCluster, tmp_path: Path) -> None:
    group.wait_serving(WAIT_S)
    topic = _topic(group, "OnsBroadcast")
    consumers = [
        _consumer(group, topic, "GBroadcast", tmp_path, model="broadcasting") for _ in range(2)
    ]
    try:
        producer = _ons("ons_producer.js", [_namesrv(group), topic, "30", "b"], tmp_path)
        producer.finish(WAIT_S)
        want = {f"b-body-{i}" for i in range(30)}
        for c in consumers:
            wait_for(lambda c=c: want <= _bodies(_consumed(c)), WAIT_S, "every message, each")
    finally:
        for c in consumers:
            c.close()
            c.wait(30)


def test_delay_levels_and_retries(group: LocalCluster, tmp_path: Path) -> None:
    group.wait_serving(WAIT_S)
    topic = _topic(group, "OnsRetry")
    consumer = _consumer(group, topic, "GRetry", tmp_path, fail="r-body-1")
    try:
        args = [_namesrv(group), topic, "3", "r", str(DELAY_LEVEL)]
        sent = [e for e in _ons("ons_producer.js", args, tmp_path).finish(WAIT_S) if "i" in e]
        assert len(sent) == 3
        want = {f"r-body-{i}" for i in range(3)}
        wait_for(lambda: want <= _bodies(_consumed(consumer)), WAIT_S, "the delayed messages")
        for e in _consumed(consumer):
            if e["reconsume"] == 0:
                assert e["at_ms"] - e["born_ms"] >= DELAY_MS - 200, e  # held for its level
        fails = lambda: [e for e in _consumed(consumer) if e["body"] == "r-body-1"]  # noqa: E731
        wait_for(lambda: len(fails()) >= FAIL_TIMES + 1, WAIT_S, "the failed message's retries")
        assert [e["reconsume"] for e in fails()][: FAIL_TIMES + 1] == list(range(FAIL_TIMES + 1))
        assert all(e["topic"] == topic for e in fails())  # a retry shows its original topic
    finally:
        consumer.close()
        consumer.wait(30)


def test_mixed_clients_on_one_topic(group: LocalCluster, tmp_path: Path) -> None:
    group.wait_serving(WAIT_S)
    topic = _topic(group, "OnsMixed")
    leader = group.node(group.wait_leader())
    # An ali-ons producer, read by the official RocketMQ 5 Node.js consumer.
    _ons("ons_producer.js", [_namesrv(group), topic, "20", "m4"], tmp_path).finish(WAIT_S)
    env5 = client_env(tmp_path, node=True)
    v5 = ClientProcess(
        [
            "node",
            str(SCRIPTS / "node_consumer.js"),
            leader.grpc_addr,
            topic,
            "G5",
            "all",
            "30",
            "20",
        ],
        tmp_path,
        env5,
    )
    got5 = [e for e in v5.finish(WAIT_S) if e.get("event") == "acked"]
    assert {e["body"] for e in got5} >= {f"m4-body-{i}" for i in range(20)}
    # The RocketMQ 5 producer, read by an ali-ons consumer.
    consumer = _consumer(group, topic, "GMixed4", tmp_path)
    try:
        argv = ["node", str(SCRIPTS / "node_producer.js"), leader.grpc_addr, topic, "20", "m5"]
        ClientProcess(argv, tmp_path, env5).finish(WAIT_S)
        want = {f"m5-body-{i}" for i in range(20)}
        wait_for(lambda: want <= _bodies(_consumed(consumer)), WAIT_S, "the v5 messages")
        mine = [e for e in _consumed(consumer) if e["body"].startswith("m5-")]
        assert all(e["tags"] and e["keys"] for e in mine)  # tags and keys as 4.x reads them
    finally:
        consumer.close()
        consumer.wait(30)
    assert RMQ5_MODULES.is_dir()
