"""A deep backlog (issue 36): ``python -m bench.backlog`` (``make bench-backlog``).

A fresh insecure 3-node group with a NameServer (``bench.__main__.local_group``), then:

1. **the send rate of the empty group**: ``bench.loadgen``'s closed-loop ``send_async`` chains,
   ``--probe-in-flight`` sends of ``--size`` bytes in flight for ``--probe-seconds``;
2. **the fill**: ``--messages`` messages of ``--size`` bytes stored in ``--steps`` steps, by
   ``FILL_PRODUCERS`` producers of ``FILL_THREADS_PER_PRODUCER`` threads each calling
   ``send_batch`` with ``FILL_BATCH`` messages (the client's fastest path: each producer
   coalesces its threads' batches into calls of up to 512 messages). After every step, every
   node caught up (applied what the leader committed), each node's ``RssAnon`` and ``RssFile``
   (``/proc/PID/status``), the step's peak ``RssAnon`` (sampled every 0.25 s), the step's fill
   rate and the disk the group uses;
3. **the send rate at the end**: the probe of 1. again, and its ratio to the empty group's;
4. **the restart of one node** (a follower): SIGTERM (SIGKILL after ``STOP_GRACE_S``), started
   again; **serving** means, timed from the process's start: its client port answers
   ``Metadata``, its applied index reached the commit index the group had when it was stopped
   (its state loaded), and a pull sent to that node for the last stored message of the topic's
   every queue answers ``FOUND`` (it serves reads of the whole backlog). Then the node's log is
   read for how its broker state was opened: ``broker state opened applied=N`` after loading
   its snapshot, entries applied since (the replay), or ``rebuilding broker state`` (a replay of
   the whole log);
5. **the restart of the whole group**: every node stopped and started; serving means a send is
   acknowledged and every node serves as in 4;
6. **the catch-up read**: a reader from offset 0 of every queue to its end, ``READ_THREADS``
   threads, ``PullMessage`` calls of 1,024 messages to the leader; the broker's answer is counted
   (the stored messages' bytes, and the bodies'), not decoded by a client (a Python client's
   decode would measure the client); the leader's and the reader's CPU per message read (the
   figures a loaded machine does not move, where the rate is its share of the machine);
7. **memory after the restart**: every node's ``RssAnon`` once more.

Figures per million stored messages are least-squares slopes over the steps (the first step
left out: it holds the group's start-up and the dedup window's filling, bounded costs), and the
extrapolation to ``--extrapolate-to`` messages is that line, marked as such.

Bounded: ``--messages`` at most ``MAX_MESSAGES``; the fill stops at ``--fill-seconds`` (the
steps done are kept); the disk the group would use (measured after the first step, estimated
before it) at most ``--max-disk-gb``, or it stops filling; every wait has a deadline; the group
is stopped and its files deleted at the end. Writes ``bench/results/backlog-<UTC>.json``,
``.md`` and ``.svg`` (RssAnon per node and the send rate against the stored count).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc

from bench.__main__ import QUEUES, TOPIC, local_group, produce_case
from bench.memory import MemorySampler, snapshot
from bench.sweep import create_work_dir, sweep_stale
from client import Message, MQClientError, Producer
from mqcluster.cluster import LocalCluster

RESULTS_DIR = Path(__file__).parent / "results"
DEFAULT_MESSAGES = 1_000_000
DEFAULT_SIZE = 128
# The deep backlog; past it the run is not this benchmark's any more.
MAX_MESSAGES = 30_000_000
MAX_SIZE = 64 * 1024
DEFAULT_STEPS = 10
MAX_STEPS = 200
# The fill: producers (each coalesces its own threads' batches into one call in flight to the
# leader, up to 512 messages) x threads, each sending FILL_BATCH messages a call.
FILL_PRODUCERS = 4
FILL_THREADS_PER_PRODUCER = 2
FILL_BATCH = 256
# How long the whole fill may take (the steps done by then are kept), and the machine's share.
DEFAULT_FILL_SECONDS = 600.0
MAX_FILL_SECONDS = 24 * 3600.0
# The group's files on disk (3 replicas), at most this; checked before and during the fill.
DEFAULT_MAX_DISK_GB = 10.0
# Before the first step is measured: bytes on disk per message beyond its body, per replica
# (the message's stored head ~100 B, its ConsumeQueue record 20 B, key index records 2 x 20 B,
# the log's index record and entry headers), on the generous side.
ESTIMATED_OVERHEAD_BYTES = 250
REPLICAS = 3
# Segments of the group's commitlog (docs/CONFIG.md mappedFileSizeCommitLog): smaller than
# mqbench's so that the disk a small run takes is what it stores.
SEGMENT_BYTES = 64 << 20
# The probe of the send rate, empty and at the end (bench.loadgen, async chains).
DEFAULT_PROBE_SECONDS = 5.0
DEFAULT_PROBE_IN_FLIGHT = 256
# After each step, how long every node may take to apply what the leader committed.
CATCH_UP_TIMEOUT_S = 300.0
# A stopped node gets this long to exit on SIGTERM, then SIGKILL.
STOP_GRACE_S = 30.0
# How long a restarted node (or group) may take to serve before the run says it did not.
RESTART_TIMEOUT_S = 300.0
POLL_S = 0.05
RPC_TIMEOUT_S = 2.0
READ_THREADS = QUEUES
READ_BATCH = 1024  # the broker's MAX_PULL_MSGS
# The catch-up read gives up after this long (what it read by then is reported).
READ_TIMEOUT_S = 600.0
# Log lines of a broker's open (broker.state.machine): whether it loaded a snapshot.
OPENED_LINE = re.compile(r"broker state opened applied=(\d+)")
# A log line's time (the servers' text format: asctime, local time, milliseconds).
LINE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", re.MULTILINE)
REBUILD_LINE = re.compile(r"rebuilding broker state from the commitlog reason=(.*)")
MB = 1e6
MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Arithmetic (unit tested: tests/unit/test_bench_backlog.py)


def step_targets(messages: int, steps: int) -> list[int]:
    """The stored count at the end of each step: ``steps`` near-equal steps to ``messages``,
    each a multiple of FILL_BATCH but the last."""
    assert messages > 0 and steps > 0
    steps = min(steps, max(1, messages // FILL_BATCH))
    out = []
    for i in range(1, steps + 1):
        target = messages * i // steps
        out.append(target if i == steps else max(FILL_BATCH, target // FILL_BATCH * FILL_BATCH))
    return sorted(set(out))


def slope_per_million(points: Sequence[tuple[int, float]]) -> float | None:
    """The least-squares slope of ``(stored messages, figure)`` points, per million
    messages; None with fewer than two distinct counts."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx * 1e6


