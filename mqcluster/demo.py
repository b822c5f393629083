"""``make demo``: a 3-node broker group, producing and consuming over gRPC through a failover.

Steps: start a local 3-node group (``mqcluster up``); create a topic; a producer sends batches
of messages with tags and keys over ``raftmq.broker.v1.Broker``; SIGKILL the leader while it
sends (a batch whose outcome is unknown is retried with the same message ids, which the broker
deduplicates); restart the old leader; consume every queue from every node and check that each
acknowledged message is there exactly once, in send order per queue, on all three replicas;
then the official RocketMQ 5 Python client, unchanged and in its own venv, produces a few
messages over the v2 port (``grpcServerPort``, docs/RMQ5.md) and a SimpleConsumer receives and
acks each (``examples/rmq5/py_roundtrip.py``); tear everything down. Apart from that step it
talks to the generated stubs only, as any client could.

The group is secure, as ``mqcluster up`` makes it (TLS on every port, member certificates,
ACLs): every call goes over TLS, signed with the admin user's credentials. ``--insecure`` runs
it plaintext.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as ns_grpc

from broker.state.message import decode_offset_msg_id
from mqcluster.cluster import (
    OFFICIAL_PYTHON,
    ClusterError,
    LocalCluster,
    format_table,
    metrics_line,
)
from mqcluster.leader_client import LeaderClient
from mqsecurity.channels import open_channel
from mqsecurity.errors import SecurityError
from msgcodec import OFFSET_MSG_ID_PREFIX_CHARS, ROW_UNIQ_ID, decode_rows

# Bounds of the demo's load (it must stop by itself).
DEMO_BATCHES = 150
DEMO_BATCH_SIZE = 20
DEMO_QUEUES = 4
DEMO_MAX_SECONDS = 120
# The demo's group is gone when it ends; this says where to watch one that stays up.
WHERE_TO_LOOK = (
    "to watch a group: `mqcluster up` starts one that stays up and prints each process's "
    "/metrics address (node i: https://127.0.0.1:5557+i/metrics, the NameServer: "
    "https://127.0.0.1:5556/metrics, checked with the group's CA: curl --cacert "
    "/tmp/raftmq-cluster/tls/ca.crt; http:// with --insecure); docs/METRICS.md lists every "
    "metric"
)
TOPIC = "DemoTopic"
# The official client's step: its own topic and group (a new group starts at the oldest
# message), this many messages, and a bound on the whole step (client start-ups included).
V2_TOPIC = "DemoTopicV2"
V2_GROUP = "demo-official-client"
V2_MESSAGES = 10
V2_TIMEOUT_S = 60
V2_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "rmq5" / "py_roundtrip.py"
T = TypeVar("T")


def _say(text: str) -> None:
    print(f"\n== {text}", flush=True)


class _Client(LeaderClient):
    """Leader-only calls (``write``) that follow redirects by the structured error
    (:mod:`mqcluster.leader_client`), plus reading a queue from one node."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(lambda: cluster.client_addrs)
        self.cluster = cluster
        self.security = cluster.client_security()

    write = LeaderClient.call

    def stub(self, addr: str) -> pb_grpc.BrokerStub:
        """The node's stub over a channel opened as the group's security says."""
        if addr not in self.channels:
            self.channels[addr] = open_channel(addr, self.security)
        return pb_grpc.BrokerStub(self.channels[addr])

    def pull_queue(self, addr: str, queue_id: int) -> list[str]:
        """The message ids of one queue as ``addr`` stores it, in queue order (a pull answer
        carries the stored bytes, read with the shared codec, CRC checked)."""
        out: list[str] = []
        offset = 0
        while True:
            resp = self.stub(addr).PullMessage(
                pb.PullMessageRequest(
                    consumer_group="demo-consumers",
                    topic=TOPIC,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msgs=256,
                    no_suspend=True,
                ),
                timeout=10,
                # The channel to a node killed and restarted earlier may still be in its
                # reconnect backoff: wait for it instead of failing at once.
                wait_for_ready=True,
            )
            if not resp.raw_positions:
                return out
            rows = decode_rows(resp.raw_messages, 0, len(resp.raw_positions), verify_crc=True)
            out.extend(row[ROW_UNIQ_ID] for row in rows)
            offset = resp.next_begin_offset


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledged send: when its answer arrived (``time.monotonic()``) and which node
    gave it ("" when the answer did not say)."""

    at_s: float
    node_id: str


def answering_node(resp: pb.SendMessageResponse, node_by_port: dict[int, str]) -> str:
    """The node that answered a send: the answer's offset_msg_id prefix carries the answering
    node's store host and client port (the group's nodes have distinct ports)."""
    prefix = resp.offset_msg_id_prefix
    if len(prefix) != OFFSET_MSG_ID_PREFIX_CHARS:
        return ""
    return node_by_port.get(decode_offset_msg_id(prefix + "0" * 16).port, "")


def first_new_leader_ack(acks: Sequence[Ack], killed_at_s: float, killed: str) -> Ack | None:
    """The first send acknowledged after the kill by a node other than the killed one: the
    failover is over when the new leader answers, not when an answer the old leader sent
    before it died arrives late (that measured "1 ms"). None if there is no such ack."""
    after = [a for a in acks if a.at_s > killed_at_s and a.node_id and a.node_id != killed]
    return min(after, key=lambda a: a.at_s) if after else None


def _check_queue(acked: list[str], got: list[str]) -> str:
    """Why ``got`` (a queue as consumed) fails "every acknowledged id exactly once, in send
    order"; "" when it holds. Ids of sends that never got an answer may appear too."""
    if len(set(got)) != len(got):
        return "a message id appears twice"
    position = {msg_id: i for i, msg_id in enumerate(got)}
    missing = [m for m in acked if m not in position]
    if missing:
        return f"{len(missing)} acknowledged messages missing"
    order = [position[m] for m in acked]
    if order != sorted(order):
        return "acknowledged messages out of send order"
    return ""


