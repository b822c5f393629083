"""``mqjepsen`` / ``python -m jepsen_like``: a Jepsen-style test of a local raftmq group.

    mqjepsen run [--nodes 3] [--time-limit 60] [--nemesis partition,kill,pause] [--seed S]
                 [--workload queue|log] [--net proxy|netns] [--insecure] [--dir RUN_DIR] ...
    mqjepsen check RUN_DIR        re-run the checkers on a run's history and final state
    mqjepsen netns-clean [--force] remove namespaces/veths/bridges left by dead netns runs

Exit codes: 0 every checker passed, 1 a checker failed (or the run could not be done),
2 bad usage. See docs/JEPSEN.md for how to read the report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from jepsen_like.checker import NodeState, check_all
from jepsen_like.history import load_history
from jepsen_like.nemesis import (
    SHAPING_NEMESES,
    parse_nemeses,
    parse_shapes,
    parse_storage_faults,
)
from jepsen_like.netns import NetnsError, check_netns, clean_leftovers
from jepsen_like.report import verdict_table
from jepsen_like.run import RunConfig, run
from mqcli import parse_assignments

logger = logging.getLogger("jepsen_like")
# Records for jepsen.log only (not under "jepsen_like", whose records also go to stderr).
_trace = logging.getLogger("mqjepsen.trace")

# Bounds of the command-line values (a run needs time for at least one fault and its heal).
MIN_TIME_LIMIT_S = 5.0
MAX_TIME_LIMIT_S = 24 * 3600.0
ALLOWED_NODES = (3, 5, 7)
# --faults at most: a day's schedule at one fault a second.
MAX_FAULTS = 86_400
DEFAULT_RUNS_DIR = "jepsen-runs"
# Share of the time limit kept free of faults at the end (at most QUIET_MAX_S).
QUIET_SHARE = 0.2
QUIET_MAX_S = 15.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mqjepsen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="start a group, attack it, check the history")
    r.add_argument("--nodes", type=int, default=3, help="group size: 3, 5 or 7")
    r.add_argument("--time-limit", type=float, default=60.0, help="seconds of workload")
    r.add_argument(
        "--nemesis",
        default="partition,kill,pause",
        help="comma list of partition,kill,pause,disk,latency,bandwidth,rolling,membership,"
        "storage; all; none",
    )
    r.add_argument("--partitions", default="all", help="partition shapes to draw from")
    r.add_argument(
        "--storage-faults",
        default="all",
        help="what the storage nemesis does: comma list of bitflip,truncate,rollback,hardstate,"
        "derived; all",
    )
    r.add_argument("--interval", type=float, default=5.0, help="seconds per fault and per heal")
    r.add_argument(
        "--faults",
        type=int,
        default=0,
        help="end after this many faults and the quiet period (0: as many as the time allows)",
    )
    r.add_argument("--quiet", type=float, default=None, help="fault-free seconds at the end")
    r.add_argument("--seed", type=int, default=None, help="schedule seed (default: random)")
    r.add_argument("--workload", choices=["queue", "log"], default="queue")
    r.add_argument("--writers", type=int, default=4, help="producer/appender threads")
    r.add_argument("--readers", type=int, default=2, help="consumer threads (queue workload)")
    r.add_argument("--queues", type=int, default=4, help="queues of the topic (queue workload)")
    r.add_argument("--rate", type=float, default=40.0, help="writes per second per writer")
    r.add_argument("--max-duplicates", type=int, default=0, help="duplicates tolerated")
    r.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra broker.conf key"
    )
    r.add_argument(
        "--unsafe-ack",
        action="store_true",
        help="TEST ONLY: nodes acknowledge before majority replication (the checker must fail)",
    )
    r.add_argument(
        "--net",
        choices=["proxy", "netns"],
        default="proxy",
        help="network faults: TCP proxies (default) or namespaces + iptables (root)",
    )
    r.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext group, no certificates, no ACLs (default: secure, as mqcluster up)",
    )
    r.add_argument("--dir", default=None, help=f"run directory (default {DEFAULT_RUNS_DIR}/...)")
    r.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    c = sub.add_parser("check", help="re-check a run directory")
    c.add_argument("run_dir")
    c.add_argument("--max-duplicates", type=int, default=0)
    k = sub.add_parser(
        "netns-clean", help="remove what crashed `--net netns` runs left (namespaces, links)"
    )
    k.add_argument(
        "--force", action="store_true", help="also the runs whose recorded pid is still alive"
    )
    return p


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _setup_logging(out_dir: Path, verbose: bool) -> Callable[[], None]:
    """Log everything to ``jepsen.log`` and the harness's own records to stderr; returns the
    undo (a test may call :func:`main` several times in one process)."""
    root = logging.getLogger()
    old_level = root.level
    root.setLevel(logging.INFO)
    fh = logging.FileHandler(out_dir / "jepsen.log")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(fh)
    # stderr gets the harness's own records only: client retries are expected under faults
    # (they are in the history and in jepsen.log).
    sh = logging.StreamHandler(sys.stderr)
    sh.setLevel(logging.INFO if verbose else logging.ERROR)
    sh.setFormatter(logging.Formatter("mqjepsen: %(message)s"))
    logger.addHandler(sh)

    def undo() -> None:
        logger.removeHandler(sh)
        root.removeHandler(fh)
        fh.close()
        root.setLevel(old_level)

    return undo


def _check_run_args(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The run's numbers in their ranges (parser.error, exit 2, otherwise)."""
    if ns.nodes not in ALLOWED_NODES:
        parser.error(f"--nodes must be one of {ALLOWED_NODES}")
    if not MIN_TIME_LIMIT_S <= ns.time_limit <= MAX_TIME_LIMIT_S:
        parser.error(f"--time-limit must be in [{MIN_TIME_LIMIT_S}, {MAX_TIME_LIMIT_S}] s")
    if ns.interval <= 0 or ns.writers < 1 or ns.readers < 1 or ns.queues < 1 or ns.rate <= 0:
        parser.error("--interval, --writers, --readers, --queues and --rate must be positive")
    if not 0 <= ns.faults <= MAX_FAULTS:
        parser.error(f"--faults must be in [0, {MAX_FAULTS}]")
    if ns.unsafe_ack and ns.workload != "log":
        # The broker's writes need the applied result of their entry, which an early ack
        # does not wait for: the queue workload could not even create its topic.
        parser.error("--unsafe-ack needs --workload log")


