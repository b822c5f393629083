"""Push consumers against a real 3-node group and NameServer: clustering (2 then 3 consumers
split the queues; every message exactly once), broadcasting (each consumer gets all, tag
filter, RECONSUME_LATER redelivery, local offsets), ordered messages per order id."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from support import create_topic, wait_for

from client import (
    ConsumeStatus,
    Message,
    MessageExt,
    MessageModel,
    Producer,
    PullConsumer,
    PushConsumer,
    SelectMessageQueueByHash,
)
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

# Heartbeats every second; a rebalance follows a consumer-list change at once.
REBALANCE_DEADLINE_S = 10.0
CONSUME_DEADLINE_S = 20.0


class Recorder:
    """A listener that records what it got, thread-safely."""

    def __init__(self, fail_once: set[str] | None = None) -> None:
        self.lock = threading.Lock()
        self.bodies: list[str] = []
        self.ids: Counter[str] = Counter()
        self.queues: dict[str, set[int]] = defaultdict(set)
        self.fail_once = set(fail_once or ())
        self.failed: list[str] = []

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            for m in msgs:
                if m.body.decode() in self.fail_once:
                    self.fail_once.discard(m.body.decode())
                    self.failed.append(m.body.decode())
                    return ConsumeStatus.RECONSUME_LATER
            for m in msgs:
                self.bodies.append(m.body.decode())
                self.ids[m.msg_id] += 1
                self.queues[m.properties.get("order", "")].add(m.queue_id)
        return ConsumeStatus.CONSUME_SUCCESS

    def count(self) -> int:
        with self.lock:
            return sum(self.ids.values())


def partitioned(cs: list[PushConsumer], n_queues: int) -> bool:
    shares = [set(c.assigned_queues()) for c in cs]
    union = set().union(*shares)
    return (
        all(shares)
        and len(union) == n_queues
        and sum(len(s) for s in shares) == n_queues
        and max(map(len, shares)) - min(map(len, shares)) <= 1
    )


def test_clustering_two_then_three_consumers(
    local_group: Callable[..., LocalCluster], consumers: list[PushConsumer]
) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    create_topic(cluster, "ClusT", 8)
    rec = Recorder()

    def start_one() -> PushConsumer:
        c = PushConsumer("cgroup", addr)
        c.subscribe("ClusT", "*")
        c.register_listener(rec)
        consumers.append(c)
        c.start()
        return c

    def all_committed(reader: PullConsumer) -> bool:
        return all(
            reader.fetch_offset(mq) == reader.max_offset(mq) for mq in reader.fetch_queues("ClusT")
        )

    with Producer("pg", addr) as producer, PullConsumer("cgroup", addr) as reader:
        start_one(), start_one()
        wait_for(lambda: partitioned(consumers, 8), REBALANCE_DEADLINE_S, "2 consumers split 8")
        sent = [producer.send(Message("ClusT", f"x{i}".encode())).msg_id for i in range(80)]
        wait_for(lambda: rec.count() >= 80, CONSUME_DEADLINE_S, "80 consumed by 2")
        wait_for(lambda: all_committed(reader), CONSUME_DEADLINE_S, "offsets committed")

        start_one()
        wait_for(lambda: partitioned(consumers, 8), REBALANCE_DEADLINE_S, "3 consumers split 8")
        sent += [producer.send(Message("ClusT", f"y{i}".encode())).msg_id for i in range(80)]
        wait_for(lambda: rec.count() >= 160, CONSUME_DEADLINE_S, "160 consumed by 3")
        wait_for(lambda: all_committed(reader), CONSUME_DEADLINE_S, "offsets committed")

        # Two leave (shutdown commits their offsets and unregisters them): the one left takes
        # every queue within 10 s, not after the broker's 120 s heartbeat expiry.
        for _ in range(2):
            consumers.pop(0).shutdown()
        left_at = time.monotonic()
        wait_for(lambda: partitioned(consumers, 8), 10.0, "the last consumer takes all 8")
        print(f"\nqueues reassigned {time.monotonic() - left_at:.2f} s after 2 consumers left")
        sent += [producer.send(Message("ClusT", f"z{i}".encode())).msg_id for i in range(80)]
        wait_for(lambda: rec.count() >= 240, CONSUME_DEADLINE_S, "240 consumed by 1")
        wait_for(lambda: all_committed(reader), CONSUME_DEADLINE_S, "offsets committed")
    # No failure happened: every message exactly once.
    assert rec.ids == Counter(sent)


def test_broadcasting_tags_and_reconsume_later(
    local_group: Callable[..., LocalCluster], consumers: list[PushConsumer], tmp_path: Path
) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    create_topic(cluster, "BcastT", 4)
    recs = [Recorder(fail_once={"m3"}), Recorder(), Recorder()]
    for rec in recs:
        c = PushConsumer(
            "bgroup", addr, MessageModel.BROADCASTING, offset_store_dir=tmp_path / "offsets"
        )
        c.subscribe("BcastT", "TagA || TagB")
        c.register_listener(rec)
        consumers.append(c)
        c.start()
    tags = ["TagA", "TagB", "TagC"]
    with Producer("pg", addr) as producer:
        sent = [
            (producer.send(Message("BcastT", f"m{i}".encode(), tags=tags[i % 3])).msg_id, i % 3)
            for i in range(60)
        ]
    wanted = Counter(msg_id for msg_id, t in sent if t != 2)
    for rec in recs:
        wait_for(lambda r=rec: r.count() >= 40, CONSUME_DEADLINE_S, "40 matching messages each")
    for rec in recs:
        assert rec.ids == wanted
    assert recs[0].failed == ["m3"] and "m3" in recs[0].bodies
    for c in consumers:
        c.shutdown()
    files = list((tmp_path / "offsets").rglob("offsets.json"))
    assert len(files) == 3


def test_ordered_messages_consumed_in_send_order_across_a_leader_kill(
    local_group: Callable[..., LocalCluster], consumers: list[PushConsumer]
) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    create_topic(cluster, "OrderT", 4)
    leader = cluster.wait_leader()
    rec = Recorder()
    for _ in range(2):
        c = PushConsumer("ogroup", addr)
        c.subscribe("OrderT", "*")
        c.register_listener(rec)
        consumers.append(c)
        c.start()
    wait_for(lambda: partitioned(consumers, 4), REBALANCE_DEADLINE_S, "2 consumers split 4")
    orders = [f"order-{k}" for k in range(6)]
    selector = SelectMessageQueueByHash()
    queue_of: dict[str, set[int]] = defaultdict(set)
    steps_total = 20
    with Producer("pg", addr) as producer:
        for step in range(steps_total):
            if step == steps_total // 2:
                wait_for(lambda: rec.count() >= 60, CONSUME_DEADLINE_S, "first half consumed")
                cluster.signal(leader, signal.SIGKILL)
            for order in orders:
                m = Message("OrderT", f"{order}:{step}".encode(), properties={"order": order})
                r = producer.send(m, selector, order)
                queue_of[order].add(r.message_queue.queue_id)
    assert all(len(q) == 1 for q in queue_of.values())
    total = steps_total * len(orders)
    wait_for(lambda: rec.count() >= total, CONSUME_DEADLINE_S, f"{total} ordered messages")
    with rec.lock:
        bodies = list(rec.bodies)
        assert dict(rec.queues) == dict(queue_of)
    assert cluster.wait_leader(exclude=leader) != leader
    for order in orders:
        steps = [int(b.split(":")[1]) for b in bodies if b.split(":")[0] == order]
        assert steps == list(range(steps_total)), order
