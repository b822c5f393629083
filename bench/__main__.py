"""``mqbench`` / ``python -m bench``: raftmq on a local 3-node group, side by side with peers.

Starts a fresh local group with a NameServer (once under SYNC_FLUSH, once under ASYNC_FLUSH),
drives it over gRPC with load-generator processes using the real client, and measures:

- produce throughput (messages/s, MB/s) and latency p50/p99/p99.9 for each message size and
  number of sends in flight (``--sizes``, ``--in-flight``), under both flush modes, with the
  CPU seconds each node spent per million messages;
- end-to-end latency, send to push-consumer callback, at a fixed moderate rate;
- catch-up consumption of a backlog (``--backlog`` messages of 1 KiB) with a pull consumer;
- failover: SIGKILL of the leader to the next acknowledged send (``--failovers`` trials);
- delayed-message and consumer-retry throughput as ratios to the plain send rate (issue #7);
- timed messages (issue #20, ``bench/timer.py``): pending timed messages held per MiB of the
  leader's memory and their delivery lag with ``--timers`` (100,000) pending;
- peak RSS of every node;
- the cost of security (issue #18): the send rate of a group with TLS, member certificates and
  ACLs and of one without, same flush mode and load, alternating between them in one run;
- the cost of metrics (issue #22): the send rate and the group's CPU per message with /metrics
  served (and scraped every second) and not served, in many short paired rounds, each pair's
  on/off ratio with a 95 % interval for their median (``bench.metricscost``;
  ``--metrics-rounds`` pairs of ``--metrics-seconds``; ``--only metrics`` runs nothing else);
- when installed (``make bench-peers``), a 3-node etcd and a 3-node NATS JetStream R3 on
  127.0.0.1 under the same load shape, and our figures as ratios to theirs;
- the v2 producer (issue #19): the official RocketMQ 5 Python client's ``Producer.send`` over
  the v2 port (``grpcServerPort``) of the SYNC_FLUSH group, 1 KiB, 1 and 16 sends in flight,
  beside the raftmq client's cases of that group (``bench/v2_producer.py``, run in the
  client's own venv ``build/rmq5/pyclient``, made by ``make venv``), with each group's CPU per
  message;
- the v2 receive path (issue #36): one backlog drained by the raftmq PushConsumer and by the
  official client's SimpleConsumer and PushConsumer (``bench/v2_consumer.py``), each with the
  leader's CPU per message;
- the remoting producer (issue #37): SEND_MESSAGE_V2 requests, as a RocketMQ 4.x producer sends
  them, over the SYNC_FLUSH group's remoting port (``remotingListenPort``), 1 KiB, 1 and 16 in
  flight on one connection of the ``remoting`` package's asyncio client
  (``bench/remoting_producer.py``, a process of its own), in the same table as the v2 cases.

Every group is secure, as ``mqcluster up`` makes it (every call over TLS, signed by the admin
user); ``--insecure`` runs them all plaintext. Writes ``bench/results/<UTC timestamp>.json``,
``.md`` (tables) and ``.png`` (chart). ``--smoke`` runs every part once, small (under a
minute): what CI checks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc

from bench import broker as bb
from bench import cpu_s
from bench import metricscost as mc
from bench.closedloop import WARMUP_S
from bench.memory import SAMPLE_INTERVAL_S, MemorySampler, at_rest, rest_samples
from bench.sweep import create_work_dir, sweep_stale
from client import (
    ConsumeStatus,
    Message,
    MessageExt,
    MQAdmin,
    MQClientError,
    Producer,
    PullConsumer,
    PushConsumer,
)
from mqcluster.cluster import OFFICIAL_PYTHON, LocalCluster
from mqsecurity.channels import open_channel

TOPIC = "BenchT"
QUEUES = 8
SEGMENT_BYTES = 256 << 20
# Processes generating load (each keeps in_flight / processes sends in flight), as the peers'
# load uses two: one process's GIL must not cap the load (--loadgen-processes).
LOADGEN_PROCESSES = 2
# A load-generator process must report within its duration plus this.
LOADGEN_GRACE_S = 60.0
E2E_RATE_PER_S = 500
BACKLOG_BATCH = 256
BACKLOG_THREADS = 4
CONSUME_THREADS = QUEUES
# How long the e2e consumer may take to own every queue before sends start.
CONSUMER_READY_TIMEOUT_S = 15.0
# A failover trial gives up after this long without an acknowledged send.
FAILOVER_TIMEOUT_S = 30.0
# After a trial, how long the restarted node may take to catch up before the next one.
CATCH_UP_TIMEOUT_S = 120.0
# The security comparison: 1 KiB sends under ASYNC_FLUSH, where the disk does not set the pace
# and the CPU cost of TLS and signatures shows; rounds alternate which group goes first, so a
# drift of the machine's load falls on both sides.
SECURITY_FLUSH = "ASYNC_FLUSH"
SECURITY_SIZE = 1024
SECURITY_ROUNDS = 3
MAX_SECURITY_ROUNDS = 10
# The metrics comparison (bench.metricscost): plaintext groups (TLS would dilute the cost),
# METRICS_PAIRS pairs of METRICS_SECONDS rounds per in-flight count (at least 6 pairs give a
# 95 % interval; 12 keep the default run's share of it near 2 minutes). At most
# MAX_METRICS_PAIRS: on the shared 2-core machine at load 15-25 a pair's CPU-per-message ratio
# spreads by about 10 %, and a 95 % interval 2 % wide on each side takes about 200 pairs
# (concurrent pairs of 2 s rounds: about 9 minutes per in-flight count).
METRICS_PAIRS = 12
METRICS_SECONDS = 2.0
MAX_METRICS_PAIRS = 240
MAX_METRICS_SECONDS = 60.0
SMOKE_METRICS_SECONDS = 0.5
# The peers and the floor run at this message size, at every in-flight count of the run.
PEER_SIZE = 1024
# The floor's in-flight counts (issue #23: 1 and 16), those of the run's counts it keeps.
FLOOR_IN_FLIGHT = (1, 16)
# Memory at rest: after a group is up (or filled), this long for start-up work, flushes and
# the first checkpoint to end, then the median of REST_SAMPLES samples.
REST_SETTLE_S = 3.0
REST_SAMPLES = 8
REST_SAMPLE_INTERVAL_S = 0.25
# The at-rest case with stored messages (--rest-messages): a fresh group, ASYNC_FLUSH (memory
# does not depend on the flush mode; the fill is faster).
REST_FLUSH = "ASYNC_FLUSH"
REST_TOPIC = "BenchRest"
SMOKE_REST_MESSAGES = 1024
# The restart of the at-rest case: SIGTERM, then SIGKILL after this long.
REST_STOP_GRACE_S = 10.0
# Bounds --rest-messages: 10 M x 1 KiB is 10 GiB per node.
MAX_REST_MESSAGES = 10_000_000
SMOKE_FLOOR_SECONDS = 0.3
SMOKE_FLOOR_WARMUP_S = 0.2
RESULTS_DIR = Path(__file__).parent / "results"
# The v2 producer case (issue #19): the official Python client in its own venv (its bundled
# apache.rocketmq.v2 stubs cannot share a process with the server's), at 1 KiB and these
# numbers of sends in flight, on the SYNC_FLUSH group.
V2_CLIENT = "rocketmq-python-client 5.1.2"
V2_SCRIPT = Path(__file__).resolve().parent / "v2_producer.py"
V2_SIZE = 1024
V2_IN_FLIGHT = (1, 16)
V2_FLUSH = "SYNC_FLUSH"
# The client's start-up (route, settings handshake) before its warm-up; part of the timeout.
V2_STARTUP_S = 20.0
# The v2 receive cases (issue #36): a backlog of this many 1 KiB messages in one topic, drained
# by each consumer in turn with a group of its own (a new group starts at the first message):
# the raftmq PushConsumer, then the official client's SimpleConsumer (receive + ack, this many
# threads) and PushConsumer. Each case is given at most V2_RECEIVE_MAX_S.
V2_RECEIVE_SCRIPT = Path(__file__).resolve().parent / "v2_consumer.py"
V2_RECEIVE_TOPIC = "BenchV2Receive"
V2_RECEIVE_MESSAGES = 20_000
SMOKE_V2_RECEIVE_MESSAGES = 512
V2_RECEIVE_THREADS = 4
V2_RECEIVE_MAX_S = 120.0
# The remoting producer case (issue #37): SEND_MESSAGE_V2 over the leader's remoting port with
# the remoting package's asyncio client, in a process of its own (bench/remoting_producer.py),
# at the v2 case's size, in-flight counts and group.
REMOTING_CLIENT = "remoting asyncio client (SEND_MESSAGE_V2)"
REMOTING_MODULE = "bench.remoting_producer"
# The process's start-up (imports, the connection) before its warm-up; part of the timeout.
REMOTING_STARTUP_S = 10.0


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _peak_rss_mb(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _drop_unknown_keys(cluster: LocalCluster, broker_keys: frozenset[str]) -> None:
    """Rewrite the nodes' broker.conf without the keys not in ``broker_keys``."""
    for node in cluster.nodes:
        path = Path(node.conf)
        lines = path.read_text().splitlines(keepends=True)
        kept = [ln for ln in lines if "=" not in ln or ln.partition("=")[0].strip() in broker_keys]
        path.write_text("".join(kept))