def _wait_route(cluster: LocalCluster, ok: Callable[[str], bool], timeout_s: float = 15.0) -> str:
    """The NameServer's route for TOPIC once its leader satisfies ``ok``, as one line."""
    assert cluster.namesrv is not None
    deadline = time.monotonic() + timeout_s
    text = "(no route)"
    with open_channel(cluster.namesrv.addr, cluster.client_security()) as channel:
        stub = ns_grpc.NameServerStub(channel)
        while time.monotonic() < deadline:
            try:
                resp = stub.GetRouteInfoByTopic(
                    ns_pb.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=2
                )
            except grpc.RpcError:
                time.sleep(0.1)
                continue
            for g in resp.groups:
                followers = ", ".join(f"{f.node_id}@{f.addr}" for f in g.followers)
                text = (
                    f"group {g.broker_name}: {g.write_queue_nums} queues, leader "
                    f"{g.leader_id}@{g.leader_addr} (term {g.leader_term}), followers {followers}"
                )
                if ok(g.leader_id):
                    return text
            time.sleep(0.1)
    return text


class _Producer:
    """Sends DEMO_BATCHES batches in a thread of its own, one at a time through the leader;
    records every acknowledged id per queue and which node acknowledged each batch."""

    def __init__(self, client: _Client, cluster: LocalCluster) -> None:
        self.client = client
        self.node_by_port = {n.client_port: n.node_id for n in cluster.nodes}
        self.sent: dict[int, list[str]] = {q: [] for q in range(DEMO_QUEUES)}
        self.acks: list[Ack] = []
        self.retried = 0
        self.duplicates = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + DEMO_MAX_SECONDS
        for b in range(DEMO_BATCHES):
            if time.monotonic() > deadline:
                return
            self._send_batch(b)

    def _send_batch(self, b: int) -> None:
        queue_id = b % DEMO_QUEUES
        messages = [
            pb.Message(
                topic=TOPIC,
                queue_id=queue_id,
                tags="TagA" if i % 2 == 0 else "TagB",
                keys=[f"order-{b}-{i}"],
                body=f"demo message {b}-{i}".encode(),
                msg_id=uuid.uuid4().hex.upper(),
                producer_group="demo-producers",
            )
            for i in range(DEMO_BATCH_SIZE)
        ]
        request = pb.SendMessageRequest(topic=TOPIC, messages=messages)
        attempts = 0

        def send(stub: pb_grpc.BrokerStub) -> pb.SendMessageResponse:
            nonlocal attempts
            attempts += 1
            resp: pb.SendMessageResponse = stub.SendMessage(request, timeout=5)
            return resp

        # The same request (same message ids) on every attempt: the broker deduplicates.
        resp = self.client.write(send, timeout_s=30)
        self.retried += attempts > 1
        self.duplicates += sum(resp.packed_duplicates)
        self.sent[queue_id].extend(m.msg_id for m in messages)
        self.acks.append(Ack(time.monotonic(), answering_node(resp, self.node_by_port)))


