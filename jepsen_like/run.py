"""One test run: cluster up, workload + monitor + nemesis for the time limit, heal, quiet
period, convergence, final drain, replica state, teardown, checkers, report."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jepsen_like.checker import CheckResult, NodeState, check_all
from jepsen_like.cluster import JepsenCluster
from jepsen_like.history import History
from jepsen_like.nemesis import (
    BROKER_STORAGE_FAULTS,
    PARTITION_SHAPES,
    SHAPING_NEMESES,
    STORAGE_FAULTS,
    Nemesis,
)
from jepsen_like.netns import NetnsNet
from jepsen_like.proxy import ProxyNet
from jepsen_like.report import fault_windows, op_counts, plot, verdict_table, write_html
from jepsen_like.workloads import (
    DRAIN_S,
    LogWorkload,
    Monitor,
    QueueWorkload,
    Workload,
    converge,
    node_states,
)

logger = logging.getLogger(__name__)

# Seconds every node gets after heal to hold the leader's whole log, committed and applied.
CONVERGE_S = 60.0
# Seconds the nemesis thread gets to finish its current step when the run ends.
NEMESIS_STOP_S = 30.0
# Seconds between checks of the run clock in the main thread.
MAIN_POLL_S = 0.2
# Commitlog segments of a run with the storage nemesis (unless --set mappedFileSizeCommitLog):
# small, so that a minute of load fills several and damage lands in older segments too,
# which only the scrubber or a read finds (the open scans the last one or two).
STORAGE_SEGMENT_BYTES = 128 << 10


@dataclass(frozen=True, slots=True)
class RunConfig:
    nodes: int = 3
    time_limit_s: float = 60.0
    nemeses: tuple[str, ...] = ("partition", "kill", "pause")
    partition_shapes: tuple[str, ...] = PARTITION_SHAPES
    storage_faults: tuple[str, ...] = STORAGE_FAULTS
    max_faults: int = 0  # end after this many faults and the quiet period (0: the time limit)
    interval_s: float = 5.0
    quiet_s: float = 10.0
    seed: int = 0
    workload: str = "queue"
    writers: int = 4
    readers: int = 2
    queues: int = 4
    rate_hz: float = 40.0
    unsafe_ack: bool = False
    max_duplicates: int = 0
    broker_conf: dict[str, str] = field(default_factory=dict)
    net: str = "proxy"  # "proxy" (TCP proxies) or "netns" (namespaces + iptables, root)
    secure: bool = True  # TLS, member certificates, ACLs (as `mqcluster up`); False: plaintext


@dataclass(slots=True)
class RunOutcome:
    valid: bool
    results: list[CheckResult]
    out_dir: Path
    summary: dict[str, Any]


def _plan(
    cfg: RunConfig, netns: bool, events: list[str]
) -> tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]:
    """The nemeses this run can use (the netns backend only cuts links), the broker.conf
    keys the nodes get, and the storage faults it applies (those on the broker's files only
    with the queue workload); what is skipped goes to ``events``."""
    kinds = cfg.nemeses
    if netns:
        skipped = [k for k in kinds if k in SHAPING_NEMESES]
        kinds = tuple(k for k in kinds if k not in SHAPING_NEMESES)
        if skipped:
            note = f"nemeses {','.join(skipped)} skipped: the netns backend only cuts links"
            logger.warning(note)
            events.append(note)
    extra = dict(cfg.broker_conf)
    if cfg.unsafe_ack:
        extra["unsafeAckBeforeReplication"] = "true"
    storage_faults = cfg.storage_faults
    if "storage" in kinds:
        extra.setdefault("mappedFileSizeCommitLog", str(STORAGE_SEGMENT_BYTES))
        if cfg.workload != "queue":
            storage_faults = tuple(f for f in storage_faults if f not in BROKER_STORAGE_FAULTS)
            if storage_faults != cfg.storage_faults:
                events.append("storage faults on the broker's files skipped: log workload")
        if not storage_faults:
            kinds = tuple(k for k in kinds if k != "storage")
    return kinds, extra, storage_faults


def _teardown(steps: list[Callable[[], None]]) -> None:
    """Every step runs even if an earlier one fails: no node may outlive the run. A Ctrl-C
    during teardown finishes it, then stops."""
    interrupted: BaseException | None = None
    for step in steps:
        try:
            step()
        except Exception:
            logger.exception("teardown step failed")
        except BaseException as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def run(cfg: RunConfig, out_dir: Path) -> RunOutcome:
    out_dir.mkdir(parents=True, exist_ok=True)
    history = History(out_dir / "history.jsonl")
    net: ProxyNet | NetnsNet = (
        NetnsNet((out_dir / "cluster").resolve()) if cfg.net == "netns" else ProxyNet(cfg.seed)
    )
    events: list[str] = []
    kinds, extra, storage_faults = _plan(cfg, isinstance(net, NetnsNet), events)
    cluster = JepsenCluster(out_dir / "cluster", cfg.nodes, net, extra, cfg.secure)
    workload: Workload
    if cfg.workload == "queue":
        workload = QueueWorkload(
            cluster, history, cfg.writers, cfg.readers, cfg.queues, cfg.rate_hz
        )
    else:
        workload = LogWorkload(cluster, history, cfg.writers, cfg.rate_hz)
    monitor = Monitor(cluster, history)
    nemesis = Nemesis(
        cluster,
        history,
        kinds,
        cfg.seed,
        cfg.interval_s,
        cfg.partition_shapes,
        storage_faults,
        cfg.max_faults,
    )
    nodes: list[NodeState] | None = None
    convergence = "the run stopped before the nodes were read"
    timing: dict[str, float] = {}
    started = time.monotonic()
    try:
        net.start()  # inside the try: a netns run removes what it created on any failure
        if isinstance(net, NetnsNet):
            events.append(f"netns backend: run id {net.run_id}, bridge {net.bridge} {net.subnet}")
        cluster.setup()
        leader = cluster.up()
        events.append(f"group up, first leader {leader}")
        workload.setup()
        timing["setup_s"] = time.monotonic() - started
        t0 = time.monotonic()
        end = t0 + cfg.time_limit_s
        monitor.start()
        workload.start()
        nemesis.start(end - cfg.quiet_s)
        while time.monotonic() < end:
            if nemesis.finished_at is not None:  # --faults N were done: the quiet end
                end = min(end, nemesis.finished_at + cfg.quiet_s)
            time.sleep(MAIN_POLL_S)
        nemesis.stop(NEMESIS_STOP_S)
        nemesis.heal_all()
        workload.stop()
        timing["workload_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        why = converge(cluster, CONVERGE_S)
        if why:
            events.append(f"not converged within {CONVERGE_S:.0f} s: {why}")
        timing["converge_s"] = time.monotonic() - t1
        t2 = time.monotonic()
        workload.drain(time.monotonic() + DRAIN_S)
        # again: the drain's consumers commit offsets (entries) while the nodes are read
        convergence = converge(cluster, CONVERGE_S)
        nodes = node_states(cluster, workload)
        timing["drain_s"] = time.monotonic() - t2
        monitor.stop()
    finally:
        t3 = time.monotonic()
        _teardown(
            [
                lambda: nemesis.stop(NEMESIS_STOP_S),
                workload.stop,
                monitor.stop,
                cluster.teardown,
                net.stop,
                history.close,
            ]
        )
        timing["teardown_s"] = time.monotonic() - t3
    ops = history.ops()
    results = check_all(ops, nodes, cfg.max_duplicates, convergence)
    valid = all(r.valid for r in results)
    (out_dir / "final-state.json").write_text(
        json.dumps(
            {"convergence": convergence, "nodes": [asdict(n) for n in nodes or []]},
            separators=(",", ":"),
        )
    )
    end_s = max((op.time for op in ops), default=0.0)
    summary: dict[str, Any] = {
        "valid": valid,
        "config": {**asdict(cfg), "out_dir": str(out_dir)},
        "checks": [r.to_dict() for r in results],
        "op_counts": op_counts(ops),
        "faults": [
            {"kind": k, "start_s": s, "end_s": e, "detail": d}
            for k, s, e, d in fault_windows(ops, end_s)
        ],
        "events": events + cluster.events + [f"nemesis error: {x}" for x in nemesis.errors],
        "refused_starts": nemesis.refusals,
        "network": net.describe() if isinstance(net, NetnsNet) else {"backend": "proxy"},
        ("netns_links" if isinstance(net, NetnsNet) else "proxy_links"): net.stats(),
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
    }
    t4 = time.monotonic()
    plots = plot(ops, out_dir)
    summary["timing_s"]["report_s"] = round(time.monotonic() - t4, 2)
    summary["timing_s"]["total_s"] = round(time.monotonic() - started, 2)
    (out_dir / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    write_html(out_dir, summary, plots)
    (out_dir / "verdict.txt").write_text(verdict_table(results) + "\n")
    return RunOutcome(valid, results, out_dir, summary)
