"""A full disk on a real 3-node group, each node's store on its own small ext4 file system.

The leader refuses sends with RESOURCE_EXHAUSTED ``DISK_FULL node=... path=... used=...%``
above ``diskSpaceWarningLevelRatio`` while pulls and offset commits go on; one follower's disk is
filled to the last few MiB, so that it really hits ENOSPC on its next segment and must refuse
appends without dying; once the space is freed (filler files deleted: nothing restarted, no
mark changed) sends resume within seconds, the full follower catches up, and every
acknowledged message is read back. The Python producer hears a full disk as ``DISK_FULL``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from loopfs import fill, group_loop_stores, loop_unavailable, used_percent
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from support import create_topic, numbered_messages, pull_queue, wait_for

from broker.state.message import UniqIdGenerator
from client import Message, MQClientError, Producer
from client.message import MessageExt
from dledger.server.errormap import DISK_FULL_RETRY_AFTER_MS
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

NODES = 3
# Each node's file system: the dledger index file (1 MiB in tests/conftest.py's groups), the
# 4 MiB reserve, ext4's own metadata and a few 4 MiB segments.
FS_MIB = 128
TOPIC = "DiskFull"
QUEUES = 4
BODY_BYTES = 16 * 1024  # the 16 KiB sends
BATCH = 16  # messages per send: 256 KiB
MAX_SENDS = 400  # bound of the fill loop: 100 MiB, more than any node's free space
MARK = 80  # diskSpaceWarningLevelRatio of the test (written as RocketMQ 4 does: 0.80)
RESUME = 70
# Leader and the other follower start this many points below the mark: the load then needs
# a few segments to reach it.
START_BELOW_MARK = 14
# The full follower keeps this much space: less than one 4 MiB segment, so its next roll
# fails with ENOSPC; enough for the ConsumeQueue pages of what fits in its active segment.
FULL_FOLLOWER_FREE_BYTES = 2 << 20
RESUME_DEADLINE_S = 10.0
CATCH_UP_DEADLINE_S = 30.0
# How long a started member may take to open its store and serve (a loaded 2-core host).
MEMBER_UP_S = 30.0
_DETAIL = re.compile(r"^DISK_FULL node=(n\d) path=(\S+) used=([\d.]+)% ")


@pytest.fixture
def loop_stores(tmp_path: Path) -> Iterator[list[Path]]:
    """One ext4 file system per node where ``local_group`` puts its store (loopfs)."""
    why = loop_unavailable()
    if why:
        pytest.skip(why)
    with group_loop_stores(tmp_path, NODES, FS_MIB) as mounts:
        yield mounts


def _messages(ids: UniqIdGenerator, n: int, seq: int) -> list[pb.Message]:
    return numbered_messages(ids, n, seq, queues=QUEUES, body_bytes=BODY_BYTES)


def _pull_all(stub: pb_grpc.BrokerStub, queue_id: int) -> list[MessageExt]:
    return pull_queue(stub, TOPIC, queue_id, 10)


def _wait_every_member_serving(cluster: LocalCluster) -> None:
    """Every member has opened its store and serves its client port. A member still starting
    on a busy host (the leader needs only one vote) would otherwise find its disk filled by
    the test and exit with ENOSPC before it opened its store ("a node exited")."""
    for n in cluster.nodes:
        with grpc.insecure_channel(n.client_addr) as channel:
            grpc.channel_ready_future(channel).result(timeout=MEMBER_UP_S)


def _fill_to(mount: Path, percent: float) -> None:
    st = os.statvfs(mount)
    total = st.f_blocks * st.f_frsize
    fill(mount / "filler", int(total * (100 - percent) / 100))


def test_full_disk_refuses_sends_keeps_reads_and_recovers_by_itself(
    loop_stores: list[Path], local_group: Callable[..., LocalCluster]
) -> None:
    cluster = local_group(
        NODES,
        maxHashSlotNum=1000,
        maxIndexNum=4000,
        diskSpaceWarningLevelRatio=f"0.{MARK}",
        diskSpaceResumeRatio=RESUME,
        diskCheckIntervalMs=50,
    )
    assert cluster.base == loop_stores[0].parent
    leader_id = cluster.wait_leader()
    leader = cluster.node(leader_id)
    stub = pb_grpc.BrokerStub(grpc.insecure_channel(leader.client_addr))
    stub.CreateTopic(
        pb.CreateTopicRequest(
            topic=pb.TopicConfig(topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        ),
        timeout=10,
    )
    _wait_every_member_serving(cluster)
    mounts = {n.node_id: loop_stores[int(n.node_id[1:])] for n in cluster.nodes}
    followers = [n.node_id for n in cluster.nodes if n.node_id != leader_id]
    full_follower = followers[1]
    for node_id in (leader_id, followers[0]):
        _fill_to(mounts[node_id], MARK - START_BELOW_MARK)
    fill(mounts[full_follower] / "filler", FULL_FOLLOWER_FREE_BYTES)

    ids = UniqIdGenerator(ip="127.0.0.1")
    acked: set[str] = set()
    refusal = ""
    seq = 0
    for _ in range(MAX_SENDS):
        batch = _messages(ids, BATCH, seq)
        try:
            resp = stub.SendMessage(pb.SendMessageRequest(topic=TOPIC, messages=batch), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, (exc.code(), exc.details())
            refusal = exc.details() or ""
            break
        acked.update(resp.packed_msg_ids)
        seq += BATCH
    assert refusal, (
        f"no DISK_FULL after {MAX_SENDS} sends (leader used {used_percent(mounts[leader_id]):.1f}%)"
    )
    m = _DETAIL.match(refusal)
    assert m, refusal
    assert m.group(1) == leader_id and m.group(2) == str(mounts[leader_id])
    assert float(m.group(3)) >= MARK and len(refusal.encode()) < 1024
    assert acked, "the load stored nothing before the mark"
    # The full follower really ran out: its log went no further than its active segment.
    assert used_percent(mounts[full_follower]) > 97

    # Still refused, still the leader; consumption and offset commits go on meanwhile.
    with pytest.raises(grpc.RpcError) as again:
        stub.SendMessage(
            pb.SendMessageRequest(topic=TOPIC, messages=_messages(ids, 1, seq)), timeout=10
        )
    assert again.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (again.value.details() or "").startswith("DISK_FULL ")
    read = {q: _pull_all(stub, q) for q in range(QUEUES)}
    assert acked <= {msg.msg_id for msgs in read.values() for msg in msgs}
    for q in range(QUEUES):
        stub.UpdateConsumerOffset(
            pb.UpdateConsumerOffsetRequest(
                consumer_group="cg", topic=TOPIC, queue_id=q, queue_offset=len(read[q]), sync=True
            ),
            timeout=10,
        )
        got = stub.QueryConsumerOffset(
            pb.QueryConsumerOffsetRequest(consumer_group="cg", topic=TOPIC, queue_id=q), timeout=5
        )
        assert got.queue_offset == len(read[q])
    assert cluster.wait_leader() == leader_id
    assert all(cluster.pid(n) is not None for n in cluster.nodes), "a node exited"

    # Free the space for real; sends resume by themselves within seconds.
    for mount in mounts.values():
        (mount / "filler").unlink()
    t0 = time.monotonic()
    resumed: list[pb.SendMessageResponse] = []

    def send_ok() -> bool:
        try:
            resumed.append(
                stub.SendMessage(
                    pb.SendMessageRequest(topic=TOPIC, messages=_messages(ids, BATCH, seq)),
                    timeout=10,
                )
            )
            return True
        except grpc.RpcError as exc:
            assert (exc.details() or "").startswith(("DISK_FULL", "NO_QUORUM")), exc.details()
            return False

    wait_for(send_ok, RESUME_DEADLINE_S, "sends to resume after space was freed")
    resume_s = time.monotonic() - t0
    acked.update(resumed[0].packed_msg_ids)
    for k in range(4):  # a few more, crossing segments on the follower that was full
        batch = _messages(ids, BATCH, seq + (k + 1) * BATCH)
        resp = stub.SendMessage(pb.SendMessageRequest(topic=TOPIC, messages=batch), timeout=10)
        acked.update(resp.packed_msg_ids)

    # Nothing acknowledged lost, on any node: the full follower caught up without a restart.
    for n in cluster.nodes:
        node_stub = pb_grpc.BrokerStub(grpc.insecure_channel(n.client_addr))

        def holds_all(s: pb_grpc.BrokerStub = node_stub) -> bool:
            ids_held = [msg.msg_id for q in range(QUEUES) for msg in _pull_all(s, q)]
            return acked <= set(ids_held) and len(ids_held) == len(set(ids_held))

        wait_for(holds_all, CATCH_UP_DEADLINE_S, f"{n.node_id} to hold every acknowledged message")
    assert all(cluster.pid(n) is not None for n in cluster.nodes), "a node exited"
    full_log = Path(cluster.node(full_follower).log).read_text(errors="replace")
    assert "drop reason=disk_full" in full_log, "the full follower never refused an append"
    for n in cluster.nodes:
        text = Path(n.log).read_text(errors="replace")
        assert "FATAL" not in text and "Traceback" not in text, f"{n.node_id}: {text[-2000:]}"
    print(f"acked={len(acked)} resume_s={resume_s:.2f}")


def test_the_producer_hears_a_full_disk_as_disk_full(
    loop_stores: list[Path], local_group: Callable[..., LocalCluster]
) -> None:
    """Every node's disk above the mark (whichever node leads refuses): the producer's send
    fails with DISK_FULL, the leader's own detail, and not as NOT_LEADER from a follower it
    was sent to."""
    cluster = local_group(
        NODES,
        namesrv=True,
        diskSpaceWarningLevelRatio=f"0.{MARK}",
        diskSpaceResumeRatio=RESUME,
        diskCheckIntervalMs=50,
    )
    assert cluster.base == loop_stores[0].parent and cluster.namesrv is not None
    create_topic(cluster, TOPIC, QUEUES)
    _wait_every_member_serving(cluster)
    for mount in loop_stores:
        _fill_to(mount, MARK + 5)
    with Producer("pg", cluster.namesrv.addr) as producer, pytest.raises(MQClientError) as info:
        producer.send(Message(TOPIC, b"x" * BODY_BYTES))
    err = info.value
    assert (err.code, err.status, err.structured) == ("DISK_FULL", "RESOURCE_EXHAUSTED", True)
    assert err.retryable and err.retry_after_ms == DISK_FULL_RETRY_AFTER_MS
    m = _DETAIL.match(err.message)
    assert m, err.message
    assert m.group(2) == str(loop_stores[int(m.group(1)[1:])]) and float(m.group(3)) >= MARK
