"""The client producer against a real 3-node group and NameServer: round robin, sync, async,
one-way and batch sends read back; dedup of a resent message; clear errors; a leader SIGKILL
during a produce run loses no acknowledged message."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from support import create_topic, create_topic_on, wait_for

from client import Message, MQClientError, Producer, PullConsumer, SendResult
from client.message import MessageQueue
from mqcluster.cluster import LocalCluster, _free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

READ_DEADLINE_S = 15.0


def namesrv_addr(cluster: LocalCluster) -> str:
    """The real NameServer plus a dead one: the clients must fall over to the live one."""
    assert cluster.namesrv is not None
    return f"127.0.0.1:{_free_port()};{cluster.namesrv.addr}"


def read_all(consumer: PullConsumer, topic: str) -> dict[MessageQueue, list[str]]:
    out: dict[MessageQueue, list[str]] = {}
    for mq in consumer.fetch_queues(topic):
        ids: list[str] = []
        offset = 0
        while True:
            r = consumer.pull(mq, offset, max_nums=256)
            if not r.messages:
                break
            ids.extend(m.msg_id for m in r.messages)
            offset = r.next_begin_offset
        out[mq] = ids
    return out


def test_send_modes_round_robin_and_read_back(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3, namesrv=True)
    create_topic(cluster, "ProdT", 4)
    addr = namesrv_addr(cluster)
    with Producer("pg", addr) as producer, PullConsumer("cg", addr) as reader:
        sync = [producer.send(Message("ProdT", f"s{i}".encode(), tags="TagA")) for i in range(8)]
        assert sorted(r.message_queue.queue_id for r in sync) == [0, 0, 1, 1, 2, 2, 3, 3]
        assert all(len(r.msg_id) == 32 and not r.duplicate for r in sync)

        called: list[SendResult] = []
        done = threading.Event()

        def on_success(r: SendResult) -> None:
            called.append(r)
            if len(called) == 8:
                done.set()

        futures: list[Future[SendResult]] = [
            producer.send_async(Message("ProdT", f"a{i}".encode()), on_success=on_success)
            for i in range(8)
        ]
        async_results = [f.result(timeout=10) for f in futures]
        assert done.wait(10)
        oneway = [Message("ProdT", f"o{i}".encode()) for i in range(4)]
        for m in oneway:
            producer.send_oneway(m)
        batch = [Message("ProdT", f"b{i}".encode(), keys=(f"k{i}",)) for i in range(5)]
        batch_results = producer.send_batch(batch)
        assert len({r.message_queue for r in batch_results}) == 1
        offsets = [r.queue_offset for r in batch_results]
        assert offsets == list(range(offsets[0], offsets[0] + 5))
        assert [r.msg_id for r in batch_results] == [m.msg_id for m in batch]

        # Sending the same message object again resends its msg id: deduplicated.
        again = Message("ProdT", b"twice")
        first = producer.send(again)
        second = producer.send(again)
        assert second.duplicate and second.msg_id == first.msg_id
        assert second.queue_offset == first.queue_offset

        acked = {r.msg_id for r in sync + async_results + batch_results + [first]}
        expected = acked | {m.msg_id for m in oneway}
        wait_for(
            lambda: {i for ids in read_all(reader, "ProdT").values() for i in ids} == expected,
            READ_DEADLINE_S,
            "every sent message readable",
        )
        got = read_all(reader, "ProdT")
        assert sum(len(v) for v in got.values()) == len(expected)  # no duplicate stored
        for r in sync:
            assert r.msg_id in got[r.message_queue]

        # Clear errors carrying the code.
        with pytest.raises(MQClientError) as info:
            producer.send(Message("NoSuchTopic", b"x"))
        assert info.value.code == "TOPIC_NOT_EXIST" and info.value.status == "NOT_FOUND"
        with pytest.raises(MQClientError) as info:
            producer.send(Message("ProdT", b""))
        assert info.value.code == "MESSAGE_BODY_EMPTY"
        assert info.value.status == "INVALID_ARGUMENT"


def test_producer_survives_leader_sigkill(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3, namesrv=True)
    create_topic(cluster, "KillT", 4)
    addr = namesrv_addr(cluster)
    leader = cluster.wait_leader()
    acked: list[SendResult] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    with Producer("pg", addr) as producer, PullConsumer("cg", addr) as reader:

        def run() -> None:
            i = 0
            while not stop.is_set():
                try:
                    acked.append(producer.send(Message("KillT", f"m{i}".encode())))
                except MQClientError as exc:
                    errors.append(exc)
                i += 1

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_for(lambda: len(acked) >= 50, 20, "50 sends before the kill")
            cluster.signal(leader, signal.SIGKILL)
            at_kill = len(acked)
            wait_for(lambda: len(acked) >= at_kill + 50, 30, "50 sends after the kill")
        finally:
            stop.set()
            thread.join(30)
        assert not errors, errors
        new_leader = cluster.wait_leader(exclude=leader)
        assert new_leader != leader
        got = read_all(reader, "KillT")
        for r in acked:
            assert r.msg_id in got[r.message_queue], f"acknowledged {r.msg_id} lost"


def test_two_groups_two_namesrvs_survive_a_namesrv_and_a_leader_kill(
    name_servers: Callable[..., Any],  # first: torn down last, so the nodes can unregister
    local_group: Callable[..., LocalCluster],
) -> None:
    ns1, ns2 = name_servers(), name_servers()
    both = f"{ns1.addr};{ns2.addr}"
    group_a = local_group(3, namesrvAddr=both)
    group_b = local_group(3, namesrvAddr=both, brokerName="broker-b")
    create_topic_on([group_a, group_b], [ns1.addr, ns2.addr], "Both", 4)

    acked: list[SendResult] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    leader_a = group_a.wait_leader()
    with Producer("pg", both) as producer, PullConsumer("cg", both) as reader:
        first = [producer.send(Message("Both", f"rr{i}".encode())) for i in range(16)]
        per_group = Counter(r.message_queue.broker_name for r in first)
        assert per_group == {"broker-a": 8, "broker-b": 8}
        assert len({r.message_queue for r in first}) == 8

        def run() -> None:
            i = 0
            while not stop.is_set():
                try:
                    acked.append(producer.send(Message("Both", f"m{i}".encode())))
                except MQClientError as exc:
                    errors.append(exc)
                i += 1

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_for(lambda: len(acked) >= 50, 20, "50 sends before the kills")
            ns1.stop(signal.SIGKILL)
            group_a.signal(leader_a, signal.SIGKILL)
            at_kill = len(acked)
            wait_for(lambda: len(acked) >= at_kill + 100, 30, "100 sends after the kills")
            group_a.wait_leader(exclude=leader_a)
            at_leader = len(acked)
            wait_for(
                lambda: (
                    Counter(r.message_queue.broker_name for r in acked[at_leader:])["broker-a"]
                    >= 10
                ),
                30,
                "broker-a taking sends again under its new leader",
            )
        finally:
            stop.set()
            thread.join(30)
        assert not errors, errors
        got = read_all(reader, "Both")
        for r in first + acked:
            assert r.msg_id in got[r.message_queue], f"acknowledged {r.msg_id} lost"
