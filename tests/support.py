"""Helpers shared by the test modules (pytest puts `tests/` on sys.path: `pythonpath`)."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as nspb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as nspb_grpc

from client.consumer import pulled_messages
from client.message import MessageExt
from mqcluster.cluster import LocalCluster
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_channel

# How long a topic may take to appear in the NameServer's routes (registration on change).
ROUTE_DEADLINE_S = 10.0
# Names of the threads the client library starts; none may outlive its client.
CLIENT_THREAD_PREFIXES = ("producer", "consume", "rebalance")


def pulled(resp: bpb.PullMessageResponse) -> list[MessageExt]:
    """The messages of a pull answer (stored bytes, decoded as the client does)."""
    return pulled_messages(resp, "test")


def numbered_messages(
    ids: Any, n: int, seq: int, *, queues: int, body_bytes: int
) -> list[bpb.Message]:
    """``n`` messages numbered from ``seq``, spread over ``queues`` queues, each body
    ``body_bytes`` of its number repeated (``ids``: a broker.state.message.UniqIdGenerator)."""
    return [
        bpb.Message(
            queue_id=(seq + i) % queues,
            body=f"{seq + i:08d}".encode() * (body_bytes // 8),
            producer_group="pg",
            msg_id=ids.next_id(),
        )
        for i in range(n)
    ]


# Pull answers of one queue at most (64 messages each) before pull_queue gives up.
PULL_QUEUE_MAX_CALLS = 10_000


def pull_queue(
    stub: bpb_grpc.BrokerStub, topic: str, queue_id: int, timeout_s: float
) -> list[MessageExt]:
    """Every message of ``topic``'s queue ``queue_id`` the node holds, pulled from offset 0 by
    group "cg" without waiting (NO_NEW_MSG ends it)."""
    out: list[MessageExt] = []
    offset = 0
    for _ in range(PULL_QUEUE_MAX_CALLS):
        resp = stub.PullMessage(
            bpb.PullMessageRequest(
                consumer_group="cg",
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset,
                max_msgs=64,
                no_suspend=True,
            ),
            timeout=timeout_s,
        )
        if resp.status == bpb.NO_NEW_MSG:
            return out
        assert resp.status == bpb.FOUND, resp.status
        out.extend(pulled(resp))
        offset = resp.next_begin_offset
    raise AssertionError("pull loop bound reached")


def send_results(resp: bpb.SendMessageResponse) -> list[bpb.SendResult]:
    """A send answer's packed columns as one SendResult per message."""
    prefix = resp.offset_msg_id_prefix
    return [
        bpb.SendResult(
            msg_id=msg_id,
            offset_msg_id=f"{prefix}{position:016X}",
            queue_id=queue_id,
            queue_offset=queue_offset,
            commitlog_position=position,
            duplicate=duplicate,
        )
        for msg_id, queue_id, queue_offset, position, duplicate in zip(
            resp.packed_msg_ids,
            resp.packed_queue_ids,
            resp.packed_queue_offsets,
            resp.packed_positions,
            resp.packed_duplicates,
            strict=True,
        )
    ]


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def client_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(CLIENT_THREAD_PREFIXES)]


def create_topic(cluster: LocalCluster, topic: str, queues: int) -> None:
    """Create ``topic`` on the group's leader and wait until its NameServer routes it."""
    assert cluster.namesrv is not None
    create_topic_on([cluster], [cluster.namesrv.addr], topic, queues)


def create_topic_on(
    groups: list[LocalCluster], namesrv_addrs: list[str], topic: str, queues: int
) -> None:
    """Create ``topic`` on every group's leader; wait until every NameServer routes it to every
    group with a leader address. Each group is reached as its ``client_security()`` says (the
    NameServers as the first group's)."""
    for g in groups:
        with open_channel(g.node(g.wait_leader()).client_addr, g.client_security()) as ch:
            bpb_grpc.BrokerStub(ch).CreateTopic(
                bpb.CreateTopicRequest(
                    topic=bpb.TopicConfig(
                        topic_name=topic, read_queue_nums=queues, write_queue_nums=queues
                    )
                ),
                timeout=10,
            )
    for addr in namesrv_addrs:
        with open_channel(addr, groups[0].client_security()) as ch:
            stub = nspb_grpc.NameServerStub(ch)

            def routed(stub: nspb_grpc.NameServerStub = stub) -> bool:
                try:
                    r = stub.GetRouteInfoByTopic(
                        nspb.GetRouteInfoByTopicRequest(topic=topic), timeout=2
                    )
                except grpc.RpcError:
                    return False
                return len(r.groups) == len(groups) and all(g.leader_addr for g in r.groups)

            wait_for(routed, ROUTE_DEADLINE_S, f"route of {topic} on {addr}")


def pull_ids(
    addr: str, topic: str, queue_id: int, security: ClientSecurity = PLAINTEXT
) -> list[str]:
    """The msg ids of every message in one queue, as the node at ``addr`` serves them."""
    return [m.msg_id for m in pull_all(addr, topic, queue_id, security)]


