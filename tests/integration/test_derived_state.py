"""Derived state on a real 3-node group (docs/BROKER.md, "Derived state"): a ConsumeQueue
record changed on one node's disk is rebuilt from the commitlog, and pulls from that node,
leading, answer the right messages (issue 31, "Derived state goes bad silently")."""

from __future__ import annotations

import functools
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
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

from broker.state.message import UniqIdGenerator
from dledger.server.client import ClientError
from jepsen_like.disk import CQ_RECORD, shorten_cq_record
from mqcluster.cluster import ClusterError, LocalCluster

pytestmark = pytest.mark.integration

_T = TypeVar("_T")
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


def _while_leading(cluster: LocalCluster, node_id: str, call: Callable[[], _T]) -> _T:
    """``call()`` on ``node_id`` while it leads: made to lead again when an election moved
    the leadership away first (NOT_LEADER: nothing was done)."""
    out: list[_T] = []

    def attempt() -> bool:
        try:
            out.append(call())
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            _make_lead(cluster, node_id)
            return False
        return True

    wait_for(attempt, 60, f"a call on {node_id} leading")
    return out[0]


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


GROUP = "popg"


def _pop(client: Broker, addr: str, max_msgs: int, invisible_ms: int) -> list[pb.PoppedMessage]:
    resp: pb.PopMessageResponse = client.stub(addr).PopMessage(
        pb.PopMessageRequest(
            group=GROUP, topic=TOPIC, queue_id=QUEUE, max_msgs=max_msgs, invisible_ms=invisible_ms
        ),
        timeout=10,
    )
    return list(resp.messages)


def _point_pop_row_elsewhere(path: Path, offset: int, position: int) -> None:
    """The snapshot's in-flight record of ``offset`` now names another message's position."""
    data = json.loads(path.read_bytes())
    [row] = [r for r in data["pop"] if r[:3] == [GROUP, TOPIC, QUEUE]]
    [record] = [r for r in row[4] if r[0] == offset]
    record[1] = position
    path.write_text(json.dumps(data))


def test_a_changed_pop_row_in_a_followers_snapshot_is_rebuilt_and_served_leading(
    local_group: Callable[..., LocalCluster],
) -> None:
    """The follower's snapshot says the first received message is in flight at the second
    one's position: without the check, that node, leading, would hand out the second message
    under the first one's offset when it becomes visible again."""
    cluster, client = setup_group(local_group, scrubRecordsPerSecond=20_000)
    ids = UniqIdGenerator(ip="127.0.0.1")
    sent = make_messages(ids, 0, 20 * QUEUES)
    client.send(sent)
    client.wait_same_offsets()
    popped = client.write(  # on the leader, following a redirect (an election meanwhile)
        "PopMessage",
        pb.PopMessageRequest(
            group=GROUP, topic=TOPIC, queue_id=QUEUE, max_msgs=4, invisible_ms=600_000
        ),
    )
    assert isinstance(popped, pb.PopMessageResponse)
    first = list(popped.messages)
    assert [p.message.queue_offset for p in first] == [0, 1, 2, 3]
    # A send after the POP record: once every node holds it, every node applied the record.
    client.send(make_messages(ids, len(sent), QUEUES))
    client.wait_same_offsets(addrs=cluster.client_addrs)
    leader = next(n for n in cluster.nodes if n.client_addr == client.leader)
    victim = next(n for n in cluster.nodes if n is not leader)
    cluster.signal(victim.node_id, signal.SIGTERM)  # a clean stop: a snapshot at the end
    wait_for(lambda: cluster.pid(victim) is None, 15, "the node to stop")
    snapshot = Path(cluster.base) / victim.node_id / "config" / "snapshot.json"
    _point_pop_row_elsewhere(snapshot, 0, first[1].message.commitlog_position)
    cluster.start(victim.node_id)
    client.wait_same_offsets(timeout_s=30, addrs=cluster.client_addrs)
    _make_lead(cluster, victim.node_id)
    # Offset 0's message visible again at once: the new leader hands it out again, the
    # right message, second attempt; the other handles are still valid.
    stub = client.stub(victim.client_addr)
    _while_leading(
        cluster,
        victim.node_id,
        lambda: stub.ChangeInvisibleTime(
            pb.ChangeInvisibleTimeRequest(
                group=GROUP, topic=TOPIC, receipt_handle=first[0].receipt_handle, invisible_ms=0
            ),
            timeout=10,
        ),
    )
    again: list[pb.PoppedMessage] = []

    def redelivered() -> bool:
        got = _while_leading(
            cluster, victim.node_id, lambda: _pop(client, victim.client_addr, 32, 600_000)
        )
        again.extend(p for p in got if p.delivery_attempt > 1)
        return bool(again)

    wait_for(redelivered, 30, "offset 0 to be handed out again")
    [back] = again
    assert back.message.queue_offset == 0 and back.delivery_attempt == 2
    assert back.message.msg_id == first[0].message.msg_id
    assert back.message.commitlog_position == first[0].message.commitlog_position
    acked = _while_leading(
        cluster,
        victim.node_id,
        lambda: stub.AckPop(
            pb.AckPopRequest(
                group=GROUP,
                topic=TOPIC,
                receipt_handles=[back.receipt_handle, *(p.receipt_handle for p in first[1:])],
            ),
            timeout=10,
        ),
    )
    assert list(acked.codes) == ["", "", "", ""]
    log = Path(victim.log).read_text(errors="replace")
    assert "derived state: pop record wrong where=open" in log, log[-3000:]
    assert "rebuilding broker state from the commitlog" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    client.close()