@contextlib.contextmanager
def local_group(
    base: Path,
    flush: str,
    secure: bool,
    name: str = "",
    metrics: bool = True,
    node_env: dict[str, str] | None = None,
    env_of_node: Mapping[str, Mapping[str, str]] | None = None,
    broker_keys: frozenset[str] | None = None,
    peer_socket: bool = True,
) -> Iterator[LocalCluster]:
    """A 3-node group with a NameServer; ``metrics`` False: no process serves /metrics;
    ``node_env``: extra environment of every broker (``bench.steps``' counting hook);
    ``env_of_node``: node id -> extra environment of that broker only, on top of ``node_env``
    (``bench.backlog --node-env``: a native heap profiler's preload on one node);
    ``broker_keys``: the broker.conf keys the brokers' code knows, any other key left out of
    their files (``bench.steps --compare`` runs an older checkout's brokers, which refuse a key
    added since; the NameServer is always this checkout's); ``peer_socket`` False: no
    dLegerPeerSocketPort (the Raft messages on gRPC streams, as before the peer socket)."""
    cluster = LocalCluster(base / (name or flush.lower()))
    off = {} if metrics else {"metricsPort": "0"}
    if not peer_socket:
        off = {**off, "dLegerPeerSocketPort": "0"}
    cluster.configure(
        3,
        auto_ports=True,
        namesrv=True,
        secure=secure,
        extra={
            "flushDiskType": flush,
            "mappedFileSizeCommitLog": str(SEGMENT_BYTES),
            "maxHashSlotNum": "500000",
            "maxIndexNum": "4000000",
            "delayLevelScale": "0.001",
            **off,
        },
        namesrv_conf={k: v for k, v in off.items() if k == "metricsPort"},
    )
    if broker_keys is not None:
        _drop_unknown_keys(cluster, broker_keys)
    if node_env or env_of_node:
        cluster.node_env = {
            n.node_id: {**(node_env or {}), **(env_of_node or {}).get(n.node_id, {})}
            for n in cluster.nodes
        }
    try:
        cluster.up()
        assert cluster.namesrv is not None
        MQAdmin(cluster.namesrv.addr, cluster.client_security()).create_topic(TOPIC, queues=QUEUES)
        yield cluster
    finally:
        cluster.down(grace_s=5.0)
        cluster.purge()


def produce_case(
    cluster: LocalCluster,
    size: int,
    in_flight: int,
    seconds: float,
    processes: int = LOADGEN_PROCESSES,
    mode: str = "async",
) -> dict[str, Any]:
    """``in_flight`` closed-loop senders of ``size``-byte messages for ``seconds``, from
    ``processes`` load generators (``mode``: see ``bench.loadgen``)."""
    assert cluster.namesrv is not None
    procs = max(1, min(processes, in_flight))
    threads = max(1, in_flight // procs)
    pids = {n.node_id: cluster.pid(n) for n in cluster.nodes}
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    cmd = [sys.executable, "-m", "bench.loadgen", "--namesrv", cluster.namesrv.addr]
    cmd += ["--topic", TOPIC, "--size", str(size), "--in-flight", str(threads)]
    cmd += ["--seconds", str(seconds), "--mode", mode, *cluster.tool_argv()]
    running = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    outs = []
    for p in running:
        try:
            out, err = p.communicate(timeout=seconds + LOADGEN_GRACE_S)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"loadgen failed ({p.returncode}): {err.strip()[-500:]}")
        outs.append(json.loads(out))
    cpu1 = {k: cpu_s(p) for k, p in pids.items()}
    sent = sum(int(o["sent"]) for o in outs)
    lat_ms = [us / 1000 for o in outs for us in o["latencies_us"]]
    cpu_per_m = {k: (cpu1[k] - cpu0[k]) / sent * 1e6 if sent else 0.0 for k in sorted(pids)}
    return {
        "message_bytes": size,
        "in_flight": procs * threads,
        "loadgen_processes": procs,
        "loadgen_mode": mode,
        "seconds": seconds,
        "messages": sent,
        "failed": sum(int(o["failed"]) for o in outs),
        "messages_per_s": sent / seconds,
        "mb_per_s": sent * size / seconds / 1e6,
        "p50_ms": pct(lat_ms, 0.50),
        "p99_ms": pct(lat_ms, 0.99),
        "p999_ms": pct(lat_ms, 0.999),
        "cpu_s_per_million_msgs": cpu_per_m,
    }