def extrapolate(points: Sequence[tuple[int, float]], at: int) -> float | None:
    """The least-squares line through ``points`` at ``at`` messages (None: no line)."""
    slope = slope_per_million(points)
    if slope is None:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    return mean_y + slope * (at - mean_x) / 1e6


def fits_disk(stored: int, disk_bytes: int, target: int, limit_bytes: float) -> bool:
    """Whether ``target`` messages fit in ``limit_bytes`` at the bytes per message that
    ``stored`` messages took (``disk_bytes``, every replica)."""
    if stored <= 0:
        return True
    return disk_bytes / stored * target <= limit_bytes


def estimated_disk_bytes(messages: int, size: int) -> float:
    """The group's disk for ``messages`` of ``size`` bytes before any is measured."""
    return messages * (size + ESTIMATED_OVERHEAD_BYTES) * REPLICAS + REPLICAS * SEGMENT_BYTES


def how_opened(log_text: str) -> dict[str, Any]:
    """How a node's broker state was opened, from its log since the start: the applied index
    it opened at and whether it rebuilt (replayed the whole log) instead of loading its
    snapshot."""
    opened = OPENED_LINE.findall(log_text)
    rebuilt = REBUILD_LINE.findall(log_text)
    return {
        "opened_at_applied": int(opened[-1]) if opened else None,
        "rebuilt_from_log": bool(rebuilt),
        "rebuild_reason": rebuilt[-1].strip() if rebuilt else "",
        "loaded_snapshot": bool(opened) and not rebuilt and int(opened[-1]) > 0,
    }