def _create_topic(client: _Client, cluster: LocalCluster) -> None:
    _say(f"creating topic {TOPIC} with {DEMO_QUEUES} queues (replicated through Raft)")
    config = pb.TopicConfig(
        topic_name=TOPIC, read_queue_nums=DEMO_QUEUES, write_queue_nums=DEMO_QUEUES
    )
    topic = client.write(lambda s: s.CreateTopic(pb.CreateTopicRequest(topic=config), timeout=5))
    print(f"created: {topic.topic.topic_name} queues={topic.topic.write_queue_nums}")
    route = _wait_route(cluster, lambda leader_id: bool(leader_id))
    print(f"NameServer route for {TOPIC}: {route}")


def _produce_through_failover(cluster: LocalCluster, producer: _Producer, leader: str) -> None:
    """Start the producer, SIGKILL the leader a third of the way in, report the failover: from
    the kill to the first send acknowledged by another node."""
    _say(f"producing {DEMO_BATCHES} batches of {DEMO_BATCH_SIZE} messages over gRPC")
    started = time.monotonic()
    producer.thread.start()
    while len(producer.acks) < DEMO_BATCHES // 3 and producer.thread.is_alive():
        time.sleep(0.01)
    _say(f"SIGKILL the leader {leader} while the producer keeps sending")
    cluster.signal(leader, signal.SIGKILL)
    killed_at = time.monotonic()
    new_leader = cluster.wait_leader(exclude=leader)
    producer.thread.join(DEMO_MAX_SECONDS)
    first = first_new_leader_ack(producer.acks, killed_at, leader)
    failover_ms = (first.at_s - killed_at) * 1000 if first else float("nan")
    route = _wait_route(cluster, lambda leader_id: leader_id == new_leader)
    print(f"NameServer route for {TOPIC} now: {route}")
    print(
        f"new leader: {new_leader}; failover (kill -> first send acknowledged by "
        f"{first.node_id if first else 'a new leader'}): {failover_ms:.0f} ms"
    )
    total = sum(len(v) for v in producer.sent.values())
    print(
        f"acknowledged {total} messages in {time.monotonic() - started:.2f} s; "
        f"batches retried with the same ids: {producer.retried}; "
        f"answered as duplicates: {producer.duplicates}"
    )


def _restart(cluster: LocalCluster, node_id: str) -> None:
    _say(f"restarting {node_id}; it catches up from the new leader")
    cluster.start(node_id)
    cluster.wait_leader()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = cluster.status_rows()
        if len({r["commit"] for r in rows}) == 1 and all(r["pid"] != "-" for r in rows):
            break
        time.sleep(0.1)
    print(format_table(cluster.status_rows()))


def _consume_everywhere(cluster: LocalCluster, client: _Client, sent: dict[int, list[str]]) -> bool:
    """Every queue from every node: each acknowledged id exactly once, in send order."""
    _say("consuming every queue from every node")
    ok = True
    for n in cluster.nodes:
        counts = []
        for q in range(DEMO_QUEUES):
            got = client.pull_queue(n.client_addr, q)
            counts.append(len(got))
            problem = _check_queue(sent[q], got)
            if problem:
                ok = False
                print(f"  {n.node_id} queue {q}: {problem}")
        print(f"  {n.node_id}: messages per queue {counts}")
    sample = client.stub(cluster.client_addrs[0]).QueryMessageByKey(
        pb.QueryMessageByKeyRequest(topic=TOPIC, key="order-7-3"), timeout=5, wait_for_ready=True
    )
    print(f"  lookup by key order-7-3: {[m.body.decode() for m in sample.messages]}")
    return ok