def _swap_half_ids(path: Path, first: int, second: int) -> None:
    """The snapshot's pending half at ``first`` now carries the uniq id of the one at
    ``second`` (both are real halves: only the pairing is wrong)."""
    data = json.loads(path.read_bytes())
    rows = {row[0]: row for row in data["txn"]["pending"]}
    rows[first][2] = rows[second][2]
    path.write_text(json.dumps(data))


def test_a_changed_transaction_row_in_a_followers_snapshot_is_rebuilt_and_commits_leading(
    local_group: Callable[..., LocalCluster],
) -> None:
    """Without the check, that node, leading, answers the producer's commit of the first
    half with INVALID_TRANSACTION_ID (its row names the second half's id)."""
    cluster, client = setup_group(local_group, scrubRecordsPerSecond=20_000)
    ids = UniqIdGenerator(ip="127.0.0.1")
    halves = make_messages(ids, 0, 2)
    for m in halves:
        m.queue_id = QUEUE
        m.properties["TRAN_MSG"] = "true"
    positions = [client.send([m]).packed_positions[0] for m in halves]  # one a send
    client.send(make_messages(ids, 2, QUEUES))  # after the prepares: applied once it is
    client.wait_same_offsets(addrs=cluster.client_addrs)
    leader = next(n for n in cluster.nodes if n.client_addr == client.leader)
    victim = next(n for n in cluster.nodes if n is not leader)
    cluster.signal(victim.node_id, signal.SIGTERM)
    wait_for(lambda: cluster.pid(victim) is None, 15, "the node to stop")
    _swap_half_ids(Path(cluster.base) / victim.node_id / "config" / "snapshot.json", *positions)
    cluster.start(victim.node_id)
    client.wait_same_offsets(timeout_s=30, addrs=cluster.client_addrs)
    _make_lead(cluster, victim.node_id)
    stub = client.stub(victim.client_addr)
    for m, position in zip(halves, positions, strict=True):
        request = pb.EndTransactionRequest(
            topic=TOPIC, msg_id=m.msg_id, transaction_id=f"{position:016X}", commit=True
        )
        resp = _while_leading(
            cluster, victim.node_id, functools.partial(stub.EndTransaction, request, timeout=10)
        )
        assert resp.outcome == "COMMITTED"
    # The committed copies follow the queue's one message sent before them.
    copies = pulled(_pull(client, victim.client_addr, 1))
    assert [m.msg_id for m in copies] == [m.msg_id for m in halves]
    log = Path(victim.log).read_text(errors="replace")
    assert "derived state: transaction record wrong where=open" in log, log[-3000:]
    assert "rebuilding broker state from the commitlog" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    client.close()