def v2_producer_case(cluster: LocalCluster, in_flight: int, seconds: float) -> dict[str, Any]:
    """The official Python client's ``Producer.send``, ``in_flight`` threads of one process,
    ``V2_SIZE``-byte messages to the leader's v2 port for ``seconds``; the figures computed as
    :func:`produce_case` computes them. Skipped (with the reason) when the client's venv is
    missing."""
    if not OFFICIAL_PYTHON.exists():
        return {"skipped": f"{OFFICIAL_PYTHON} missing: run make venv (protos/rmq5_deps.py)"}
    home = cluster.base / "v2-home"
    home.mkdir(exist_ok=True)
    addr = cluster.node(cluster.wait_leader()).grpc_addr
    argv = [str(OFFICIAL_PYTHON), str(V2_SCRIPT), addr, TOPIC, str(V2_SIZE), str(in_flight)]
    pids = {n.node_id: cluster.pid(n) for n in cluster.nodes}
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    proc = subprocess.run(
        [*argv, str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + V2_STARTUP_S + LOADGEN_GRACE_S,
        env=cluster.official_client_env(home),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"v2 producer failed ({proc.returncode}): {proc.stderr[-500:]}")
    cpu1 = {k: cpu_s(p) for k, p in pids.items()}
    out = json.loads(proc.stdout)
    sent = int(out["sent"])
    lat_ms = [us / 1000 for us in out["latencies_us"]]
    # The client's start-up and warm-up fall in the window, as produce_case's load processes'
    # do: per measured message, both a little above the steady cost.
    cpu_per_m = {k: (cpu1[k] - cpu0[k]) / sent * 1e6 if sent else 0.0 for k in sorted(pids)}
    return {
        "client": V2_CLIENT,
        "flush": V2_FLUSH,
        "message_bytes": V2_SIZE,
        "in_flight": in_flight,
        "seconds": seconds,
        "messages": sent,
        "failed": int(out["failed"]),
        "messages_per_s": sent / seconds,
        "mb_per_s": sent * V2_SIZE / seconds / 1e6,
        "p50_ms": pct(lat_ms, 0.50),
        "p99_ms": pct(lat_ms, 0.99),
        "p999_ms": pct(lat_ms, 0.999),
        "cpu_s_per_million_msgs": cpu_per_m,
    }


def _receive_figures(client: str, done: int, failed: int, seconds: float) -> dict[str, Any]:
    return {
        "client": client,
        "messages": done,
        "failed": failed,
        "seconds": seconds,
        "messages_per_s": done / seconds if seconds > 0 else 0.0,
    }


def _raftmq_receive(cluster: LocalCluster, group: str, count: int) -> dict[str, Any]:
    """The raftmq PushConsumer of ``group`` consuming ``count`` messages of the receive
    topic (its listener answering success), timed from the first message consumed to the
    ``count``-th (the drain, as ``bench/v2_consumer.py`` times the official consumers)."""
    assert cluster.namesrv is not None
    done = [0]
    times = [0.0, 0.0]  # the first and the last message's consumption
    reached = threading.Event()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            now = time.monotonic()
            if not done[0]:
                times[0] = now
            done[0] += len(msgs)
            times[1] = now
            if done[0] >= count:
                reached.set()
        return ConsumeStatus.CONSUME_SUCCESS

    security = cluster.client_security()
    consumer = PushConsumer(group, cluster.namesrv.addr, consume_batch_size=32, security=security)
    consumer.subscribe(V2_RECEIVE_TOPIC, "*")
    consumer.register_listener(listener)
    consumer.start()
    try:
        reached.wait(V2_RECEIVE_MAX_S)
    finally:
        consumer.shutdown()
    with lock:
        return _receive_figures("raftmq PushConsumer", done[0], 0, times[1] - times[0])


def _official_receive(cluster: LocalCluster, group: str, mode: str, count: int) -> dict[str, Any]:
    """The official client's ``mode`` consumer (``bench/v2_consumer.py``) of ``group``
    draining ``count`` messages of the receive topic through the leader's v2 port."""
    home = cluster.base / "v2-home"
    home.mkdir(exist_ok=True)
    addr = cluster.node(cluster.wait_leader()).grpc_addr
    argv = [str(OFFICIAL_PYTHON), str(V2_RECEIVE_SCRIPT), addr, V2_RECEIVE_TOPIC, group, mode]
    proc = subprocess.run(
        [*argv, str(count), str(V2_RECEIVE_THREADS), str(V2_RECEIVE_MAX_S)],
        capture_output=True,
        text=True,
        timeout=V2_RECEIVE_MAX_S + V2_STARTUP_S + LOADGEN_GRACE_S,
        env=cluster.official_client_env(home),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"v2 consumer failed ({proc.returncode}): {proc.stderr[-500:]}")
    out = json.loads(proc.stdout)
    name = f"{V2_CLIENT} {'SimpleConsumer' if mode == 'simple' else 'PushConsumer'}"
    return _receive_figures(name, int(out["done"]), int(out["failed"]), float(out["seconds"]))


def v2_receive_cases(cluster: LocalCluster, smoke: bool) -> dict[str, Any]:
    """A backlog of 1 KiB messages drained by the raftmq PushConsumer, then by the official
    client's SimpleConsumer and PushConsumer (each with a group of its own), with the
    leader's CPU per message of each. Skipped (with the reason) without the client's venv."""
    if not OFFICIAL_PYTHON.exists():
        return {"skipped": f"{OFFICIAL_PYTHON} missing: run make venv (protos/rmq5_deps.py)"}
    count = SMOKE_V2_RECEIVE_MESSAGES if smoke else V2_RECEIVE_MESSAGES
    stored, _ = fill_topic(cluster, V2_RECEIVE_TOPIC, count)
    runs: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
        ("raftmq", lambda g: _raftmq_receive(cluster, g, stored)),
        ("simple", lambda g: _official_receive(cluster, g, "simple", stored)),
        ("push", lambda g: _official_receive(cluster, g, "push", stored)),
    ]
    cases = []
    for name, run in runs:
        pid = cluster.pid(cluster.node(cluster.wait_leader()))
        cpu0 = cpu_s(pid)
        case = run(f"bench-v2-receive-{name}")
        used = cpu_s(pid) - cpu0
        case["leader_cpu_ms_per_msg"] = used / case["messages"] * 1e3 if case["messages"] else 0.0
        cases.append(case)
        print(
            f"receive ({case['client']}): {case['messages']:,} of {stored:,} in "
            f"{case['seconds']:.1f} s = {case['messages_per_s']:,.0f} msg/s, leader "
            f"{case['leader_cpu_ms_per_msg']:.2f} ms CPU per message, failed {case['failed']}",
            flush=True,
        )
    return {"message_bytes": 1024, "backlog": stored, "cases": cases}


def e2e_latency(cluster: LocalCluster, seconds: float) -> dict[str, Any]:
    """Send at ``E2E_RATE_PER_S`` and time each message from send to the consumer callback."""
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    lat_ms: list[float] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        now_ns = time.time_ns()
        with lock:
            for m in msgs:
                t0 = m.properties.get("bench_t0_ns")
                if t0 is not None:
                    lat_ms.append((now_ns - int(t0)) / 1e6)
        return ConsumeStatus.CONSUME_SUCCESS

    security = cluster.client_security()
    consumer = PushConsumer("bench-e2e", addr, consume_batch_size=32, security=security)
    consumer.subscribe(TOPIC, "e2e")
    consumer.register_listener(listener)
    consumer.start()
    sent = 0
    try:
        deadline = time.monotonic() + CONSUMER_READY_TIMEOUT_S
        while len(consumer.assigned_queues()) < QUEUES and time.monotonic() < deadline:
            time.sleep(0.05)  # the consumer takes its queues (rebalance, locks)
        with Producer("bench-e2e-pg", addr, security=security) as producer:
            period_s = 1.0 / E2E_RATE_PER_S
            next_at = time.monotonic()
            stop_at = next_at + seconds
            while next_at < stop_at:
                time.sleep(max(0.0, next_at - time.monotonic()))
                props = {"bench_t0_ns": str(time.time_ns())}
                with contextlib.suppress(MQClientError):
                    producer.send(Message(TOPIC, b"x" * 1024, tags="e2e", properties=props))
                    sent += 1
                next_at += period_s
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if len(lat_ms) >= sent:
                    break
            time.sleep(0.05)
    finally:
        consumer.shutdown()
    with lock:
        got = list(lat_ms)
    return {
        "rate_per_s": E2E_RATE_PER_S,
        "message_bytes": 1024,
        "sent": sent,
        "received": len(got),
        "p50_ms": pct(got, 0.50),
        "p99_ms": pct(got, 0.99),
        "p999_ms": pct(got, 0.999),
    }