def log_marks(log_text: str, started_wall_s: float) -> dict[str, float | None]:
    """From a node's log since its start (``started_wall_s``, wall clock): seconds until its
    first line (the interpreter's start and imports) and until its broker state was opened
    (the first line's time plus the open: snapshot, stores, checks)."""

    def wall(m: re.Match[str]) -> float:
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
        return t + int(m.group(2)) / 1000

    first = LINE_TIME.search(log_text)
    opened = OPENED_LINE.search(log_text)
    opened_line = None
    if opened is not None:
        before = [m for m in LINE_TIME.finditer(log_text, 0, opened.start())]
        opened_line = before[-1] if before else None
    return {
        "first_log_line_s": wall(first) - started_wall_s if first else None,
        "state_opened_s": wall(opened_line) - started_wall_s if opened_line else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ---------------------------------------------------------------------------------------------
# The group


def _pids(cluster: LocalCluster) -> dict[str, int | None]:
    return {n.node_id: cluster.pid(n) for n in cluster.nodes}


def _du_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, as ``du``)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _metadata(cluster: LocalCluster) -> dict[str, Any]:
    """Every answering node's role, commit and applied index."""
    out: dict[str, Any] = {}
    for n in cluster.nodes:
        with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(n.client_addr) as ch:
            md = dpb_grpc.DLedgerClientStub(ch).Metadata(
                dpb.MetadataRequest(), timeout=RPC_TIMEOUT_S
            )
            out[n.node_id] = md
    return out


def wait_caught_up(cluster: LocalCluster, timeout_s: float = CATCH_UP_TIMEOUT_S) -> int:
    """Until every node applied what the leader committed; the leader's commit index."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metas = _metadata(cluster)
        leaders = [m for m in metas.values() if m.role == "LEADER"]
        if len(metas) == len(cluster.nodes) and leaders:
            commit = int(leaders[0].commit_index)
            if all(m.applied_index >= commit for m in metas.values()):
                return commit
        time.sleep(POLL_S * 4)
    raise TimeoutError(f"the group did not catch up within {timeout_s:.0f} s")


def queue_ends(addr: str) -> dict[int, int]:
    """Every queue's max offset of the topic, as the node at ``addr`` answers."""
    ends = {}
    with grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.BrokerStub(ch)
        for q in range(QUEUES):
            resp = stub.GetQueueOffsets(
                pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=q), timeout=RPC_TIMEOUT_S
            )
            ends[q] = int(resp.max_offset)
    return ends


def serves_tail(addr: str, ends: Mapping[int, int]) -> bool:
    """Whether the node at ``addr`` answers FOUND for the last message of every queue."""
    try:
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            for q, end in ends.items():
                if end <= 0:
                    continue
                resp = stub.PullMessage(_pull(q, end - 1, 1), timeout=RPC_TIMEOUT_S)
                if resp.status != pb.PullStatus.FOUND:
                    return False
    except grpc.RpcError:
        return False
    return True


def _pull(queue_id: int, offset: int, count: int) -> pb.PullMessageRequest:
    return pb.PullMessageRequest(
        consumer_group="bench-backlog-read",
        topic=TOPIC,
        queue_id=queue_id,
        queue_offset=offset,
        max_msgs=count,
        subscription="*",
        no_suspend=True,
    )


# ---------------------------------------------------------------------------------------------
# The fill


class Filler:
    """FILL_PRODUCERS producers kept for the whole fill; :meth:`fill` stores ``count`` more."""

    def __init__(self, namesrv: str, size: int) -> None:
        self.body = os.urandom(size)
        self.producers = [Producer(f"bench-backlog-{i}", namesrv) for i in range(FILL_PRODUCERS)]
        self.failed_calls = 0
        self._lock = threading.Lock()

    def __enter__(self) -> Filler:
        for p in self.producers:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.producers:
            p.shutdown()

    def fill(self, count: int, deadline: float) -> int:
        """Store ``count`` messages (fewer if ``deadline`` passes); how many were stored."""
        threads = FILL_PRODUCERS * FILL_THREADS_PER_PRODUCER
        shares = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
        with ThreadPoolExecutor(threads, thread_name_prefix="fill") as pool:
            done = pool.map(
                self._send,
                [self.producers[i % FILL_PRODUCERS] for i in range(threads)],
                shares,
                [deadline] * threads,
            )
            return sum(done)

    def _send(self, producer: Producer, share: int, deadline: float) -> int:
        done = 0
        while done < share and time.monotonic() < deadline:
            n = min(FILL_BATCH, share - done)
            try:
                producer.send_batch([Message(TOPIC, self.body) for _ in range(n)])
            except MQClientError:
                with self._lock:
                    self.failed_calls += 1
                continue
            done += n
        return done