def _cmd_run(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_run_args(ns, parser)
    try:
        nemeses = parse_nemeses(ns.nemesis)
        shapes = parse_shapes(ns.partitions)
        storage_faults = parse_storage_faults(ns.storage_faults)
        conf = parse_assignments(ns.set)
    except ValueError as exc:
        parser.error(str(exc))
    quiet = ns.quiet if ns.quiet is not None else min(QUIET_MAX_S, ns.time_limit * QUIET_SHARE)
    if not 0 <= quiet < ns.time_limit:
        parser.error("--quiet must be in [0, --time-limit)")
    if ns.net == "netns":
        reason = check_netns()
        if reason:
            print(f"mqjepsen: --net netns: {reason}", file=sys.stderr)
            return 2
    seed = ns.seed if ns.seed is not None else random.randrange(1 << 31)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = Path(ns.dir) if ns.dir else Path(DEFAULT_RUNS_DIR) / f"{stamp}-seed{seed}"
    if out_dir.exists() and any(out_dir.iterdir()):
        parser.error(f"--dir {out_dir} exists and is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    undo_logging = _setup_logging(out_dir, ns.verbose)
    cfg = RunConfig(
        nodes=ns.nodes,
        time_limit_s=ns.time_limit,
        nemeses=tuple(nemeses),
        partition_shapes=tuple(shapes),
        storage_faults=tuple(storage_faults),
        max_faults=ns.faults,
        interval_s=ns.interval,
        quiet_s=quiet,
        seed=seed,
        workload=ns.workload,
        writers=ns.writers,
        readers=ns.readers,
        queues=ns.queues,
        rate_hz=ns.rate,
        unsafe_ack=ns.unsafe_ack,
        max_duplicates=ns.max_duplicates,
        broker_conf=conf,
        net=ns.net,
        secure=not ns.insecure,
    )
    print(
        f"mqjepsen: seed {seed}, {ns.nodes} nodes, {ns.workload} workload, "
        f"nemesis {','.join(nemeses) or 'none'}, {ns.time_limit:.0f} s, {ns.net} network, "
        f"{'insecure' if ns.insecure else 'secure (TLS, ACLs)'}; "
        f"run dir {out_dir}",
        flush=True,
    )
    skipped = [k for k in nemeses if k in SHAPING_NEMESES]
    if ns.net == "netns" and skipped:
        print(f"mqjepsen: note: --net netns skips {','.join(skipped)} (proxy only)", flush=True)
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = run(cfg, out_dir)
    except KeyboardInterrupt:
        print("mqjepsen: interrupted; the group was torn down", file=sys.stderr)
        return 1
    except Exception as exc:
        _trace.error("run failed", exc_info=True)  # jepsen.log only; stderr gets one line
        print(f"mqjepsen: run failed: {exc} (see {out_dir}/jepsen.log)", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, old)
        undo_logging()
    print(verdict_table(outcome.results))
    counts = outcome.summary["op_counts"]
    print(f"ops: {json.dumps(counts)}")
    print(f"report: {out_dir / 'index.html'}")
    return 0 if outcome.valid else 1


def _cmd_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    run_dir = Path(ns.run_dir)
    try:
        ops = load_history(run_dir / "history.jsonl")
    except (OSError, ValueError) as exc:
        print(f"mqjepsen: {exc}", file=sys.stderr)
        return 2
    nodes: list[NodeState] | None = None
    convergence = ""
    final = run_dir / "final-state.json"
    if final.exists():
        try:
            state = json.loads(final.read_text())
            nodes = [NodeState.from_dict(d) for d in state["nodes"]] or None
            convergence = str(state.get("convergence", ""))
        except (ValueError, KeyError, TypeError) as exc:
            print(f"mqjepsen: {final}: not a final state file: {exc}", file=sys.stderr)
            return 2
    results = check_all(ops, nodes, ns.max_duplicates, convergence)
    print(verdict_table(results))
    return 0 if all(r.valid for r in results) else 1


def _cmd_netns_clean(ns: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("mqjepsen: netns-clean needs root", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="mqjepsen: %(message)s")
    try:
        removed, errors = clean_leftovers(force=ns.force)
    except NetnsError as exc:
        print(f"mqjepsen: {exc}", file=sys.stderr)
        return 1
    for name in removed:
        print(f"removed {name}")
    for err in errors:
        print(f"mqjepsen: {err}", file=sys.stderr)
    if not removed and not errors:
        print("nothing to clean")
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if ns.cmd == "run":
            return _cmd_run(ns, parser)
        if ns.cmd == "netns-clean":
            return _cmd_netns_clean(ns)
        return _cmd_check(ns, parser)
    except SystemExit as exc:  # parser.error: bad usage
        return int(exc.code or 0)


if __name__ == "__main__":
    sys.exit(main())
