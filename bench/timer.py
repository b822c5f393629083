"""Timed delivery at 100,000 pending messages (``python -m bench.timer``; also a part of
``mqbench``): what holding timed messages costs the leader, and how late they come.

On a local 3-node group (or the group ``mqbench`` hands over):

1. warm-up: ``--pending`` plain messages, so that the dedup window (100,000 ids) and the
   stores' first pages are full before anything is measured;
2. control: ``--pending`` more plain messages; the leader's resident memory (VmRSS) before
   and after is what storing that many messages costs anyway;
3. idle before: the leader's CPU over ``IDLE_WINDOW_S`` with nothing pending;
4. timed: ``--pending`` messages with ``TIMER_DELIVER_MS`` spread uniformly over ``--spread``
   seconds, starting ``--lead`` seconds after the first send (all of them pending once sent);
   VmRSS before and after, per pending message: an upper bound of what holding them costs
   (it also holds what storing any message costs, which the control shows), reported as bytes
   per pending message and pending messages per MiB; then the leader's CPU over
   ``IDLE_WINDOW_S`` while every message is pending and none due (the loop reads one head per
   level per pass, whatever the number pending);
5. delivery: every delivered copy read back; its lag is its store time (the leader's clock when
   the move entry was made) minus the delivery time asked, p50/p99/max, and the leader's CPU
   per delivered message.

Writes ``bench/results/timer-<UTC timestamp>.json`` when run alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from bench import cpu_s
from bench.broker import Target, pull_queue
from mqcluster.cluster import LocalCluster
from mqsecurity.channels import open_channel
from msgcodec import PROPERTY_TIMER_DELIVER_MS, UniqIdGenerator

TIMER_TOPIC_NAME = "BenchTimer"
PLAIN_TOPIC_NAME = "BenchTimerPlain"
QUEUES = 8
THREADS = 8
BATCH = 128
BODY_BYTES = 128
IDLE_WINDOW_S = 5.0
SEND_TIMEOUT_S = 300.0
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _proc_field(pid: int | None, name: str) -> int:
    """A ``/proc/PID/status`` field in kB (0 when the process is gone)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _send(target: Target, topic: str, deliver_ms: list[int | None]) -> float:
    """Send one message per item (a delivery time, or None: a plain message) with
    ``THREADS`` producers in batches of ``BATCH``; the seconds it took."""
    body = os.urandom(BODY_BYTES)
    chunks = [deliver_ms[i : i + BATCH] for i in range(0, len(deliver_ms), BATCH)]
    lock = threading.Lock()
    started = time.monotonic()

    def run(worker: int) -> None:
        ids = UniqIdGenerator(ip="127.0.0.1", instance_hash=5000 + worker)
        stub = pb_grpc.BrokerStub(open_channel(target.addr, target.security))
        while time.monotonic() - started < SEND_TIMEOUT_S:
            with lock:
                if not chunks:
                    return
                chunk = chunks.pop()
            msgs = [
                pb.Message(
                    queue_id=j % QUEUES,
                    body=body,
                    msg_id=ids.next_id(),
                    properties={} if due is None else {PROPERTY_TIMER_DELIVER_MS: str(due)},
                )
                for j, due in enumerate(chunk)
            ]
            while time.monotonic() - started < SEND_TIMEOUT_S:
                try:
                    stub.SendMessage(pb.SendMessageRequest(topic=topic, messages=msgs), timeout=30)
                    break
                except grpc.RpcError:
                    time.sleep(0.05)  # same ids: a retry is deduplicated

    workers = [threading.Thread(target=run, args=(w,)) for w in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(SEND_TIMEOUT_S + 30)
    return time.monotonic() - started


def _read_all(target: Target, topic: str) -> list[tuple[int, int]]:
    """(store time, asked delivery time) of every message in ``topic``."""
    return [
        (m.store_timestamp_ms, int(m.properties[PROPERTY_TIMER_DELIVER_MS]))
        for q in range(QUEUES)
        for m in pull_queue(target.stub, topic, q, "bench-timer")
    ]


def _count(target: Target, topic: str) -> int:
    return sum(
        target.stub.GetQueueOffsets(
            pb.GetQueueOffsetsRequest(topic=topic, queue_id=q), timeout=10
        ).max_offset
        for q in range(QUEUES)
    )


def _pct(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


def _memory(target: Target, pid: int | None, pending: int) -> dict[str, Any]:
    """Phases 1-2: the control's memory growth for ``pending`` plain messages."""
    _send(target, PLAIN_TOPIC_NAME, [None] * pending)  # warm-up
    before = _proc_field(pid, "VmRSS")
    _send(target, PLAIN_TOPIC_NAME, [None] * pending)
    return {"plain_rss_kb_before": before, "plain_rss_kb_after": _proc_field(pid, "VmRSS")}


def bench_timer(
    cluster: LocalCluster,
    target: Target,
    pending: int,
    spread_s: float,
    lead_s: float,
    idle_s: float = IDLE_WINDOW_S,
) -> dict[str, Any]:
    """The five phases above on ``cluster``'s leader (``target``); the figures."""
    leader = cluster.node(cluster.wait_leader())
    pid = cluster.pid(leader)
    for name in (TIMER_TOPIC_NAME, PLAIN_TOPIC_NAME):
        target.stub.CreateTopic(
            pb.CreateTopicRequest(
                topic=pb.TopicConfig(
                    topic_name=name, read_queue_nums=QUEUES, write_queue_nums=QUEUES
                )
            ),
            timeout=10,
        )
    result: dict[str, Any] = {"pending": pending, "spread_s": spread_s, "lead_s": lead_s}
    result.update(_memory(target, pid, pending))
    cpu = cpu_s(pid)
    time.sleep(idle_s)
    result["idle_before_leader_cpu_percent"] = 100 * (cpu_s(pid) - cpu) / idle_s
    rng = random.Random(1)
    first_ms = int(time.time() * 1000) + int(lead_s * 1000)
    due = [first_ms + rng.randrange(int(spread_s * 1000)) for _ in range(pending)]
    rss_before = _proc_field(pid, "VmRSS")
    result["send_s"] = _send(target, TIMER_TOPIC_NAME, list(due))
    sent_ms = int(time.time() * 1000)
    result["timer_rss_kb_before"] = rss_before
    result["timer_rss_kb_after"] = _proc_field(pid, "VmRSS")
    result["pending_when_sent"] = sum(1 for d in due if d > sent_ms)
    cpu = cpu_s(pid)
    window_s = min(idle_s, max(0.0, (first_ms - sent_ms) / 1000 - 0.5))
    time.sleep(window_s)
    result["idle_window_s"] = window_s
    result["idle_leader_cpu_percent"] = 100 * (cpu_s(pid) - cpu) / window_s if window_s else None
    cpu = cpu_s(pid)
    deadline = time.monotonic() + lead_s + spread_s + 120
    while _count(target, TIMER_TOPIC_NAME) < pending and time.monotonic() < deadline:
        time.sleep(0.5)
    result["delivery_leader_cpu_s"] = cpu_s(pid) - cpu
    lags = [store - asked for store, asked in _read_all(target, TIMER_TOPIC_NAME)]
    result.update(_figures(result, lags, pending))
    return result


def _figures(result: dict[str, Any], lags: list[int], pending: int) -> dict[str, Any]:
    plain_kb = result["plain_rss_kb_after"] - result["plain_rss_kb_before"]
    timer_kb = result["timer_rss_kb_after"] - result["timer_rss_kb_before"]
    # An upper bound: the growth also holds what storing any message costs (the dedup
    # window's churn, pages of the stores), which the control shows.
    per_pending = max(0, timer_kb) * 1024 / pending
    return {
        "delivered": len(lags),
        "early": sum(1 for lag in lags if lag < 0),
        "lag_ms_p50": _pct(lags, 0.5),
        "lag_ms_p99": _pct(lags, 0.99),
        "lag_ms_max": max(lags, default=0),
        "rss_growth_kb_plain": plain_kb,
        "rss_growth_kb_timed": timer_kb,
        "rss_bytes_per_pending_at_most": per_pending,
        "pending_per_mib_at_least": (1 << 20) / per_pending if per_pending else None,
        "leader_cpu_us_per_delivered": 1e6 * result["delivery_leader_cpu_s"] / max(1, len(lags)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.timer", description=__doc__)
    p.add_argument("--pending", type=int, default=100_000)
    p.add_argument("--spread", type=float, default=60.0, help="delivery times over this, s")
    p.add_argument("--lead", type=float, default=30.0, help="first delivery this long after, s")
    p.add_argument("--out", default=str(RESULTS_DIR))
    a = p.parse_args(argv)
    if a.pending <= 0 or a.spread <= 0 or a.lead <= 0:
        print("bench.timer: --pending, --spread and --lead must be > 0", file=sys.stderr)
        return 2
    started = datetime.now(UTC)
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="bench-timer-")))
    cluster.configure(3, auto_ports=True, extra={"mappedFileSizeCommitLog": str(64 << 20)})
    try:
        cluster.up()
        addr = cluster.node(cluster.wait_leader()).client_addr
        target = Target(addr, pb_grpc.BrokerStub(grpc.insecure_channel(addr)))
        result = bench_timer(cluster, target, a.pending, a.spread, a.lead)
    finally:
        cluster.down(grace_s=5.0)
        cluster.purge()
    result["host"] = {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()}
    print(json.dumps(result, indent=2))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"timer-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
