"""Benchmark of the broker on a local 3-node group (``python -m bench.broker``).

Starts a group in a temp dir (auto ports), creates a topic of 8 queues and measures:

- send throughput: ``--threads`` producers, each sending batches of ``--batch`` messages of
  ``--size`` bytes (one SendMessage = one Raft entry), for ``--seconds``;
- single-message send latency (one producer, one message per request);
- long-poll wake-up: a pull held on the leader and one on a follower, then one send; the time
  from the start of the send to the pull's answer, and to the send's acknowledgement;
- delayed messages (issue #7): the same producers send ``--delayed`` messages with delay level 1
  (scaled to 1 ms by ``delayLevelScale``); the rate is messages per second from the first send
  until the scheduler delivered the last one to its real queue;
- consumer retries: ``--delayed`` messages are sent back (``ConsumerSendMsgBack``, level 1,
  ``--batch`` per call, as a push consumer sends back a failed batch) by ``--threads``
  consumers; the rate is until the last retry copy is consumable in ``%RETRY%{group}``.
  Both are reported as a ratio to the plain send rate of the same run.

Prints a table and writes ``bench/results/broker-<UTC timestamp>.json``. Stops the group and
removes its temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from client.consumer import pulled_messages
from client.message import MessageExt
from mqcluster.cluster import LocalCluster
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_channel
from msgcodec import UniqIdGenerator

TOPIC = "BenchTopic"
DELAY_TOPIC = "BenchDelay"
RETRY_SOURCE_TOPIC = "BenchRetrySrc"
RETRY_GROUP = "bench-retry"
# 1 s (level 1) scaled to 1 ms: the delay itself does not count, the machinery does.
DELAY_LEVEL_SCALE = "0.001"
DELIVERY_TIMEOUT_S = 120.0
QUEUES = 8
WAKE_ROUNDS = 20
SEGMENT_BYTES = 64 << 20


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _leader_stub(cluster: LocalCluster) -> tuple[str, pb_grpc.BrokerStub]:
    leader = cluster.wait_leader()
    addr = cluster.node(leader).client_addr
    return addr, pb_grpc.BrokerStub(grpc.insecure_channel(addr))


def bench_throughput(
    addr: str, threads: int, batch: int, size: int, seconds: float
) -> dict[str, Any]:
    counts = [0] * threads
    errors = [0] * threads
    stop = time.monotonic() + seconds
    body = os.urandom(size)

    def run(i: int) -> None:
        ids = UniqIdGenerator(ip="127.0.0.1", instance_hash=i)
        stub = pb_grpc.BrokerStub(grpc.insecure_channel(addr))
        n = 0
        while time.monotonic() < stop:
            msgs = [
                pb.Message(
                    queue_id=(n + j) % QUEUES,
                    tags="T",
                    keys=[f"k{i}-{n + j}"],
                    body=body,
                    msg_id=ids.next_id(),
                )
                for j in range(batch)
            ]
            try:
                stub.SendMessage(pb.SendMessageRequest(topic=TOPIC, messages=msgs), timeout=10)
            except grpc.RpcError:
                errors[i] += 1
                continue
            n += batch
            counts[i] = n

    started = time.monotonic()
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 30)
    elapsed = time.monotonic() - started
    total = sum(counts)
    return {
        "threads": threads,
        "batch": batch,
        "message_bytes": size,
        "messages": total,
        "messages_per_s": total / elapsed,
        "mb_per_s": total * size / elapsed / 1e6,
        "failed_requests": sum(errors),
    }


def _queue_total(stub: pb_grpc.BrokerStub, topic: str, queues: int) -> int:
    total = 0
    for q in range(queues):
        try:
            resp = stub.GetQueueOffsets(
                pb.GetQueueOffsetsRequest(topic=topic, queue_id=q), timeout=5
            )
        except grpc.RpcError:
            return -1
        total += resp.max_offset
    return total


@dataclass(frozen=True, slots=True)
class Target:
    """The leader a case loads: its address, a stub on it, and how the case's own producer
    and consumer channels reach it (TLS, signed calls; plaintext by default)."""

    addr: str
    stub: pb_grpc.BrokerStub
    security: ClientSecurity = PLAINTEXT


def _send_all(
    target: Target, topic: str, threads: int, batch: int, size: int, total: int, delay_level: int
) -> int:
    """Send ``total`` messages (``delay_level`` > 0: delayed) with ``threads`` producers."""
    body = os.urandom(size)
    per_thread = total // threads
    sent = [0] * threads
    props = {"DELAY": str(delay_level)} if delay_level else {}

    def run(i: int) -> None:
        ids = UniqIdGenerator(ip="127.0.0.1", instance_hash=1000 + i)
        stub = pb_grpc.BrokerStub(open_channel(target.addr, target.security))
        while sent[i] < per_thread:
            n = min(batch, per_thread - sent[i])
            msgs = [
                pb.Message(
                    queue_id=(sent[i] + j) % QUEUES,
                    body=body,
                    properties=props,
                    msg_id=ids.next_id(),
                )
                for j in range(n)
            ]
            try:
                stub.SendMessage(pb.SendMessageRequest(topic=topic, messages=msgs), timeout=10)
            except grpc.RpcError:
                continue
            sent[i] += n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(DELIVERY_TIMEOUT_S)
    return sum(sent)


def _wait_total(stub: pb_grpc.BrokerStub, topic: str, queues: int, want: int) -> bool:
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        if _queue_total(stub, topic, queues) >= want:
            return True
        time.sleep(0.01)
    return False


def pull_queue(stub: pb_grpc.BrokerStub, topic: str, queue_id: int, group: str) -> list[MessageExt]:
    """Every message of one queue, pulled from its start without waiting."""
    out: list[MessageExt] = []
    offset = 0
    while True:
        resp = stub.PullMessage(
            pb.PullMessageRequest(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset,
                max_msgs=1024,
                no_suspend=True,
            ),
            timeout=30,
        )
        pulled = pulled_messages(resp, "bench")
        if not pulled:
            return out
        out += pulled
        offset = resp.next_begin_offset


def bench_delay(target: Target, threads: int, batch: int, size: int, total: int) -> dict[str, Any]:
    started = time.monotonic()
    sent = _send_all(target, DELAY_TOPIC, threads, batch, size, total, delay_level=1)
    sent_s = time.monotonic() - started
    delivered = _wait_total(target.stub, DELAY_TOPIC, QUEUES, sent)
    elapsed = time.monotonic() - started
    return {
        "messages": sent,
        "all_delivered": delivered,
        "send_seconds": sent_s,
        "messages_per_s": sent / elapsed,
        "conditions": f"{threads} producers x {batch} msgs x {size} B, level 1 = 1 ms",
    }


def bench_send_back(
    target: Target, threads: int, batch: int, size: int, total: int
) -> dict[str, Any]:
    stub = target.stub
    sent = _send_all(target, RETRY_SOURCE_TOPIC, threads, batch, size, total, delay_level=0)
    positions = [
        (m.commitlog_position, m.msg_id)
        for q in range(QUEUES)
        for m in pull_queue(stub, RETRY_SOURCE_TOPIC, q, RETRY_GROUP)
    ]
    chunks = [positions[i::threads] for i in range(threads)]
    failed = [0] * threads

    def run(i: int) -> None:
        s = pb_grpc.BrokerStub(open_channel(target.addr, target.security))
        mine = chunks[i]
        for at in range(0, len(mine), batch):
            part = mine[at : at + batch]
            try:
                s.ConsumerSendMsgBack(
                    pb.ConsumerSendMsgBackRequest(
                        consumer_group=RETRY_GROUP,
                        messages=[pb.SendBackItem(commitlog_position=p, msg_id=m) for p, m in part],
                        delay_level=1,
                    ),
                    timeout=10,
                )
            except grpc.RpcError:
                failed[i] += len(part)

    started = time.monotonic()
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(DELIVERY_TIMEOUT_S)
    delivered = _wait_total(stub, "%RETRY%" + RETRY_GROUP, 1, len(positions) - sum(failed))
    elapsed = time.monotonic() - started
    return {
        "messages": len(positions),
        "source_sent": sent,
        "failed_send_backs": sum(failed),
        "all_delivered": delivered,
        "messages_per_s": len(positions) / elapsed,
        "conditions": f"{threads} consumers, {batch} messages per send-back, level 1 = 1 ms",
    }


def bench_single(stub: pb_grpc.BrokerStub, seconds: float) -> dict[str, Any]:
    ids = UniqIdGenerator(ip="127.0.0.1", instance_hash=999)
    lat: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        stub.SendMessage(
            pb.SendMessageRequest(
                topic=TOPIC,
                messages=[pb.Message(queue_id=0, body=b"x" * 128, msg_id=ids.next_id())],
            ),
            timeout=10,
        )
        lat.append((time.perf_counter() - t0) * 1000)
    return {
        "sends": len(lat),
        "p50_ms": statistics.median(lat),
        "p99_ms": _pct(lat, 0.99),
    }


def bench_wake(cluster: LocalCluster, leader_addr: str, stub: pb_grpc.BrokerStub) -> dict[str, Any]:
    ids = UniqIdGenerator(ip="127.0.0.1", instance_hash=1234)
    follower_addr = next(a for a in cluster.client_addrs if a != leader_addr)
    out: dict[str, Any] = {}
    for role, addr in (("leader", leader_addr), ("follower", follower_addr)):
        consumer = pb_grpc.BrokerStub(grpc.insecure_channel(addr))
        wake: list[float] = []
        after_ack: list[float] = []
        leader = pb_grpc.BrokerStub(grpc.insecure_channel(leader_addr))
        for _ in range(WAKE_ROUNDS):
            want = leader.GetQueueOffsets(
                pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=7), timeout=5
            ).max_offset
            deadline = time.monotonic() + 10
            while True:  # a follower applies the previous round's commit a little later
                end = consumer.GetQueueOffsets(
                    pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=7), timeout=5
                ).max_offset
                if end == want or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            held = consumer.PullMessage.future(
                pb.PullMessageRequest(
                    topic=TOPIC, queue_id=7, queue_offset=end, suspend_timeout_ms=10_000
                ),
                timeout=20,
            )
            try:
                early = held.result(timeout=0.05)
                raise SystemExit(f"bench: the pull was answered before any send: {early}")
            except grpc.FutureTimeoutError:
                pass
            t0 = time.perf_counter()
            stub.SendMessage(
                pb.SendMessageRequest(
                    topic=TOPIC, messages=[pb.Message(queue_id=7, body=b"w", msg_id=ids.next_id())]
                ),
                timeout=10,
            )
            acked = time.perf_counter()
            resp = held.result(timeout=15)
            woke = time.perf_counter()
            assert resp.status == pb.FOUND
            wake.append((woke - t0) * 1000)
            after_ack.append((woke - acked) * 1000)
        out[role] = {
            "rounds": WAKE_ROUNDS,
            "send_start_to_pull_answer_p50_ms": statistics.median(wake),
            "send_start_to_pull_answer_max_ms": max(wake),
            "send_ack_to_pull_answer_p50_ms": statistics.median(after_ack),
            "send_ack_to_pull_answer_max_ms": max(after_ack),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each case")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--delayed", type=int, default=20_000, help="messages per delay case")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.threads <= 0 or args.batch <= 0 or args.size <= 0:
        print("error: --seconds, --threads, --batch and --size must be > 0", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    started = datetime.now(UTC)
    cluster = LocalCluster(tmp)
    cluster.configure(
        3,
        auto_ports=True,
        extra={
            "mappedFileSizeCommitLog": str(SEGMENT_BYTES),
            "maxHashSlotNum": "500000",
            "maxIndexNum": "2000000",
            "delayLevelScale": DELAY_LEVEL_SCALE,
        },
    )
    try:
        cluster.up()
        addr, stub = _leader_stub(cluster)
        for name in (TOPIC, DELAY_TOPIC, RETRY_SOURCE_TOPIC):
            stub.CreateTopic(
                pb.CreateTopicRequest(
                    topic=pb.TopicConfig(
                        topic_name=name, read_queue_nums=QUEUES, write_queue_nums=QUEUES
                    )
                ),
                timeout=10,
            )
        wake = bench_wake(cluster, addr, stub)
        single = bench_single(stub, min(args.seconds, 3.0))
        throughput = bench_throughput(addr, args.threads, args.batch, args.size, args.seconds)
        target = Target(addr, stub)  # this tool's group is plaintext
        delay = bench_delay(target, args.threads, args.batch, args.size, args.delayed)
        retry = bench_send_back(target, args.threads, args.batch, args.size, args.delayed)
    finally:
        cluster.down(grace_s=5.0)
        cluster.purge()
    result: dict[str, Any] = {
        "bench": "broker",
        "started_utc": started.isoformat(),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "group": "3 nodes, loopback, SYNC_FLUSH",
        "send_throughput": throughput,
        "single_send": single,
        "long_poll_wake": wake,
        "delayed_messages": delay,
        "consumer_retries": retry,
        "delay_to_send_ratio": delay["messages_per_s"] / throughput["messages_per_s"],
        "retry_to_send_ratio": retry["messages_per_s"] / throughput["messages_per_s"],
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"broker-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    t = throughput
    print(
        f"send: {t['threads']} producers x {t['batch']} msgs x {t['message_bytes']} B: "
        f"{t['messages_per_s']:,.0f} msg/s ({t['mb_per_s']:.1f} MB/s), "
        f"failed requests {t['failed_requests']}"
    )
    print(f"single-message send: p50 {single['p50_ms']:.2f} ms, p99 {single['p99_ms']:.2f} ms")
    for role, w in wake.items():
        print(
            f"long-poll wake on {role}: send start -> pull answer p50 "
            f"{w['send_start_to_pull_answer_p50_ms']:.1f} ms (max "
            f"{w['send_start_to_pull_answer_max_ms']:.1f}), ack -> pull answer p50 "
            f"{w['send_ack_to_pull_answer_p50_ms']:.1f} ms (max "
            f"{w['send_ack_to_pull_answer_max_ms']:.1f})"
        )
    for name, key in (("delayed messages", "delayed_messages"), ("retries", "consumer_retries")):
        d = result[key]
        ratio = d["messages_per_s"] / t["messages_per_s"]
        print(
            f"{name}: {d['messages_per_s']:,.0f} msg/s ({d['conditions']}), "
            f"{ratio:.2f} x the send rate (target >= 0.25), all delivered: {d['all_delivered']}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