def fill_topic(cluster: LocalCluster, topic: str, messages: int) -> tuple[int, float]:
    """Create ``topic`` and store about ``messages`` x 1 KiB in it with ``BACKLOG_THREADS``
    threads sending batches; (messages stored, seconds taken)."""
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    security = cluster.client_security()
    MQAdmin(addr, security).create_topic(topic, queues=QUEUES)
    body = os.urandom(1024)
    per_thread = messages // BACKLOG_THREADS
    t0 = time.monotonic()
    with Producer(f"bench-fill-{topic}", addr, security=security) as producer:

        def fill(i: int) -> None:
            done = 0
            while done < per_thread:
                n = min(BACKLOG_BATCH, per_thread - done)
                with contextlib.suppress(MQClientError):
                    producer.send_batch([Message(topic, body) for _ in range(n)])
                    done += n

        fillers = [threading.Thread(target=fill, args=(i,)) for i in range(BACKLOG_THREADS)]
        for t in fillers:
            t.start()
        for t in fillers:
            t.join()
    return per_thread * BACKLOG_THREADS, time.monotonic() - t0


def backlog_consume(cluster: LocalCluster, messages: int) -> dict[str, Any]:
    """Fill a fresh topic with ``messages`` x 1 KiB, then read it all back, every queue in
    parallel, with a pull consumer (the catch-up read of a consumer that was down)."""
    assert cluster.namesrv is not None
    addr = cluster.namesrv.addr
    topic = "BenchBacklog"
    security = cluster.client_security()
    total, fill_s = fill_topic(cluster, topic, messages)
    counts = [0] * CONSUME_THREADS
    with PullConsumer("bench-backlog-cg", addr, security) as consumer:
        queues = consumer.fetch_queues(topic)
        t1 = time.monotonic()

        def drain(i: int) -> None:
            for mq in queues[i::CONSUME_THREADS]:
                offset = 0
                while True:
                    res = consumer.pull(mq, offset, 1024)
                    counts[i] += len(res.messages)
                    if res.status != "FOUND":
                        break
                    offset = res.next_begin_offset

        readers = [threading.Thread(target=drain, args=(i,)) for i in range(CONSUME_THREADS)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        read_s = time.monotonic() - t1
    read = sum(counts)
    return {
        "messages": total,
        "message_bytes": 1024,
        "fill_seconds": fill_s,
        "fill_messages_per_s": total / fill_s,
        "read": read,
        "read_seconds": read_s,
        "read_messages_per_s": read / read_s,
        "read_mb_per_s": read * 1024 / read_s / 1e6,
    }


def _wait_caught_up(cluster: LocalCluster, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
    """Until every node applied what the leader committed: the next trial then measures a
    failover, not a group whose restarted member is still replaying."""
    deadline = time.monotonic() + timeout_s
    security = cluster.client_security()
    while time.monotonic() < deadline:
        try:
            metas = []
            for n in cluster.nodes:
                with open_channel(n.client_addr, security) as ch:
                    stub = dpb_grpc.DLedgerClientStub(ch)
                    metas.append(stub.Metadata(dpb.MetadataRequest(), timeout=2))
        except grpc.RpcError:
            time.sleep(0.2)
            continue
        leaders = [m for m in metas if m.role == "LEADER"]
        if leaders and all(m.applied_index >= leaders[0].commit_index for m in metas):
            return
        time.sleep(0.2)


def failover_trials(cluster: LocalCluster, trials: int) -> dict[str, Any]:
    """SIGKILL the leader with a producer sending; time to its next acknowledged send."""
    assert cluster.namesrv is not None
    times: list[float] = []
    with Producer(
        "bench-failover",
        cluster.namesrv.addr,
        send_msg_timeout_s=1.0,
        security=cluster.client_security(),
    ) as producer:
        producer.send(Message(TOPIC, b"warm"))
        for _ in range(trials):
            leader = cluster.wait_leader()
            killed_at = time.monotonic()
            cluster.signal(leader, signal.SIGKILL)
            while time.monotonic() - killed_at < FAILOVER_TIMEOUT_S:
                try:
                    producer.send(Message(TOPIC, b"after-kill"))
                except MQClientError:
                    continue
                times.append(time.monotonic() - killed_at)
                break
            cluster.start(leader)
            _wait_caught_up(cluster)
    return {
        "trials": trials,
        "seconds": times,
        "median_s": statistics.median(times) if times else None,
        "max_s": max(times) if times else None,
    }


def delay_and_retry(cluster: LocalCluster, messages: int, send_rate: float) -> dict[str, Any]:
    """bench.broker's delayed-message and retry throughput cases on this group."""
    addr = cluster.node(cluster.wait_leader()).client_addr
    security = cluster.client_security()
    stub = pb_grpc.BrokerStub(open_channel(addr, security))
    for name in (bb.DELAY_TOPIC, bb.RETRY_SOURCE_TOPIC):
        stub.CreateTopic(
            pb.CreateTopicRequest(
                topic=pb.TopicConfig(topic_name=name, read_queue_nums=8, write_queue_nums=8)
            ),
            timeout=10,
        )
    target = bb.Target(addr, stub, security)
    delay = bb.bench_delay(target, 16, 64, 1024, messages)
    retry = bb.bench_send_back(target, 16, 64, 1024, messages)
    return {
        "delayed": delay,
        "retries": retry,
        "send_rate_for_ratio": send_rate,
        "delay_ratio": delay["messages_per_s"] / send_rate if send_rate else None,
        "retry_ratio": retry["messages_per_s"] / send_rate if send_rate else None,
    }


def timed_messages(cluster: LocalCluster, pending: int, smoke: bool) -> dict[str, Any]:
    """bench.timer's figures on this group: memory per pending timed message, delivery lag."""
    from bench.timer import bench_timer

    addr = cluster.node(cluster.wait_leader()).client_addr
    security = cluster.client_security()
    target = bb.Target(addr, pb_grpc.BrokerStub(open_channel(addr, security)), security)
    if smoke:  # every phase once, small: a few seconds
        return bench_timer(cluster, target, pending, spread_s=1.0, lead_s=2.0, idle_s=0.5)
    return bench_timer(cluster, target, pending, spread_s=30.0, lead_s=30.0)


def security_compare(
    base: Path, in_flight: Sequence[int], seconds: float, processes: int, mode: str, rounds: int
) -> dict[str, Any]:
    """The send rate with TLS, member certificates and ACLs on and off: two groups up side by
    side, the same load on each in turn (the order alternating by round); per in-flight
    count the median of each side and on/off."""
    with (
        local_group(base, SECURITY_FLUSH, secure=False, name="security-off") as off,
        local_group(base, SECURITY_FLUSH, secure=True, name="security-on") as on,
    ):
        cases = _alternating(
            "security",
            off,
            on,
            in_flight,
            rounds,
            lambda cluster, n: produce_case(cluster, SECURITY_SIZE, n, seconds, processes, mode),
        )
    return {
        "flush": SECURITY_FLUSH,
        "message_bytes": SECURITY_SIZE,
        "rounds": rounds,
        "conditions": "on: TLS on every port, member certificates, authentication and "
        "authorization, every call signed by the admin user; off: plaintext, no ACLs",
        "cases": cases,
        "summary": _on_off_summary(cases, "security", in_flight),
    }


def metrics_compare(
    base: Path,
    in_flight: Sequence[int],
    seconds: float,
    load: tuple[int, str],
    pairs: int,
    design: str,
    scrape_interval_s: float = mc.SCRAPE_INTERVAL_S,
    null: bool = False,
    periods: int = 1,
) -> dict[str, Any]:
    """The send rate and CPU per message with /metrics served and scraped (every
    ``scrape_interval_s``), and not served: two plaintext groups side by side, ``pairs`` short
    paired rounds of ``seconds`` per in-flight count (``bench.metricscost``; ``design``
    "concurrent" or "alternating"); ``load``: the load generators' processes per group and
    mode. ``null``: the "on" group serves no metrics either (an A/A comparison: what the design
    reports when nothing differs, e.g. one group's placement favoured over the other's).
    ``periods`` > 1 (even): a crossover, the role of serving metrics swapped each period."""
    load0 = os.getloadavg()
    cases = []
    own = []
    for period in range(periods):
        period_cases, period_own = _metrics_period(
            base, period, in_flight, seconds, load, pairs, design, scrape_interval_s, null
        )
        cases += [{**case, "period": period} for case in period_cases]
        own.append(period_own)
    load1 = os.getloadavg()
    crossover = (
        f"crossover: {periods} periods of {pairs} pairs, each with two fresh groups g0 "
        "(started first) and g1, g1 serving metrics in even periods and g0 in odd ones; the "
        "interval is over the geometric means of pair i of periods 2j and 2j + 1 (a group's "
        "own advantage cancels); "
        if periods > 1
        else ""
    )
    return {
        "flush": SECURITY_FLUSH,
        "message_bytes": SECURITY_SIZE,
        "pairs": pairs,
        "periods": periods,
        "design": design,
        "seconds_per_round": seconds,
        "scrape_interval_s": scrape_interval_s,
        "null_comparison": null,
        "load_avg_at_start": load0,
        "load_avg_at_end": load1,
        "conditions": (
            "NULL COMPARISON (--metrics-null): 'on' serves no metrics either, so every "
            "difference is the design's own; "
            if null
            else ""
        )
        + crossover
        + "on: every node and the NameServer serve /metrics, each scraped every "
        f"{scrape_interval_s:g} s all along; off: metricsPort=0 (nothing counted); both plaintext; "
        f"{mc.DESIGNS[design]}; each pair's on/off ratio, their median and its 95 % sign-test "
        "interval; CPU = user + system of the group's 3 nodes and NameServer over the "
        "measured window. At saturation (256 in flight on 2 cores) the send rate is CPU-bound "
        "and moves with the machine's load; the CPU per message is the load-robust measure "
        "of the cost",
        "cases": cases,
        "summary": mc.summary(cases, in_flight),
        "own_cpu": own,
    }


def _metrics_period(
    base: Path,
    period: int,
    in_flight: Sequence[int],
    seconds: float,
    load: tuple[int, str],
    pairs: int,
    design: str,
    scrape_interval_s: float,
    null: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One period of the metrics comparison: fresh groups g0 (started first) and g1, g1 the
    "on" group in even periods, g0 in odd ones; its cases, and the metrics' own cost by the
    "on" group's count over the period."""
    processes, mode = load
    on_name = "g1" if period % 2 == 0 else "g0"
    serving = {name: name == on_name and not null for name in ("g0", "g1")}
    with (
        local_group(base, SECURITY_FLUSH, False, f"metrics-g0-{period}", serving["g0"]) as g0,
        local_group(base, SECURITY_FLUSH, False, f"metrics-g1-{period}", serving["g1"]) as g1,
        mc.load_pool(g0, TOPIC, SECURITY_SIZE, processes, mode) as pool0,
        mc.load_pool(g1, TOPIC, SECURITY_SIZE, processes, mode) as pool1,
    ):
        by_name = {"g0": (g0, pool0), "g1": (g1, pool1)}
        off_name = "g0" if on_name == "g1" else "g1"
        groups = {"off": by_name[off_name], "on": by_name[on_name]}
        print(f"metrics period {period}: {on_name} on, {off_name} off", flush=True)
        cases, own = mc.run_pairs(
            groups, in_flight, pairs, seconds, design == "concurrent", scrape_interval_s
        )
    return [{**c, "on_group": on_name} for c in cases], {**own, "on_group": on_name}


def _alternating(
    key: str,
    off: LocalCluster,
    on: LocalCluster,
    in_flight: Sequence[int],
    rounds: int,
    run: Callable[[LocalCluster, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """``run(group, in_flight)`` on each side in turn, the order alternating by round, so a
    drift of the machine's load falls on both sides; every case labelled ``key: on|off``."""
    cases: list[dict[str, Any]] = []
    for r in range(rounds):
        for n in in_flight:
            sides = [("off", off), ("on", on)]
            for label, cluster in sides if r % 2 == 0 else sides[::-1]:
                case = run(cluster, n)
                cases.append({key: label, "round": r, "asked_in_flight": n, **case})
                print(
                    f"{key} {label}, {n} in flight: {case['messages_per_s']:,.0f} msg/s "
                    f"p99 {case['p99_ms']:.1f} ms",
                    flush=True,
                )
    return cases


def _on_off_summary(
    cases: Sequence[dict[str, Any]], key: str, in_flight: Sequence[int]
) -> list[dict[str, Any]]:
    """Per in-flight count: the median send rate of each side, on/off, and every round's."""
    summary = []
    for n in in_flight:
        rates = {
            side: sorted(
                c["messages_per_s"] for c in cases if c[key] == side and c["asked_in_flight"] == n
            )
            for side in ("on", "off")
        }
        on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
        summary.append(
            {
                "in_flight": n,
                "on_messages_per_s": on,
                "off_messages_per_s": off,
                "on_over_off": on / off if off else None,
                "on_each_round": rates["on"],  # the spread: how much to trust the ratio
                "off_each_round": rates["off"],
            }
        )
    return summary


def peers(levels: Sequence[int], seconds: float, processes: int) -> dict[str, Any]:
    """etcd and NATS JetStream R3 at 1 KiB and each of ``levels`` in flight, one cluster per
    peer for all levels, memory sampled throughout; a peer not installed is skipped with the
    reason, one that fails keeps the cases measured before."""
    from bench import peers as bp

    out: dict[str, Any] = {}
    kinds: list[tuple[str, Any, Callable[..., dict[str, Any]]]] = [
        ("etcd", bp.EtcdCluster, bp.run_etcd),
        ("nats_jetstream_r3", bp.NatsCluster, bp.run_nats),
    ]
    for name, cls, run in kinds:
        reason = cls.unavailable_reason()
        if reason:
            out[name] = {"skipped": reason}
            print(f"{name}: skipped ({reason})", flush=True)
            continue
        section: dict[str, Any] = {"version": bp.binary_version(cls.binary), "cases": []}
        out[name] = section
        try:
            with cls() as cluster, MemorySampler(_member_pids(cluster)) as sampler:
                for n in levels:
                    case = run(PEER_SIZE, n, seconds, processes=processes, cluster=cluster)
                    case.update(in_flight=n, message_bytes=PEER_SIZE)
                    section["cases"].append(case)
                    print(
                        f"{name} {PEER_SIZE} B x {n} in flight: {case['ops_per_s']:,.0f} ops/s "
                        f"p50 {case['p50_ms']:.2f} p99 {case['p99_ms']:.2f} ms",
                        flush=True,
                    )
            section["peak_memory_mb"] = sampler.peaks()
        except Exception as exc:  # a peer failing must not lose our own figures
            section["error"] = f"{type(exc).__name__}: {exc}"[:500]
            if not section["cases"]:
                out[name] = {"skipped": f"failed: {section['error']}"}
    return out


def _member_pids(cluster: Any) -> dict[str, int | None]:
    """A peer cluster's (or the floor's) processes by member name."""
    return {m.name: m.proc.pid if m.proc else None for m in cluster.members}


def floor_cases(
    levels: Sequence[int], seconds: float, processes: int, warmup_s: float | None = None
) -> dict[str, Any]:
    """bench.floor at 1 KiB and each of ``levels`` in flight on one floor group."""
    from bench.floor import DEFAULT_WARMUP_S, FloorGroup, run_floor
    from bench.peers import PeerError

    cases: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with FloorGroup() as group, MemorySampler(_member_pids(group)) as sampler:
            for n in levels:
                case = run_floor(
                    PEER_SIZE,
                    n,
                    seconds,
                    processes=processes,
                    warmup_s=DEFAULT_WARMUP_S if warmup_s is None else warmup_s,
                    group=group,
                )
                case["message_bytes"] = PEER_SIZE
                cases.append(case)
                print(
                    f"floor {PEER_SIZE} B x {n} in flight: {case['ops_per_s']:,.0f} calls/s "
                    f"p50 {case['p50_ms']:.2f} p99 {case['p99_ms']:.2f} ms",
                    flush=True,
                )
    except (PeerError, OSError) as exc:
        return {"skipped": f"failed: {exc}"[:500], "cases": cases}
    # seconds: the whole part, the three servers' start and stop included
    return {"cases": cases, "peak_memory_mb": sampler.peaks(), "seconds": time.monotonic() - t0}


def _node_pids(cluster: LocalCluster) -> dict[str, int | None]:
    return {n.node_id: cluster.pid(n) for n in cluster.nodes}


def memory_at_rest(cluster: LocalCluster, smoke: bool) -> dict[str, Any]:
    """Each node's RssAnon and RssFile with nothing running: after REST_SETTLE_S, the median
    of REST_SAMPLES samples (smoke: one sample, at once)."""
    time.sleep(0.0 if smoke else REST_SETTLE_S)
    count = 1 if smoke else REST_SAMPLES
    return at_rest(rest_samples(_node_pids(cluster), count, REST_SAMPLE_INTERVAL_S))


def rest_memory_case(
    cluster: LocalCluster, messages: int, smoke: bool, group: str, restart: bool = False
) -> dict[str, Any]:
    """Store ``messages`` x 1 KiB, wait until every node applied them, let the group settle,
    then each node's memory at rest (issue #23: RssAnon per node with 1,000,000 stored).
    ``restart``: then also after stopping and starting every node (what holding the messages
    costs, without the heap the fill left behind), with the restart's seconds."""
    t0 = time.monotonic()
    stored, fill_s = fill_topic(cluster, REST_TOPIC, messages)
    _wait_caught_up(cluster)
    per_node = memory_at_rest(cluster, smoke)
    extra: dict[str, Any] = {}
    if restart:
        t1 = time.monotonic()
        cluster.down(grace_s=REST_STOP_GRACE_S)
        cluster.up()
        _wait_caught_up(cluster)
        extra["restart_seconds"] = time.monotonic() - t1
        extra["per_node_after_restart"] = memory_at_rest(cluster, smoke)
    return {
        **extra,
        "stored_messages": stored,
        "message_bytes": 1024,
        "flush": REST_FLUSH,
        "group": group,
        "fill_seconds": fill_s,
        "fill_messages_per_s": stored / fill_s if fill_s else 0.0,
        "settle_s": 0.0 if smoke else REST_SETTLE_S,
        "per_node": per_node,
        "seconds": time.monotonic() - t0,
    }


def remoting_producer_case(cluster: LocalCluster, in_flight: int, seconds: float) -> dict[str, Any]:
    """SEND_MESSAGE_V2 requests, ``in_flight`` at a time on one connection of the remoting
    package's client (its own process), ``V2_SIZE``-byte messages to the leader's remoting port
    for ``seconds``; the figures computed as :func:`produce_case` computes them. A secure group:
    TLS trusting its CA, every request signed by the admin user (RocketMQ's ACL signature)."""
    port = cluster.node(cluster.wait_leader()).remoting_port
    if not port:
        return {"skipped": "the group serves no remoting port (remotingListenPort)"}
    addr = f"127.0.0.1:{port}"
    env = {**os.environ}
    credentials = cluster.client_security().credentials
    if cluster.secure and credentials is not None:
        env |= {
            "REMOTING_TLS_CA": str(cluster.layout.ca_cert),
            "REMOTING_ACCESS_KEY": credentials.access_key,
            "REMOTING_SECRET_KEY": credentials.secret_key,
        }
    argv = [addr, TOPIC, str(QUEUES), str(V2_SIZE), str(in_flight), str(seconds)]
    proc = subprocess.run(
        [sys.executable, "-m", REMOTING_MODULE, *argv],
        capture_output=True,
        text=True,
        timeout=seconds + REMOTING_STARTUP_S + LOADGEN_GRACE_S,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"remoting producer failed ({proc.returncode}): {proc.stderr[-500:]}")
    out = json.loads(proc.stdout)
    sent = int(out["sent"])
    lat_ms = [us / 1000 for us in out["latencies_us"]]
    return {
        "client": REMOTING_CLIENT,
        "flush": V2_FLUSH,
        "message_bytes": V2_SIZE,
        "in_flight": in_flight,
        "seconds": seconds,
        "messages": sent,
        "failed": int(out["failed"]),
        "messages_per_s": sent / seconds,
        "mb_per_s": sent * V2_SIZE / seconds / 1e6,
        "p50_ms": pct(lat_ms, 0.50),
        "p99_ms": pct(lat_ms, 0.99),
        "p999_ms": pct(lat_ms, 0.999),
    }


def _remoting_cases(cluster: LocalCluster, seconds: float) -> list[dict[str, Any]]:
    """Every remoting producer case on ``cluster``, each printed as it ends."""
    cases = []
    for n in V2_IN_FLIGHT:
        case = remoting_producer_case(cluster, n, seconds)
        cases.append(case)
        if "skipped" in case:
            print(f"remoting producer: skipped ({case['skipped']})", flush=True)
            break
        print(
            f"remoting producer ({REMOTING_CLIENT}) {V2_SIZE} B x {n} in flight: "
            f"{case['messages_per_s']:,.0f} msg/s p50 {case['p50_ms']:.1f} "
            f"p99 {case['p99_ms']:.1f} ms, failed {case['failed']}",
            flush=True,
        )
    return cases


def _v2_cases(cluster: LocalCluster, seconds: float) -> list[dict[str, Any]]:
    """Every v2 producer case on ``cluster``, each printed as it ends."""
    cases = []
    for n in V2_IN_FLIGHT:
        case = v2_producer_case(cluster, n, seconds)
        cases.append(case)
        if "skipped" in case:
            print(f"v2 producer: skipped ({case['skipped']})", flush=True)
            break
        print(
            f"v2 producer ({V2_CLIENT}) {V2_SIZE} B x {n} in flight: "
            f"{case['messages_per_s']:,.0f} msg/s p50 {case['p50_ms']:.1f} "
            f"p99 {case['p99_ms']:.1f} ms, failed {case['failed']}",
            flush=True,
        )
    return cases


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mqbench", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="every part once, small (< 1 minute)")
    p.add_argument("--seconds", type=float, default=3.0, help="each produce case")
    p.add_argument("--sizes", default="128,1024,16384")
    p.add_argument("--in-flight", dest="in_flight", default="1,16,256")
    p.add_argument("--backlog", type=int, default=1_000_000)
    p.add_argument("--failovers", type=int, default=10)
    p.add_argument("--delayed", type=int, default=20_000)
    p.add_argument("--timers", type=int, default=100_000, help="pending timed messages")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument(
        "--loadgen-processes",
        type=int,
        default=LOADGEN_PROCESSES,
        help="load-generator processes per produce case",
    )
    p.add_argument(
        "--loadgen-mode",
        choices=("async", "threads"),
        default="async",
        help="async: send_async chains (default); threads: a blocking send per thread",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext groups without ACLs for every part but the security comparison "
        "(default: secure, as mqcluster up makes them)",
    )
    _add_comparison_arguments(p)
    p.add_argument(
        "--only",
        choices=("security", "metrics", "floor"),
        help="run only that on/off comparison, or only the floor (bench.floor), with "
        "--seconds and --in-flight",
    )
    p.add_argument(
        "--no-floor", action="store_true", help="skip the floor (a bare gRPC round trip)"
    )
    p.add_argument(
        "--rest-messages",
        type=int,
        default=0,
        help="also measure each node's memory at rest with this many 1 KiB messages stored, "
        "in a fresh group (issue #23 asks 1000000: about 2 minutes here); 0: skip",
    )
    p.add_argument("--out", default=str(RESULTS_DIR))
    return p


def _add_comparison_arguments(p: argparse.ArgumentParser) -> None:
    """The on/off comparisons: security, and metrics with its design."""
    p.add_argument(
        "--security-rounds",
        type=int,
        default=SECURITY_ROUNDS,
        help="rounds of the security on/off comparison "
        f"(0: skip it; at most {MAX_SECURITY_ROUNDS})",
    )
    p.add_argument(
        "--metrics-rounds",
        type=int,
        default=METRICS_PAIRS,
        help="pairs of rounds (one on, one off) of the metrics comparison per in-flight count "
        f"(0: skip it; at least 6 for a 95 %% interval; at most {MAX_METRICS_PAIRS})",
    )
    p.add_argument(
        "--metrics-design",
        choices=tuple(mc.DESIGNS),
        default="concurrent",
        help="the metrics comparison's pairs: both groups loaded in the same window "
        "(concurrent: a loaded machine's swings fall on both), or one after the other, the "
        "order alternating (alternating: ABBA)",
    )
    p.add_argument(
        "--metrics-seconds",
        type=float,
        default=METRICS_SECONDS,
        help="the measured window of each round of the metrics comparison "
        f"(after a {WARMUP_S:g} s warm-up; at most {MAX_METRICS_SECONDS:g})",
    )
    p.add_argument(
        "--metrics-scrape-interval",
        type=float,
        default=mc.SCRAPE_INTERVAL_S,
        help="seconds between scrapes of the metrics comparison's 'on' group "
        f"(default {mc.SCRAPE_INTERVAL_S:g}: the harsher case; Prometheus configurations "
        f"mostly say 15; from {mc.MIN_SCRAPE_INTERVAL_S:g} to {mc.MAX_SCRAPE_INTERVAL_S:g})",
    )
    p.add_argument(
        "--metrics-null",
        action="store_true",
        help="the metrics comparison with metrics off on both groups (A/A): the bias and "
        "spread of the design itself, to read beside an on/off run",
    )
    p.add_argument(
        "--metrics-periods",
        type=int,
        default=1,
        help="periods of the metrics comparison, each with two fresh groups, the one serving "
        "metrics swapped each period (a crossover: a group's own advantage cancels; 1, or an "
        f"even number up to {mc.MAX_PERIODS}; --metrics-rounds pairs per period)",
    )


def _smoke(a: argparse.Namespace) -> tuple[list[int], list[int]]:
    """--smoke: every part once, small."""
    a.seconds = 1.0
    a.backlog, a.failovers, a.delayed, a.no_peers = 4000, 1, 2000, True
    a.timers = 500
    a.security_rounds = min(a.security_rounds, 1)
    a.metrics_rounds = min(a.metrics_rounds, 1)
    a.metrics_seconds = min(a.metrics_seconds, SMOKE_METRICS_SECONDS)
    return [1024], [16]


def _check_args(a: argparse.Namespace, sizes: list[int], in_flight: list[int]) -> str:
    """What is wrong with the arguments ("" when nothing)."""
    if min(sizes + in_flight) <= 0 or a.seconds <= 0 or a.backlog <= 0 or a.loadgen_processes <= 0:
        return "sizes, in-flight, seconds, backlog and processes must be > 0"
    if not 0 <= a.security_rounds <= MAX_SECURITY_ROUNDS:
        return f"--security-rounds must be in [0, {MAX_SECURITY_ROUNDS}]"
    if not 0 <= a.metrics_rounds <= MAX_METRICS_PAIRS:
        return f"--metrics-rounds must be in [0, {MAX_METRICS_PAIRS}]"
    if not (a.metrics_periods == 1 or 2 <= a.metrics_periods <= mc.MAX_PERIODS) or (
        a.metrics_periods > 1 and a.metrics_periods % 2
    ):
        return f"--metrics-periods must be 1 or even, at most {mc.MAX_PERIODS}"
    if not 0 < a.metrics_seconds <= MAX_METRICS_SECONDS:
        return f"--metrics-seconds must be in (0, {MAX_METRICS_SECONDS:g}]"
    if not mc.MIN_SCRAPE_INTERVAL_S <= a.metrics_scrape_interval <= mc.MAX_SCRAPE_INTERVAL_S:
        return (
            f"--metrics-scrape-interval must be in [{mc.MIN_SCRAPE_INTERVAL_S:g}, "
            f"{mc.MAX_SCRAPE_INTERVAL_S:g}]"
        )
    if not 0 <= a.rest_messages <= MAX_REST_MESSAGES:
        return f"--rest-messages must be in [0, {MAX_REST_MESSAGES}]"
    return ""


def _run_group(
    a: argparse.Namespace,
    tmp: Path,
    flush: str,
    sizes: Sequence[int],
    in_flight: Sequence[int],
    result: dict[str, Any],
) -> None:
    """One flush mode's group: memory at rest, then every case with memory sampled."""
    with local_group(tmp, flush, secure=not a.insecure) as cluster:
        pids = _node_pids(cluster)
        mem: dict[str, Any] = {"interval_s": SAMPLE_INTERVAL_S}
        mem["at_rest"] = memory_at_rest(cluster, a.smoke)
        with MemorySampler(pids) as sampler:
            for size in sizes:
                for n in in_flight:
                    t0 = time.monotonic()
                    case = produce_case(
                        cluster, size, n, a.seconds, a.loadgen_processes, a.loadgen_mode
                    )
                    case["peak_memory_mb"] = sampler.peaks(t0, time.monotonic())
                    case["flush"] = flush
                    result["produce"].append(case)
                    print(
                        f"{flush} {size} B x {n} in flight: "
                        f"{case['messages_per_s']:,.0f} msg/s {case['mb_per_s']:.1f} MB/s "
                        f"p50 {case['p50_ms']:.1f} p99 {case['p99_ms']:.1f} ms",
                        flush=True,
                    )
            if flush == V2_FLUSH:
                result["produce_v2"] = _v2_cases(cluster, a.seconds)
                result["receive_v2"] = v2_receive_cases(cluster, a.smoke)
                result["produce_remoting"] = _remoting_cases(cluster, a.seconds)
            if flush == "SYNC_FLUSH":
                _sync_extras(a, cluster, result)
            if a.smoke and flush == REST_FLUSH:  # the at-rest case's code path, small
                result["rest_memory"] = rest_memory_case(
                    cluster, SMOKE_REST_MESSAGES, True, f"smoke: the {flush} group after its cases"
                )
        mem["peak"] = sampler.peaks()
        result.setdefault("memory", {})[flush] = mem
        # Before the failover trials, which restart nodes.
        result.setdefault("peak_rss_mb", {})[flush] = {
            n.node_id: _peak_rss_mb(cluster.pid(n)) for n in cluster.nodes
        }
        if flush == "SYNC_FLUSH":
            result["failover"] = failover_trials(cluster, a.failovers)
            print(f"failover: {result['failover']}", flush=True)


def _sync_extras(a: argparse.Namespace, cluster: LocalCluster, result: dict[str, Any]) -> None:
    """The cases run on the SYNC_FLUSH group only."""
    result["e2e"] = e2e_latency(cluster, 1.0 if a.smoke else 5.0)
    print(f"e2e: {result['e2e']}", flush=True)
    ref = max((c["messages_per_s"] for c in result["produce"]), default=0.0)
    result["delay_retry"] = delay_and_retry(cluster, a.delayed, ref)
    print(
        f"delay ratio {result['delay_retry']['delay_ratio']:.2f}, "
        f"retry ratio {result['delay_retry']['retry_ratio']:.2f}",
        flush=True,
    )
    result["backlog"] = backlog_consume(cluster, a.backlog)
    print(f"backlog: {result['backlog']}", flush=True)
    result["timer"] = timed_messages(cluster, a.timers, a.smoke)
    print(f"timer: {result['timer']}", flush=True)


def _run_all(
    a: argparse.Namespace, tmp: Path, sizes: list[int], in_flight: list[int], result: dict[str, Any]
) -> None:
    for flush in () if a.only else ("SYNC_FLUSH", "ASYNC_FLUSH"):
        _run_group(a, tmp, flush, sizes, in_flight, result)
    if a.rest_messages and not a.only and not a.smoke:
        with local_group(tmp, REST_FLUSH, secure=not a.insecure, name="rest") as cluster:
            result["rest_memory"] = rest_memory_case(
                cluster, a.rest_messages, False, "a fresh group", restart=True
            )
        print(f"memory at rest: {result['rest_memory']}", flush=True)
    if a.security_rounds and a.only in (None, "security"):
        result["security"] = security_compare(
            tmp, in_flight, a.seconds, a.loadgen_processes, a.loadgen_mode, a.security_rounds
        )
    if a.metrics_rounds and a.only in (None, "metrics"):
        result["metrics"] = metrics_compare(
            tmp,
            in_flight,
            a.metrics_seconds,
            (a.loadgen_processes, a.loadgen_mode),
            a.metrics_rounds,
            a.metrics_design,
            a.metrics_scrape_interval,
            a.metrics_null,
            a.metrics_periods,
        )
    skip = "--no-peers" if a.no_peers else f"--only {a.only}" if a.only else ""
    if skip:
        result["peers"] = {"skipped": skip}
    else:
        result["peers"] = peers(in_flight, a.seconds, a.loadgen_processes)
    if a.no_floor or a.only not in (None, "floor"):
        return
    levels = [n for n in in_flight if n in FLOOR_IN_FLIGHT] or list(FLOOR_IN_FLIGHT)
    if a.smoke:  # one load process, a short warm-up: the code path, in ~3 s
        result["floor"] = floor_cases(levels, SMOKE_FLOOR_SECONDS, 1, SMOKE_FLOOR_WARMUP_S)
    else:
        result["floor"] = floor_cases(levels, a.seconds, a.loadgen_processes)


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
        in_flight = [int(x) for x in a.in_flight.split(",")]
    except ValueError:
        print("mqbench: --sizes and --in-flight are comma-separated integers", file=sys.stderr)
        return 2
    if a.smoke:
        sizes, in_flight = _smoke(a)
    problem = _check_args(a, sizes, in_flight)
    if problem:
        print(f"mqbench: {problem}", file=sys.stderr)
        return 2
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "bench": "mqbench",
        "smoke": a.smoke,
        "started_utc": started.isoformat(),
        "host": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg_at_start": os.getloadavg(),
        },
        "conditions": "3 nodes on 127.0.0.1, majority-acknowledged sends through client.Producer "
        f"(coalescing), topic of {QUEUES} queues; SYNC_FLUSH = fdatasync before every ack "
        "(leader and followers), ASYNC_FLUSH = page cache, flushed every 500 ms; "
        + (
            "plaintext, no ACLs (--insecure)"
            if a.insecure
            else "TLS on every port, member certificates, ACLs, every call signed"
        ),
        "secure": not a.insecure,
        "produce": [],
    }
    sweep_stale()  # groups a killed run left behind (bench.sweep)
    tmp = create_work_dir("mqbench-")
    try:
        _run_all(a, tmp, sizes, in_flight, result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["finished_utc"] = datetime.now(UTC).isoformat()
    result["host"]["load_avg_at_end"] = os.getloadavg()
    from bench.report import floor_table, peer_table, ratios, write_chart, write_markdown

    result["peer_table"] = peer_table(result)
    result["floor_table"] = floor_table(result)
    result["ratios"] = ratios(result)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / started.strftime("%Y%m%dT%H%M%SZ")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = write_markdown(result, stem.with_suffix(".md"))
    write_chart(result, stem.with_suffix(".png"))
    print(md)
    print(f"wrote {stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