def fill_steps(
    cluster: LocalCluster, a: argparse.Namespace, sampler: MemorySampler
) -> tuple[list[dict[str, Any]], str]:
    """The fill, step by step (see the module's docstring); the steps and why it stopped
    early ("" when it did not)."""
    assert cluster.namesrv is not None
    deadline = time.monotonic() + a.fill_seconds
    limit_bytes = a.max_disk_gb * 1e9
    steps: list[dict[str, Any]] = []
    stored, stopped = 0, ""
    with Filler(cluster.namesrv.addr, a.size) as filler:
        for target in step_targets(a.messages, a.steps):
            disk = _du_bytes(cluster.base)
            if not fits_disk(stored, disk, target, limit_bytes):
                stopped = f"{target:,} messages would take more than {a.max_disk_gb:g} GB"
                break
            if time.monotonic() >= deadline:
                stopped = f"the fill reached --fill-seconds {a.fill_seconds:g}"
                break
            t0 = time.monotonic()
            sent = filler.fill(target - stored, deadline)
            t1 = time.monotonic()
            wait_caught_up(cluster)
            stored += sent
            step = _step_figures(cluster, sampler, stored, sent, t0, t1)
            step["failed_calls"] = filler.failed_calls
            steps.append(step)
            _print_step(step)
            if sent < target - (stored - sent):
                stopped = f"the fill reached --fill-seconds {a.fill_seconds:g}"
                break
    return steps, stopped


def _step_figures(
    cluster: LocalCluster,
    sampler: MemorySampler,
    stored: int,
    sent: int,
    t0: float,
    t1: float,
) -> dict[str, Any]:
    now = snapshot(_pids(cluster))
    peak = sampler.peaks(t0, time.monotonic())
    return {
        "stored": stored,
        "sent": sent,
        "seconds": t1 - t0,
        "messages_per_s": sent / (t1 - t0) if t1 > t0 else 0.0,
        "rss_anon_mb": {k: m.rss_anon_kib / 1024 for k, m in sorted(now.items())},
        "rss_file_mb": {k: m.rss_file_kib / 1024 for k, m in sorted(now.items())},
        "peak_rss_anon_mb": {k: v["rss_anon_mb"] for k, v in peak.items()},
        "disk_bytes": _du_bytes(cluster.base),
    }


