"""Derived state on a real 3-node group (docs/BROKER.md, "Derived state"): a ConsumeQueue
record changed on one node's disk is rebuilt from the commitlog, and pulls from that node,
leading, answer the right messages (issue 31, "Derived state goes bad silently")."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from integration.test_broker_group import (
    QUEUES,
    TOPIC,
    Broker,
    assert_same_consumequeues,
    make_messages,
    setup_group,
)
from raftmq.broker.v1 import broker_pb2 as pb
from support import pulled, wait_for

from broker.cluster import ClusterError, LocalCluster
from broker.message import UniqIdGenerator
from dledger.server.client import ClientError
from jepsen_like.disk import CQ_RECORD, shorten_cq_record

pytestmark = pytest.mark.integration

QUEUE = 3
OFFSET = 100  # of 250 records in the queue: behind the snapshot's dispatch position


def _cq_file(cluster: LocalCluster, node_id: str) -> Path:
    return Path(cluster.base) / node_id / "consumequeue" / TOPIC / str(QUEUE) / ("0" * 20)


def _pull(client: Broker, addr: str, offset: int, max_msgs: int = 32) -> pb.PullMessageResponse:
    resp: pb.PullMessageResponse = client.stub(addr).PullMessage(
        pb.PullMessageRequest(
            consumer_group="g",
            topic=TOPIC,
            queue_id=QUEUE,
            queue_offset=offset,
            max_msgs=max_msgs,
            no_suspend=True,
        ),
        timeout=10,
    )
    return resp


def _make_lead(cluster: LocalCluster, node_id: str) -> None:
    """Transfer the leadership to ``node_id``, again while it does not lead (a transfer may
    time out while the target catches up, or an election may follow it)."""

    def leads() -> bool:
        try:
            if cluster.wait_leader(5) == node_id:
                return True
            with cluster.client() as log_client:
                log_client.transfer_leadership(node_id)
        except (ClientError, ClusterError):
            return False
        return False

    wait_for(leads, 60, f"{node_id} to lead")


def _sent_to_queue(sent: list[pb.Message]) -> list[str]:
    return [m.msg_id for m in sent if m.queue_id == QUEUE]


def test_a_changed_record_behind_the_snapshot_is_rebuilt_at_restart_and_served_leading(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster, client = setup_group(local_group, scrubRecordsPerSecond=20_000)
    ids = UniqIdGenerator(ip="127.0.0.1")
    sent = make_messages(ids, 0, 250 * QUEUES)
    for i in range(0, len(sent), 500):
        client.send(sent[i : i + 500])
    client.wait_same_offsets()
    first_leader = next(n for n in cluster.nodes if n.client_addr == client.leader)
    victim = next(n for n in cluster.nodes if n is not first_leader)
    cluster.signal(victim.node_id, signal.SIGTERM)  # a clean stop: a snapshot at the end
    wait_for(lambda: cluster.pid(victim) is None, 15, "the node to stop")
    good = shorten_cq_record(_cq_file(cluster, victim.node_id), OFFSET)
    cluster.start(victim.node_id)
    client.wait_same_offsets(timeout_s=30, addrs=cluster.client_addrs)
    _make_lead(cluster, victim.node_id)
    # Every pull whose batch includes the record answers the right messages.
    want = _sent_to_queue(sent)
    for start in (OFFSET - 31, OFFSET - 5, OFFSET):
        resp = _pull(client, victim.client_addr, start)
        assert resp.status == pb.FOUND, resp.status
        assert [m.msg_id for m in pulled(resp)] == want[start : start + 32]
    assert CQ_RECORD.unpack(
        _cq_file(cluster, victim.node_id).read_bytes()[OFFSET * 20 : OFFSET * 20 + 20]
    ) == tuple(good)
    client.send(make_messages(ids, len(sent), 100))  # the group goes on
    client.wait_same_offsets(timeout_s=30, addrs=cluster.client_addrs)
    # A record nobody reads, on the third node: its scrubber finds and rebuilds it (a pass
    # over 2,100 queue records and 4,200 index records takes well under a second at 20,000
    # records a second).
    third = next(n for n in cluster.nodes if n is not victim and n is not first_leader)
    path = _cq_file(cluster, third.node_id)
    other = shorten_cq_record(path, OFFSET + 50)

    def rebuilt() -> bool:
        raw = path.read_bytes()[(OFFSET + 50) * 20 : (OFFSET + 51) * 20]
        return CQ_RECORD.unpack(raw) == tuple(other)

    wait_for(rebuilt, 30, "the scrubber to rebuild the record")
    assert_same_consumequeues(cluster)
    for node, where in ((victim, "open"), (third, "scrub")):
        log = Path(node.log).read_text(errors="replace")
        assert f"consumequeue record wrong where={where}" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    client.close()


def test_a_record_changed_under_a_running_leader_is_rebuilt_by_the_pull(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster, client = setup_group(local_group, scrubRecordsPerSecond=0)  # only the pull
    ids = UniqIdGenerator(ip="127.0.0.1")
    sent = make_messages(ids, 0, 250 * QUEUES)
    for i in range(0, len(sent), 500):
        client.send(sent[i : i + 500])
    client.wait_same_offsets()
    leader = next(n for n in cluster.nodes if n.client_addr == client.leader)
    path = _cq_file(cluster, leader.node_id)
    want = _sent_to_queue(sent)
    # Read on the leader: the pull meets the record, rebuilds it, answers.
    good = shorten_cq_record(path, OFFSET)
    resp = _pull(client, leader.client_addr, OFFSET - 10)
    assert resp.status == pb.FOUND, resp.status
    assert [m.msg_id for m in pulled(resp)] == want[OFFSET - 10 : OFFSET + 22]
    assert CQ_RECORD.unpack(path.read_bytes()[OFFSET * 20 : OFFSET * 20 + 20]) == tuple(good)
    log = Path(leader.log).read_text(errors="replace")
    assert "consumequeue record wrong where=read" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert_same_consumequeues(cluster)
    client.close()
