"""Retention on a real 3-node group: old commitlog segments are deleted on every node (only
once every member holds them), the ConsumeQueues' min offsets follow, consumers read on from
there, and a node that was down holds deletion back until it caught up."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from support import create_topic, retention_keys, wait_for

from client import Message, Producer, PullConsumer
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 64 * 1024  # the smallest segment: 1 KiB messages fill one in ~60 sends
TWO_HOURS_S = 2 * 3600


def metadata(addr: str) -> dpb.MetadataResponse:
    with grpc.insecure_channel(addr) as ch:
        resp: dpb.MetadataResponse = dpb_grpc.DLedgerClientStub(ch).Metadata(
            dpb.MetadataRequest(), timeout=5
        )
        return resp


def all_metadata_of(
    cluster: LocalCluster, node_ids: list[str]
) -> list[dpb.MetadataResponse] | None:
    """These nodes' metadata; None while one does not answer (starting)."""
    try:
        return [metadata(cluster.node(n).client_addr) for n in node_ids]
    except grpc.RpcError:
        return None


def all_metadata(cluster: LocalCluster) -> list[dpb.MetadataResponse] | None:
    return all_metadata_of(cluster, [n.node_id for n in cluster.nodes])


def age_segments(cluster: LocalCluster, node_id: str) -> int:
    """Pretend every data segment of the node was last written two hours ago."""
    root = Path(metadata(cluster.node(node_id).client_addr).store_path)
    old = time.time() - TWO_HOURS_S
    files = [p for p in root.rglob("*") if p.is_file() and p.name.isdigit()]
    for p in files:
        os.utime(p, (old, old))
    return len(files)


def test_retention_deletes_old_segments_everywhere_but_waits_for_a_lagging_member(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(
        3,
        namesrv=True,
        **retention_keys(SEGMENT_BYTES),
    )
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    create_topic(cluster, "RetT", 2)
    leader = cluster.wait_leader()
    lagging = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    body = b"r" * 1024
    with Producer("ret-pg", addr) as producer:
        for i in range(200):
            producer.send(Message("RetT", body, keys=(f"k{i}",)))
        # One member goes down; the others age their segments and would delete them, but the
        # down member has not got what follows: nothing it needs may go.
        cluster.signal(lagging, signal.SIGKILL)
        for _ in range(200, 400):
            producer.send(Message("RetT", body))
        up = [n.node_id for n in cluster.nodes if n.node_id != lagging]
        for node_id in up:
            assert age_segments(cluster, node_id) > 3

        def up_trimmed() -> bool:
            metas = all_metadata_of(cluster, up)
            return metas is not None and all(m.first_index > 1 for m in metas)

        # Retention runs on the up nodes (it may delete what every member holds) ...
        wait_for(up_trimmed, 30, "retention on the up nodes")
        # ... but nothing the down member lacks.
        for node_id in up:
            meta = metadata(cluster.node(node_id).client_addr)
            lag_match = min(
                p.match_index
                for p in metadata(cluster.node(cluster.wait_leader()).client_addr).peers
            )
            assert meta.first_index <= lag_match + 1, (node_id, meta.first_index, lag_match)
        # It comes back and catches up; then every node deletes its old segments.
        cluster.start(lagging)

        def caught_up() -> bool:
            metas = all_metadata(cluster)
            return metas is not None and len({m.last_index for m in metas}) == 1

        wait_for(caught_up, 30, "the restarted member caught up")
        for _ in range(400, 460):  # a fresh active segment on every node
            producer.send(Message("RetT", body))
    for n in cluster.nodes:
        age_segments(cluster, n.node_id)

    def trimmed() -> bool:
        metas = all_metadata(cluster)
        return metas is not None and all(m.first_index > 100 for m in metas)

    wait_for(trimmed, 30, "old segments deleted on every node")
    firsts = {n.node_id: metadata(n.client_addr).first_index for n in cluster.nodes}
    print(f"\nfirst index after retention: {firsts}")
    # The ConsumeQueues start after the deleted messages; consumers read on from there.
    with PullConsumer("ret-cg", addr) as consumer:
        total = 0
        for mq in consumer.fetch_queues("RetT"):
            res = consumer.pull(mq, 0, 32)
            assert res.status == "OFFSET_ILLEGAL" and res.next_begin_offset > 0, res.status
            offset = res.next_begin_offset
            while True:
                res = consumer.pull(mq, offset, 256)
                total += len(res.messages)
                if res.status != "FOUND":
                    break
                offset = res.next_begin_offset
        assert 0 < total < 460
    # The group still works: a send is acknowledged and a lookup by offset answers.
    with grpc.insecure_channel(cluster.node(cluster.wait_leader()).client_addr) as ch:
        offsets = bpb_grpc.BrokerStub(ch).GetQueueOffsets(
            bpb.GetQueueOffsetsRequest(topic="RetT", queue_id=0), timeout=5
        )
        assert 0 < offsets.min_offset < offsets.max_offset