def _print_step(step: Mapping[str, Any]) -> None:
    anon = ", ".join(f"{k} {v:.0f}" for k, v in step["rss_anon_mb"].items())
    print(
        f"stored {step['stored']:,}: {step['messages_per_s']:,.0f} msg/s, RssAnon MB {anon}, "
        f"disk {step['disk_bytes'] / 1e9:.2f} GB",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# Restarts


def _stop(cluster: LocalCluster, node_id: str) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE_S; returns once the process is gone."""
    n = cluster.node(node_id)
    pid = cluster.pid(n)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and cluster.pid(n) is not None:
        time.sleep(POLL_S)
    if cluster.pid(n) is not None:
        cluster.signal(node_id, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        Path(n.pid_file).unlink()


def _wait_serving(
    cluster: LocalCluster, node_id: str, commit: int, ends: Mapping[int, int], t0: float
) -> dict[str, float]:
    """Seconds from ``t0`` until node ``node_id`` answers Metadata, applied ``commit`` and
    serves the tail of every queue (each figure when first seen)."""
    n = cluster.node(node_id)
    marks: dict[str, float] = {}
    deadline = t0 + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        md = _metadata_of(n.client_addr)
        if md is not None:
            marks.setdefault("answers_s", time.monotonic() - t0)
            if md.applied_index >= commit:
                marks.setdefault("applied_s", time.monotonic() - t0)
                if serves_tail(n.client_addr, ends):
                    marks["serving_s"] = time.monotonic() - t0
                    return marks
        if cluster.exited(n) is not None:
            raise RuntimeError(f"{node_id} exited while starting: {cluster.exited(n)}")
        time.sleep(POLL_S)
    raise TimeoutError(f"{node_id} did not serve within {RESTART_TIMEOUT_S:.0f} s: {marks}")


def _metadata_of(addr: str) -> Any:
    try:
        with grpc.insecure_channel(addr) as ch:
            return dpb_grpc.DLedgerClientStub(ch).Metadata(
                dpb.MetadataRequest(), timeout=RPC_TIMEOUT_S
            )
    except grpc.RpcError:
        return None


def _log_since(cluster: LocalCluster, node_id: str, offset: int) -> str:
    with open(cluster.node(node_id).log, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def _log_size(cluster: LocalCluster, node_id: str) -> int:
    try:
        return os.path.getsize(cluster.node(node_id).log)
    except OSError:
        return 0


def restart_one(cluster: LocalCluster) -> dict[str, Any]:
    """Stop a follower and start it again; when it served (see the module's docstring)."""
    leader = cluster.wait_leader()
    node_id = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    commit = wait_caught_up(cluster)
    ends = queue_ends(cluster.node(leader).client_addr)
    _stop(cluster, node_id)
    log_at = _log_size(cluster, node_id)
    t0, wall0 = time.monotonic(), time.time()
    cluster.start(node_id)
    marks = _wait_serving(cluster, node_id, commit, ends, t0)
    text = _log_since(cluster, node_id, log_at)
    return {
        "node": node_id,
        "commit_index": commit,
        **marks,
        **log_marks(text, wall0),
        **how_opened(text),
    }


def restart_all(cluster: LocalCluster) -> dict[str, Any]:
    """Stop every node, start them all; when a send was acknowledged and each node served."""
    commit = wait_caught_up(cluster)
    ends = queue_ends(cluster.node(cluster.wait_leader()).client_addr)
    for n in cluster.nodes:
        _stop(cluster, n.node_id)
    log_at = {n.node_id: _log_size(cluster, n.node_id) for n in cluster.nodes}
    t0, wall0 = time.monotonic(), time.time()
    for n in cluster.nodes:
        cluster.start(n.node_id)
    send_s = _first_send(cluster, t0)
    per_node = {}
    for n in cluster.nodes:
        marks = _wait_serving(cluster, n.node_id, commit, ends, t0)
        text = _log_since(cluster, n.node_id, log_at[n.node_id])
        per_node[n.node_id] = {**marks, **log_marks(text, wall0), **how_opened(text)}
    serving = max(m["serving_s"] for m in per_node.values())
    return {
        "commit_index": commit,
        "first_send_s": send_s,
        "all_serving_s": serving,
        "nodes": per_node,
    }


def _first_send(cluster: LocalCluster, t0: float) -> float:
    """Seconds from ``t0`` to the first acknowledged send (the client finds the leader)."""
    assert cluster.namesrv is not None
    deadline = t0 + RESTART_TIMEOUT_S
    with Producer(
        "bench-backlog-restart", cluster.namesrv.addr, send_msg_timeout_s=RPC_TIMEOUT_S
    ) as producer:
        while time.monotonic() < deadline:
            try:
                producer.send(Message(TOPIC, b"after-restart"))
            except MQClientError:
                time.sleep(POLL_S)
                continue
            return time.monotonic() - t0
    raise TimeoutError(f"no send acknowledged within {RESTART_TIMEOUT_S:.0f} s of the restart")


# ---------------------------------------------------------------------------------------------
# The catch-up read


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user and system) process ``pid`` has used, from /proc (None: unknown)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3 (the state).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def catch_up_read(cluster: LocalCluster, size: int) -> dict[str, Any]:
    """Every queue from offset 0 to its end, READ_THREADS threads pulling READ_BATCH messages
    a call from the leader; messages, stored bytes and body bytes read, the seconds, and the
    CPU per message of the leader and of this (the reader's) process: robust figures on a
    loaded machine, where the rate is the machine's share."""
    leader = cluster.wait_leader()
    addr = cluster.node(leader).client_addr
    leader_pid = cluster.pid(cluster.node(leader))
    ends = queue_ends(addr)
    counts = [[0, 0] for _ in range(READ_THREADS)]  # messages, stored bytes
    deadline = time.monotonic() + READ_TIMEOUT_S

    def drain(i: int) -> None:
        with grpc.insecure_channel(
            addr, options=[("grpc.max_receive_message_length", 64 * MIB)]
        ) as ch:
            stub = pb_grpc.BrokerStub(ch)
            for q in range(i, QUEUES, READ_THREADS):
                offset = 0
                while offset < ends[q] and time.monotonic() < deadline:
                    resp = stub.PullMessage(_pull(q, offset, READ_BATCH), timeout=30)
                    if resp.status != pb.PullStatus.FOUND:
                        break
                    counts[i][0] += len(resp.raw_queue_offsets)
                    counts[i][1] += len(resp.raw_messages)
                    offset = int(resp.next_begin_offset)

    t0, leader_cpu0, reader_cpu0 = time.monotonic(), process_cpu_s(leader_pid), time.process_time()
    readers = [threading.Thread(target=drain, args=(i,)) for i in range(READ_THREADS)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    seconds = time.monotonic() - t0
    reader_cpu_s, leader_cpu1 = time.process_time() - reader_cpu0, process_cpu_s(leader_pid)
    messages = sum(c[0] for c in counts)
    stored = sum(c[1] for c in counts)
    leader_cpu_s = None
    if leader_cpu0 is not None and leader_cpu1 is not None:
        leader_cpu_s = leader_cpu1 - leader_cpu0
    return {
        "leader_cpu_us_per_message": leader_cpu_s / messages * 1e6
        if leader_cpu_s is not None and messages
        else None,
        "reader_cpu_us_per_message": reader_cpu_s / messages * 1e6 if messages else None,
        "messages": messages,
        "expected": sum(ends.values()),
        "seconds": seconds,
        "messages_per_s": messages / seconds if seconds else 0.0,
        "stored_mb_per_s": stored / seconds / MB if seconds else 0.0,
        "body_mb_per_s": messages * size / seconds / MB if seconds else 0.0,
        "threads": READ_THREADS,
        "batch": READ_BATCH,
    }


# ---------------------------------------------------------------------------------------------
# The run


def growth(steps: Sequence[Mapping[str, Any]], target: int) -> dict[str, Any]:
    """Per node: RssAnon per million stored (the steps after the first), and the line at
    ``target``; the send rate's and the disk's per million likewise."""
    later = list(steps[1:]) if len(steps) > 2 else list(steps)
    nodes = sorted({k for s in steps for k in s["rss_anon_mb"]})
    per_node = {}
    for node in nodes:
        pts = [(s["stored"], s["rss_anon_mb"][node]) for s in later if node in s["rss_anon_mb"]]
        per_node[node] = {
            "rss_anon_mb_per_million": slope_per_million(pts),
            "rss_anon_mb_at_target": extrapolate(pts, target),
        }
    disk = [(s["stored"], float(s["disk_bytes"])) for s in later]
    rate = [(s["stored"], float(s["messages_per_s"])) for s in later]
    return {
        "target_messages": target,
        "per_node": per_node,
        "disk_gb_per_million": (slope_per_million(disk) or 0.0) / 1e9,
        "disk_gb_at_target": (extrapolate(disk, target) or 0.0) / 1e9,
        "fill_rate_per_million": slope_per_million(rate),
    }


def run(a: argparse.Namespace, base: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"args": vars(a), "started": datetime.now(UTC).isoformat()}
    envs = parse_node_env(a.node_env)
    group = local_group(
        base, a.flush, secure=False, name="backlog", metrics=False, env_of_node=envs
    )
    with group as cluster:
        with MemorySampler(_pids(cluster)) as sampler:
            result["memory_empty"] = _anon(cluster)
            result["probe_empty"] = produce_case(
                cluster, a.size, a.probe_in_flight, a.probe_seconds
            )
            print(f"empty group: {result['probe_empty']['messages_per_s']:,.0f} msg/s", flush=True)
            result["steps"], result["fill_stopped"] = fill_steps(cluster, a, sampler)
            result["probe_end"] = produce_case(cluster, a.size, a.probe_in_flight, a.probe_seconds)
        result["end_over_empty"] = ratio(
            result["probe_end"]["messages_per_s"], result["probe_empty"]["messages_per_s"]
        )
        print(
            f"at the end: {result['probe_end']['messages_per_s']:,.0f} msg/s "
            f"({_num(result['end_over_empty'], 2)}x the empty group's)",
            flush=True,
        )
        result["restart_one"] = restart_one(cluster)
        print(f"restart of one node: {result['restart_one']}", flush=True)
        result["memory_after_restart_one"] = _anon(cluster)
        result["restart_all"] = restart_all(cluster)
        print(f"restart of the group: {result['restart_all']}", flush=True)
        result["memory_after_restart_all"] = _anon(cluster)
        result["read"] = catch_up_read(cluster, a.size)
        print(f"catch-up read: {result['read']}", flush=True)
    result["growth"] = growth(result["steps"], a.extrapolate_to)
    result["finished"] = datetime.now(UTC).isoformat()
    return result


def _anon(cluster: LocalCluster) -> dict[str, float]:
    return {k: m.rss_anon_kib / 1024 for k, m in sorted(snapshot(_pids(cluster)).items())}


# ---------------------------------------------------------------------------------------------
# Report


def markdown(r: Mapping[str, Any]) -> str:
    a = r["args"]
    lines = [
        f"# A deep backlog ({r['started'][:19]}Z)",
        "",
        f"{a['messages']:,} messages of {a['size']} B asked, {a['flush']}, 3 nodes on 127.0.0.1 "
        f"(plaintext), {platform.node()}, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in r.get('load_avg', ()))}."
        + (f" The fill stopped early: {r['fill_stopped']}." if r["fill_stopped"] else ""),
        "",
        "| stored | fill msg/s | RssAnon MB per node | peak RssAnon MB | RssFile MB | disk GB |",
        "| ---: | ---: | --- | --- | --- | ---: |",
    ]
    for s in r["steps"]:
        lines.append(
            f"| {s['stored']:,} | {s['messages_per_s']:,.0f} | {_per_node(s['rss_anon_mb'])} | "
            f"{_per_node(s['peak_rss_anon_mb'])} | {_per_node(s['rss_file_mb'])} | "
            f"{s['disk_bytes'] / 1e9:.2f} |"
        )
    g = r["growth"]
    lines += ["", "## Growth per million stored (least squares over the steps after the first)", ""]
    for node, f in g["per_node"].items():
        lines.append(
            f"- {node}: RssAnon {_num(f['rss_anon_mb_per_million'])} MB per million; "
            f"at {g['target_messages']:,} (extrapolated): {_num(f['rss_anon_mb_at_target'])} MB"
        )
    lines.append(
        f"- disk (3 replicas): {g['disk_gb_per_million']:.2f} GB per million; at "
        f"{g['target_messages']:,} (extrapolated): {g['disk_gb_at_target']:.1f} GB"
    )
    e, f = r["probe_empty"], r["probe_end"]
    one, every, rd = r["restart_one"], r["restart_all"], r["read"]
    lines += [
        "",
        "## Send rate, restarts, catch-up read",
        "",
        f"- send rate ({a['size']} B x {a['probe_in_flight']} in flight, "
        f"{a['probe_seconds']:g} s): "
        f"empty {e['messages_per_s']:,.0f} msg/s, at the end {f['messages_per_s']:,.0f} msg/s: "
        f"**{_num(r['end_over_empty'], 2)}x**",
        f"- restart of one node ({one['node']}): answers {_num(one.get('answers_s'), 1)} s, "
        f"applied the commit index {_num(one.get('applied_s'), 1)} s, **serving "
        f"{_num(one.get('serving_s'), 1)} s** (its first log line at "
        f"{_num(one.get('first_log_line_s'), 1)} s: the interpreter and imports; its state "
        f"opened at {_num(one.get('state_opened_s'), 1)} s); {_opened(one)}",
        f"- restart of the group: first send acknowledged {_num(every['first_send_s'], 1)} s, "
        f"every node serving **{_num(every['all_serving_s'], 1)} s**; "
        + "; ".join(
            f"{k}: first log line {_num(v.get('first_log_line_s'), 1)} s, state opened "
            f"{_num(v.get('state_opened_s'), 1)} s, {_opened(v)}"
            for k, v in every["nodes"].items()
        ),
        f"- catch-up read: {rd['messages']:,} of {rd['expected']:,} messages in "
        f"{rd['seconds']:.1f} s: {rd['messages_per_s']:,.0f} msg/s, **{rd['stored_mb_per_s']:.1f} "
        f"MB/s stored** ({rd['body_mb_per_s']:.1f} MB/s of bodies); CPU per message: the "
        f"leader {_num(rd.get('leader_cpu_us_per_message'), 2)} us, the reader "
        f"{_num(rd.get('reader_cpu_us_per_message'), 2)} us",
        f"- RssAnon MB: empty {_per_node(r['memory_empty'])}; after the restart of one node "
        f"{_per_node(r['memory_after_restart_one'])}; after the group's "
        f"{_per_node(r['memory_after_restart_all'])}",
        "",
    ]
    return "\n".join(lines)


def _opened(f: Mapping[str, Any]) -> str:
    if f.get("rebuilt_from_log"):
        return f"replayed the whole log ({f['rebuild_reason']})"
    if f.get("loaded_snapshot"):
        return f"loaded its snapshot at applied index {f['opened_at_applied']:,}"
    return "opened an empty state"


def _per_node(values: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in values.items())


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def plot_svg(r: Mapping[str, Any], path: Path) -> None:
    """RssAnon per node and the fill's send rate against the stored count (matplotlib, which
    the bench extras install; bench.report draws mqbench's chart with it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = r["steps"]
    x = [s["stored"] / 1e6 for s in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for node in sorted({k for s in steps for k in s["rss_anon_mb"]}):
        top.plot(x, [s["rss_anon_mb"].get(node, 0) for s in steps], marker="o", label=node)
    top.axhline(256, color="grey", linestyle="--", linewidth=1, label="target 256 MB")
    top.set_ylabel("RssAnon per node (MB)")
    top.legend(fontsize=8)
    bottom.plot(x, [s["messages_per_s"] for s in steps], marker="o", label="fill (send_batch)")
    probes = [(0.0, r["probe_empty"]), (x[-1] if x else 0.0, r["probe_end"])]
    bottom.plot(
        [p[0] for p in probes],
        [p[1]["messages_per_s"] for p in probes],
        marker="s",
        linestyle=":",
        label=f"probe ({r['args']['probe_in_flight']} in flight)",
    )
    bottom.set_ylabel("send rate (msg/s)")
    bottom.set_xlabel(f"stored messages (millions of {r['args']['size']} B)")
    bottom.legend(fontsize=8)
    fig.suptitle("raftmq, a deep backlog")
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def write(r: Mapping[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"backlog-{stamp}.json"
    path.write_text(json.dumps(r, indent=1, default=str))
    path.with_suffix(".md").write_text(markdown(r))
    plot_svg(r, path.with_suffix(".svg"))
    return path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__)
    p.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    p.add_argument("--size", type=int, default=DEFAULT_SIZE, help="message body bytes")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--fill-seconds", type=float, default=DEFAULT_FILL_SECONDS)
    p.add_argument("--max-disk-gb", type=float, default=DEFAULT_MAX_DISK_GB)
    p.add_argument("--probe-seconds", type=float, default=DEFAULT_PROBE_SECONDS)
    p.add_argument("--probe-in-flight", type=int, default=DEFAULT_PROBE_IN_FLIGHT)
    p.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    p.add_argument(
        "--extrapolate-to", type=int, default=MAX_MESSAGES, help="the line's stored count"
    )
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--work", default=None, help="where the group's files go (a temp dir)")
    p.add_argument(
        "--node-env",
        action="append",
        default=[],
        metavar="NODE:KEY=VALUE",
        help="extra environment of one broker (n0, n1 or n2), at each of its starts; repeat "
        "for more. E.g. heaptrack's preload library and DUMP_HEAPTRACK_OUTPUT on one node "
        "(docs/PERFORMANCE.md, 'A deep backlog')",
    )
    return p


# The group local_group starts (bench.__main__): --node-env names one of these.
NODE_IDS = ("n0", "n1", "n2")


def parse_node_env(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``NODE:KEY=VALUE`` items -> node -> environment; ValueError naming the bad item."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        node, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not sep or not eq or node not in NODE_IDS or not key:
            raise ValueError(
                f"--node-env {item[:100]!r} is not NODE:KEY=VALUE"
                f" with NODE in {', '.join(NODE_IDS)}"
            )
        out.setdefault(node, {})[key] = value
    return out


def check_args(a: argparse.Namespace) -> str:
    """Why the arguments cannot run ("" when they can)."""
    if not 0 < a.messages <= MAX_MESSAGES:
        return f"--messages must be in [1, {MAX_MESSAGES:,}]"
    if not 0 < a.size <= MAX_SIZE:
        return f"--size must be in [1, {MAX_SIZE}]"
    if not 0 < a.steps <= MAX_STEPS:
        return f"--steps must be in [1, {MAX_STEPS}]"
    if not 0 < a.fill_seconds <= MAX_FILL_SECONDS:
        return f"--fill-seconds must be in (0, {MAX_FILL_SECONDS:g}]"
    if not 0 < a.probe_seconds <= 60 or not 0 < a.probe_in_flight <= 4096:
        return "--probe-seconds must be in (0, 60] and --probe-in-flight in [1, 4096]"
    if a.max_disk_gb <= 0:
        return "--max-disk-gb must be positive"
    try:
        parse_node_env(a.node_env)
    except ValueError as e:
        return str(e)
    return ""


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    problem = check_args(a)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    sweep_stale(a.work)  # groups a killed run left behind (bench.sweep)
    work = create_work_dir("raftmq-backlog-", a.work)
    need = estimated_disk_bytes(a.messages, a.size)
    free = shutil.disk_usage(work).free
    if need > min(a.max_disk_gb * 1e9, free * 0.8):
        print(
            f"{a.messages:,} x {a.size} B would take about {need / 1e9:.1f} GB "
            f"(--max-disk-gb {a.max_disk_gb:g}, {free / 1e9:.1f} GB free): the fill stops at "
            "the limit",
            file=sys.stderr,
        )
    cwd = os.getcwd()
    try:
        result = run(a, work)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    result["load_avg"] = os.getloadavg()
    path = write(result, Path(a.out))
    print(f"wrote {path} (.md, .svg)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