def _official_client(cluster: LocalCluster, client: _Client) -> bool:
    """The official Python client produces V2_MESSAGES over the leader's v2 port and a
    SimpleConsumer receives and acks each, secure like the group (TLS trusting its CA, the
    admin user's AccessKey/SecretKey); the client's own lines are shown indented."""
    _say(
        f"the official RocketMQ 5 Python client (unchanged, its own venv) over the v2 port: "
        f"{V2_MESSAGES} messages produced, then received and acked by a SimpleConsumer"
    )
    if not OFFICIAL_PYTHON.exists():
        print(f"  {OFFICIAL_PYTHON} missing: run 'make venv' (protos/rmq5_deps.py)")
        return False
    config = pb.TopicConfig(topic_name=V2_TOPIC, read_queue_nums=2, write_queue_nums=2)
    client.write(lambda s: s.CreateTopic(pb.CreateTopicRequest(topic=config), timeout=5))
    endpoint = cluster.node(cluster.wait_leader()).grpc_addr
    home = cluster.base / "official-client-home"  # the client logs under ~/logs
    home.mkdir(exist_ok=True)
    argv = [str(OFFICIAL_PYTHON), str(V2_SCRIPT), endpoint, V2_TOPIC, V2_GROUP]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*argv, str(V2_MESSAGES)],
            env=cluster.official_client_env(home),
            capture_output=True,
            text=True,
            timeout=V2_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"  the official client did not finish within {V2_TIMEOUT_S} s")
        return False
    print(done.stdout.rstrip())
    print(f"  (the client's two start-ups included: {time.monotonic() - started:.1f} s)")
    if done.returncode != 0:
        print(f"  the official client failed (exit {done.returncode}): {done.stderr[-1000:]}")
    return done.returncode == 0


# The demo opens no browser and starts no dashboard (it tears its group down within a
# minute); it says where to look (issue #22).
WATCH_NOTE = (
    "to watch a group in a browser: `mqcluster up` starts one and prints the mqdashboard\n"
    "command for it; the dashboard serves http://127.0.0.1:8080/ (docs/DASHBOARD.md)"
)


def run(base_dir: Path, secure: bool = True) -> int:
    cluster = LocalCluster(base_dir / "group")
    # Small segments: the demo writes a few MB; default 1 GiB segments are for production.
    cluster.configure(
        3,
        auto_ports=True,
        namesrv=True,
        extra={"mappedFileSizeCommitLog": str(16 << 20)},
        secure=secure,
    )
    client = _Client(cluster)
    try:
        _say("starting a NameServer and a 3-node broker group (one Raft group) on 127.0.0.1")
        print(f"security: {client.security.describe()}")
        leader = cluster.up()
        print(format_table(cluster.status_rows()))
        print(metrics_line(cluster))
        _create_topic(client, cluster)
        producer = _Producer(client, cluster)
        _produce_through_failover(cluster, producer, leader)
        _restart(cluster, leader)
        ok = _consume_everywhere(cluster, client, producer.sent)
        official = _official_client(cluster, client)
        _say("verdict")
        print(f"every acknowledged message exactly once, in order, on all 3 replicas: {ok}")
        print(f"the official Python client's messages received and acked, each once: {official}")
        print("DEMO OK" if ok and official else "DEMO FAILED")
        print(WHERE_TO_LOOK)
        print(WATCH_NOTE)
        return 0 if ok and official else 1
    except (ClusterError, SecurityError, grpc.RpcError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
        _say("tearing down")
        cluster.down()
        print("all nodes stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq-demo", description=__doc__)
    parser.add_argument("--base-dir", help="keep data and logs here (default: a temp dir)")
    parser.add_argument(
        "--insecure", action="store_true", help="plaintext, no ACLs (as mqcluster up --insecure)"
    )
    ns = parser.parse_args(argv)
    if ns.base_dir:
        return run(Path(ns.base_dir), secure=not ns.insecure)
    with tempfile.TemporaryDirectory(prefix="raftmq-demo-") as tmp:
        return run(Path(tmp), secure=not ns.insecure)


if __name__ == "__main__":
    sys.exit(main())