def pull_all(
    addr: str,
    topic: str,
    queue_id: int,
    security: ClientSecurity = PLAINTEXT,
    start_offset: int = 0,
) -> list[MessageExt]:
    """Every message in one queue from ``start_offset`` on, as the node at ``addr`` serves
    them."""
    out: list[MessageExt] = []
    with open_channel(addr, security) as ch:
        stub = bpb_grpc.BrokerStub(ch)
        offset = start_offset
        while True:
            resp = stub.PullMessage(
                bpb.PullMessageRequest(
                    consumer_group="test-pull-ids",
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msgs=1024,
                    no_suspend=True,
                ),
                timeout=10,
            )
            messages = pulled(resp)
            out += messages
            if not messages:
                return out
            offset = resp.next_begin_offset


def create_v2_topic(cluster: LocalCluster, topic: str, queues: int) -> str:
    """Create ``topic`` on the group's leader and wait until every node's RocketMQ 5 port
    (plaintext) routes it: any node may then be asked. The v2 stubs are loaded only here."""
    from broker.frontends.v2 import stubs

    v2, v2_service, v2_grpc = stubs.load()
    create_topic_on([cluster], [], topic, queues)
    ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=topic))
    for n in cluster.nodes:
        with grpc.insecure_channel(n.grpc_addr) as ch:
            stub = v2_grpc.MessagingServiceStub(ch)

            def routed(stub: Any = stub) -> bool:
                try:
                    return bool(stub.QueryRoute(ask, timeout=5).status.code == v2.OK)
                except grpc.RpcError:
                    return False

            wait_for(routed, 10, f"{topic} routed on {n.node_id}")
    return topic


# Retention tests: segments older than this are expired with fileReservedTime=1 (hour).
TWO_HOURS_S = 2 * 3600
# deleteWhen for retention tests: deletion may run at any hour of the day.
ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))


def retention_keys(segment_bytes: int) -> dict[str, object]:
    """broker.conf keys of a group whose retention a test drives: small segments, expired
    after an hour (the test ages them, :func:`age_segments`), deleted at any hour, looked
    for every 300 ms."""
    return {
        "mappedFileSizeCommitLog": segment_bytes,
        "fileReservedTime": 1,
        "timerMaxDelaySec": 3600,  # at most fileReservedTime (broker.config)
        "deleteWhen": ALL_HOURS,
        "retentionCheckIntervalMs": 300,
    }


def metadata(addr: str) -> dpb.MetadataResponse | None:
    """A node's Raft metadata (indexes, role, store path); None while it does not answer."""
    try:
        with grpc.insecure_channel(addr) as ch:
            resp: dpb.MetadataResponse = dpb_grpc.DLedgerClientStub(ch).Metadata(
                dpb.MetadataRequest(), timeout=5
            )
            return resp
    except grpc.RpcError:
        return None


def metadata_now(addr: str, timeout_s: float = 15.0) -> dpb.MetadataResponse:
    """A node's Raft metadata, asking again while it does not answer (a loaded machine)."""
    got: list[dpb.MetadataResponse] = []

    def answered() -> bool:
        md = metadata(addr)
        if md is not None:
            got.append(md)
        return md is not None

    wait_for(answered, timeout_s, f"metadata of {addr}")
    return got[-1]


def age_segments(root: Path) -> None:
    """Pretend every data segment of a store (``Metadata.store_path``) was last written two
    hours ago, so that retention with fileReservedTime=1 finds them expired."""
    old = time.time() - TWO_HOURS_S
    for p in (root / "commitlog").iterdir():
        os.utime(p, (old, old))


def wait_trimmed(cluster: LocalCluster, node_ids: list[str], beyond: int) -> None:
    """Wait until retention moved the first index of each of ``node_ids`` past ``beyond``."""

    def trimmed() -> bool:
        metas = [metadata(cluster.node(n).client_addr) for n in node_ids]
        return all(m is not None and m.first_index > beyond for m in metas)

    wait_for(trimmed, 30, f"retention beyond index {beyond} on {node_ids}")


def converged(cluster: LocalCluster) -> Callable[[], bool]:
    """A condition: every node of ``cluster`` answers, with the same last and applied index."""

    def check() -> bool:
        metas = [metadata(n.client_addr) for n in cluster.nodes]
        return all(m is not None for m in metas) and (
            len({(m.last_index, m.applied_index) for m in metas if m is not None}) == 1
        )

    return check


def queue_min_offsets(addr: str, topic: str, queues: int) -> list[int]:
    """Each queue's min offset as the node at ``addr`` serves it (retention moves it)."""
    with grpc.insecure_channel(addr) as ch:
        stub = bpb_grpc.BrokerStub(ch)
        return [
            stub.GetQueueOffsets(
                bpb.GetQueueOffsetsRequest(topic=topic, queue_id=q), timeout=5
            ).min_offset
            for q in range(queues)
        ]


# The labels every series of a broker node carries (docs/METRICS.md "Labels").
IDENTITY_LABELS = ("cluster", "broker", "node")


def own_labels(labels: dict[str, str]) -> dict[str, str]:
    """A sample's labels but for a broker node's constant ones: {} for a family without labels
    of its own."""
    return {k: v for k, v in labels.items() if k not in IDENTITY_LABELS}


def node_metric(cluster: LocalCluster, node_id: str, name: str, **labels: str) -> float | None:
    """The sample of ``name`` with exactly ``labels`` of its own (beside the node's constant
    ones) from the node's /metrics; None when it does not answer."""
    try:
        with urllib.request.urlopen(cluster.node(node_id).metrics_url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and own_labels(s.labels) == labels:
                return float(s.value)
    return None
