"""Issue #6's rebalance scenario on real processes: two broker groups of 3 nodes, two
NameServers, a topic over both groups; 4 push consumers split its queues evenly; a 5th starts
and 2 stop while producers keep sending. Within 10 s the queues are reassigned, and every
message is consumed exactly once (no failure happened: graceful hand-overs under queue locks
redeliver nothing)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from support import create_topic_on, wait_for

from client import ConsumeStatus, Message, MessageExt, MQClientError, Producer, PushConsumer
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

TOPIC = "Spread"
QUEUES_PER_GROUP = 8
GROUP = "rebalance-cg"
# The figure: queues reassigned within 10 s of consumers joining or leaving.
REASSIGN_DEADLINE_S = 10.0
CONSUME_DEADLINE_S = 60.0


class Recorder:
    """Counts deliveries per message id and which consumer got each queue's messages."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: Counter[str] = Counter()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            for m in msgs:
                self.ids[m.msg_id] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    def distinct(self) -> int:
        with self.lock:
            return len(self.ids)


def even_split(cs: list[PushConsumer], n_queues: int) -> bool:
    shares = [set(c.assigned_queues()) for c in cs]
    union = set().union(*shares)
    return (
        len(union) == n_queues
        and sum(len(s) for s in shares) == n_queues
        and max(map(len, shares)) - min(map(len, shares)) <= 1
    )


def test_four_consumers_then_a_fifth_joins_and_two_leave(
    name_servers: Callable[..., Any],
    local_group: Callable[..., LocalCluster],
    consumers: list[PushConsumer],
) -> None:
    ns1, ns2 = name_servers(), name_servers()
    both = f"{ns1.addr};{ns2.addr}"
    groups = [
        local_group(3, namesrvAddr=both),
        local_group(3, namesrvAddr=both, brokerName="broker-b"),
    ]
    create_topic_on(groups, [ns1.addr, ns2.addr], TOPIC, QUEUES_PER_GROUP)
    n_queues = 2 * QUEUES_PER_GROUP
    rec = Recorder()

    def start_one() -> PushConsumer:
        c = PushConsumer(GROUP, both)
        c.subscribe(TOPIC, "*")
        c.register_listener(rec)
        consumers.append(c)
        c.start()
        return c

    for _ in range(4):
        start_one()
    wait_for(lambda: even_split(consumers, n_queues), REASSIGN_DEADLINE_S, "4 consumers split")
    assert sorted(len(c.assigned_queues()) for c in consumers) == [4, 4, 4, 4]

    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set() and i < 5000:  # bounded: about 1,000 in the test's window
            try:
                acked.append(producer.send(Message(TOPIC, f"m{i}".encode())).msg_id)
            except MQClientError as exc:
                errors.append(exc)
            i += 1

    with Producer("rebalance-pg", both) as producer:
        thread = threading.Thread(target=produce, name="test-produce")
        thread.start()
        try:
            wait_for(lambda: len(acked) >= 100, 30, "100 sends with 4 consumers")
            start_one()
            changed_at = time.monotonic()
            wait_for(lambda: even_split(consumers, n_queues), REASSIGN_DEADLINE_S, "5 split")
            joined_s = time.monotonic() - changed_at
            wait_for(lambda: len(acked) >= 250, 30, "more sends with 5 consumers")
            for _ in range(2):
                consumers.pop(0).shutdown()
            changed_at = time.monotonic()
            wait_for(lambda: even_split(consumers, n_queues), REASSIGN_DEADLINE_S, "3 split")
            left_s = time.monotonic() - changed_at
            assert sorted(len(c.assigned_queues()) for c in consumers) == [5, 5, 6]
            at_split = len(acked)
            wait_for(lambda: len(acked) >= at_split + 150, 30, "more sends with 3 consumers")
        finally:
            stop.set()
            thread.join(30)
    assert not errors, errors
    print(f"\nreassigned {joined_s:.2f} s after a join, {left_s:.2f} s after 2 left")
    wait_for(lambda: rec.distinct() >= len(set(acked)), CONSUME_DEADLINE_S, "every message")
    with rec.lock:
        got = Counter(rec.ids)
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged messages never consumed"
    assert not set(got) - set(acked), "consumed a message that was never acknowledged"
    duplicated = {k: v for k, v in got.items() if v > 1}
    assert not duplicated, f"{len(duplicated)} messages consumed twice without any failure"
