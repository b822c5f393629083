"""Issue 21, "Must show" for snapshots, on a real 3-node group:

1. a member down longer than maxLagRetentionHours no longer stops the others from deleting
   old segments; when it returns it is caught up by a snapshot;
2. a member whose disk is lost after retention deleted the first segments comes back empty
   and is caught up by a snapshot;

then every member holds the same ConsumeQueue and key index files, the same consumer offsets
and topics, serves the same messages, and the Spark audit of the three stores is CLEAN.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from support import (
    age_segments,
    converged,
    create_topic,
    metadata,
    pull_all,
    queue_min_offsets,
    retention_keys,
    wait_for,
    wait_trimmed,
)

from client import Message, Producer
from mqcluster.cluster import LocalCluster
from spark_audit.__main__ import main as audit_main

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 64 * 1024  # 1 KiB messages fill one in ~60 sends
TOPIC = "SnapT"
QUEUES = 2
CATCH_UP_S = 60.0


def store_path(cluster: LocalCluster, node_id: str) -> Path:
    md = metadata(cluster.node(node_id).client_addr)
    assert md is not None
    return Path(md.store_path)


def send(producer: Producer, first: int, count: int) -> None:
    for i in range(first, first + count):
        producer.send(Message(TOPIC, b"s%05d" % i + b"x" * 1000, keys=(f"k{i}",)))


def commit_offsets(cluster: LocalCluster, offset: int) -> None:
    with grpc.insecure_channel(cluster.node(cluster.wait_leader()).client_addr) as ch:
        stub = bpb_grpc.BrokerStub(ch)
        for q in range(QUEUES):
            stub.UpdateConsumerOffset(
                bpb.UpdateConsumerOffsetRequest(
                    consumer_group="snap-cg",
                    topic=TOPIC,
                    queue_id=q,
                    queue_offset=offset,
                    sync=True,
                ),
                timeout=5,
            )


def bodies_from(addr: str) -> list[bytes]:
    """Every message of the topic as this node serves it, from each queue's min offset."""
    out: list[bytes] = []
    for q, start in enumerate(queue_min_offsets(addr, TOPIC, QUEUES)):
        out.extend(m.body for m in pull_all(addr, TOPIC, q, start_offset=start))
    return out


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_members_catch_up_by_snapshot_and_replicas_agree(
    local_group: Callable[..., LocalCluster], spark: SparkSession, tmp_path: Path
) -> None:
    cluster = local_group(
        3,
        namesrv=True,
        **retention_keys(SEGMENT_BYTES),
        maxLagRetentionHours=1,
        slaveReadEnable="true",
    )
    assert cluster.namesrv is not None
    create_topic(cluster, TOPIC, QUEUES)
    leader = cluster.wait_leader()
    a, b = (n.node_id for n in cluster.nodes if n.node_id != leader)
    stores = {n.node_id: store_path(cluster, n.node_id) for n in cluster.nodes}
    with Producer("snap-pg", cluster.namesrv.addr) as producer:
        send(producer, 0, 150)
        commit_offsets(cluster, 20)
        # 1. Member a goes down; the others' segments are older than the lag bound, so they
        # delete them although a lacks them.
        cluster.signal(a, signal.SIGKILL)
        send(producer, 150, 150)
        up = [leader, b]
        for n in up:
            age_segments(stores[n])
        a_last = 150  # a held at most the entries of the first 150 sends and the topic
        wait_trimmed(cluster, up, a_last)
        started = time.monotonic()
        cluster.start(a)
        wait_for(converged(cluster), CATCH_UP_S, f"{a} caught up by a snapshot")
        took = {a: time.monotonic() - started}
        # 2. Member b loses its disk; retention moves on; b comes back empty.
        cluster.signal(b, signal.SIGKILL)
        shutil.rmtree(stores[b].parent)
        send(producer, 300, 150)
        commit_offsets(cluster, 40)
        md = metadata(cluster.node(leader).client_addr)
        assert md is not None
        first_before = md.first_index
        for n in (leader, a):
            age_segments(stores[n])
        wait_trimmed(cluster, [leader, a], first_before)
        started = time.monotonic()
        cluster.start(b)
        wait_for(converged(cluster), CATCH_UP_S, f"{b} caught up by a snapshot")
        took[b] = time.monotonic() - started
        send(producer, 450, 50)  # entries appended after the installs
        wait_for(converged(cluster), CATCH_UP_S, "every member applied the last sends")
    served = {n.node_id: bodies_from(n.client_addr) for n in cluster.nodes}
    assert served[a] == served[leader] == served[b]
    # Retention left the last segments: the newest sends are served by every member (on
    # whichever queue each landed: a producer's round robin starts at a random queue).
    newest = {body[:6] for body in served[leader]}
    assert {f"s{i:05d}".encode() for i in range(450, 500)} <= newest, sorted(newest)[-5:]
    logs = {n.node_id: Path(n.log).read_text() for n in cluster.nodes}
    assert "snapshot installed" in logs[a] and "snapshot installed" in logs[b]
    cluster.down(grace_s=10.0)
    roots = {n: stores[n].parent for n in stores}
    for sub in ("consumequeue", "index"):
        trees = {n: tree(roots[n] / sub) for n in roots}
        assert trees[leader], sub
        assert trees[a] == trees[leader] == trees[b], sub
    docs = {n: json.loads((roots[n] / "config" / "snapshot.json").read_bytes()) for n in roots}
    for key in ("applied_index", "dispatch_position", "queues", "topics", "offsets", "dedup"):
        assert docs[a][key] == docs[leader][key] == docs[b][key], key
    assert docs[leader]["offsets"]["snap-cg"][TOPIC] == {"0": 40, "1": 40}
    report = tmp_path / "audit.json"
    code = audit_main(
        [*(str(p) for p in stores.values()), "--json", str(report), "-q", *cluster.tool_argv()],
        spark=spark,
    )
    assert code == 0, report.read_text()
    print(f"\ncaught up by snapshot (restart to converged): {took}")
