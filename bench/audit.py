"""Benchmark of the Spark audit (``python -m bench.audit``).

For each entry size of ``--body-bytes`` (default 128 B, 1 KiB and 16 KiB bodies), writes one
replica's log store (``--replica-mb`` of entries) with the project's store, copies it to two
more replicas, reads every file once so that the page cache is warm, then times a first audit
and ``--repeat`` more in local mode. The SparkSession start and the start of the Python
workers (a job of empty tasks right after the session starts, as ``mqaudit`` does while it
plans) are timed once, apart. Throughput is the bytes of entries scanned over all replicas
divided by the audit's wall time. Prints a table per size and one line per size at the end,
and writes ``bench/results/audit-<UTC timestamp>.json``. Removes its stores unless
``--keep``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dledger.storage.store import FlushDiskType, SegmentedLogStore, StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIB = 1 << 20
DEFAULT_REPLICA_MB = 1024  # 3 replicas x 1 GiB of entries per size
# The three sizes: small messages, ordinary ones, a broker batch of a few dozen.
DEFAULT_BODY_BYTES = "128,1024,16384"
DEFAULT_SEGMENT_MB = 1024  # the store's default segment size
DEFAULT_REPEAT = 3
REPLICAS = ("n0", "n1", "n2")
# Entries appended per call while writing the store.
APPEND_BATCH = 256
# Distinct bodies cycled through (each entry still gets a unique prefix).
BODY_POOL = 64
READ_CHUNK_BYTES = 8 * MIB
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Bodies must hold the 8-byte unique prefix; 64 MiB is the codec's largest body.
MIN_BODY_BYTES = 9
MAX_BODY_BYTES = 64 * MIB

log = logging.getLogger("bench.audit")


def write_replica(root: Path, replica_bytes: int, body_bytes: int, segment_bytes: int) -> int:
    """One store of about ``replica_bytes`` of entries; returns its last index."""
    store_dir = root / REPLICAS[0] / f"dledger-{REPLICAS[0]}"
    config = StoreConfig(
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        preallocate=False,
        segment_size_bytes=segment_bytes,
    )
    pool = [os.urandom(body_bytes) for _ in range(BODY_POOL)]
    written = 0
    n = 0
    with SegmentedLogStore(store_dir, config) as store:
        while written < replica_bytes:
            bodies = []
            for _ in range(APPEND_BATCH):
                body = n.to_bytes(8, "big") + pool[n % BODY_POOL][8:]
                bodies.append(body)
                n += 1
            store.append_bodies(1, bodies)
            written += APPEND_BATCH * (body_bytes + 48)
        last = store.last_index()
        store.flush()
        store.write_checkpoint(last, last)
    for r in REPLICAS[1:]:
        shutil.copytree(store_dir, root / r / f"dledger-{r}", ignore=shutil.ignore_patterns("lock"))
    return last


def warm(root: Path) -> int:
    """Read every file once (page cache); returns the bytes read."""
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                while chunk := f.read(READ_CHUNK_BYTES):
                    total += len(chunk)
    return total


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 128,1024: {text[:100]!r}") from None
    if not sizes or any(not MIN_BODY_BYTES <= v <= MAX_BODY_BYTES for v in sizes):
        raise argparse.ArgumentTypeError(
            f"each size must be in {MIN_BODY_BYTES}..{MAX_BODY_BYTES}: {text[:100]!r}"
        )
    return sizes


def bench_size(
    spark: SparkSession, root: Path, args: argparse.Namespace, body_bytes: int
) -> dict[str, Any]:
    """Write the stores of one entry size, audit them ``repeat + 1`` times; the figures."""
    from spark_audit.__main__ import audit
    from spark_audit.plan import TASK_TARGET_BYTES, plan_group, sources_from_paths

    t0 = time.monotonic()
    last = write_replica(root, args.replica_mb * MIB, body_bytes, args.segment_mb * MIB)
    log.info("%d B: wrote 3 replicas of %d entries in %.1f s", body_bytes, last,
             time.monotonic() - t0)  # fmt: skip
    log.info("%d B: page cache warmed, %.0f MB read", body_bytes, warm(root) / 1e6)
    task_bytes = args.task_mb * MIB if args.task_mb else TASK_TARGET_BYTES
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat + 1):
        plans = [plan_group("bench", sources_from_paths("bench", [str(root)]))]
        t0 = time.monotonic()
        report = audit(spark, plans, task_bytes=task_bytes)
        wall = time.monotonic() - t0
        if not report.clean:
            raise SystemExit(f"bench.audit: the {body_bytes} B stores did not audit clean")
        mb = report.scanned_bytes / 1e6
        runs.append(
            {
                "run": i,
                "first": i == 0,
                "wall_s": round(wall, 3),
                "job_s": round(report.job_s, 3),
                "scanned_mb": round(mb, 1),
                "mb_per_s": round(mb / wall, 1),
                "task_cpu_s": round(report.task_cpu_s, 3),
                "mb_per_task_cpu_s": round(mb / max(report.task_cpu_s, 1e-9), 1),
                "tasks": report.tasks,
                "load_avg_1m": os.getloadavg()[0],
            }
        )
        log.info("%d B run %d%s: %.0f MB in %.2f s = %.0f MB/s (%d tasks, %.1f task CPU s, "
                 "load %.1f)", body_bytes, i, " (first)" if i == 0 else "", mb, wall, mb / wall,
                 report.tasks, report.task_cpu_s, os.getloadavg()[0])  # fmt: skip
    warm_rates = [r["mb_per_s"] for r in runs if not r["first"]]
    per_cpu = max(r["mb_per_task_cpu_s"] for r in runs if not r["first"])
    return {
        "body_bytes": body_bytes,
        "entry_bytes": body_bytes + 48,
        "entries_per_replica": last,
        "runs": runs,
        "first_run_mb_per_s": runs[0]["mb_per_s"],
        "warm_mb_per_s_min": min(warm_rates),
        "warm_mb_per_s_median": round(statistics.median(warm_rates), 1),
        "warm_mb_per_s_max": max(warm_rates),
        "warm_mb_per_task_cpu_s_best": per_cpu,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--replica-mb", type=int, default=DEFAULT_REPLICA_MB)
    p.add_argument(
        "--body-bytes",
        type=_sizes,
        default=_sizes(DEFAULT_BODY_BYTES),
        help=f"entry body sizes, comma-separated (default {DEFAULT_BODY_BYTES})",
    )
    p.add_argument("--segment-mb", type=int, default=DEFAULT_SEGMENT_MB)
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--task-mb", type=int, default=0, help="MB per task (default: the job's)")
    p.add_argument("--dir", help="where to write the stores (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the stores")
    args = p.parse_args(argv)
    if args.replica_mb <= 0 or args.repeat <= 0 or args.segment_mb <= 0 or args.task_mb < 0:
        p.error("--replica-mb, --segment-mb and --repeat must be positive")
    logging.basicConfig(level=logging.INFO, format="bench.audit: %(message)s", stream=sys.stderr)
    logging.getLogger("spark_audit").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from spark_audit.job import SessionOptions, start_session, warm_workers

    base = Path(args.dir or tempfile.mkdtemp(prefix="bench-audit-"))
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    spark = start_session(SessionOptions(master=args.master))
    session_s = time.monotonic() - t0
    sizes: list[dict[str, Any]] = []
    try:
        workers_s = warm_workers(spark)
        log.info("SparkSession started in %.1f s, Python workers in %.1f s", session_s,
                 workers_s)  # fmt: skip
        for body in args.body_bytes:
            root = base / f"body-{body}"
            try:
                sizes.append(bench_size(spark, root, args, body))
            finally:
                if not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
    finally:
        spark.stop()
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    cores = os.cpu_count() or 1
    result = {
        "bench": "audit",
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": cores,
        "load_avg_1m_at_end": os.getloadavg()[0],
        "python": platform.python_version(),
        "master": args.master,
        "replicas": len(REPLICAS),
        "replica_mb": args.replica_mb,
        "segment_mb": args.segment_mb,
        "session_start_s": round(session_s, 3),
        "workers_start_s": round(workers_s, 3),
        "sizes": sizes,
    }
    print(
        f"audit of {len(REPLICAS)} x {args.replica_mb} MiB per entry size, master {args.master}, "
        f"{cores} CPUs\n"
        f"  session start {session_s:.1f} s, Python workers start {workers_s:.1f} s (apart)\n"
        f"  {'body':>7}  {'first run':>10}  {'warm min':>9}  {'median':>7}  {'max':>7}  "
        f"{'per task CPU s':>14}  (MB/s)"
    )
    for sz in sizes:
        print(
            f"  {sz['body_bytes']:>6}B  {sz['first_run_mb_per_s']:>10.0f}  "
            f"{sz['warm_mb_per_s_min']:>9.0f}  {sz['warm_mb_per_s_median']:>7.0f}  "
            f"{sz['warm_mb_per_s_max']:>7.0f}  {sz['warm_mb_per_task_cpu_s_best']:>14.0f}"
        )
    print(f"  load average (1 min) at the end {os.getloadavg()[0]:.1f}")
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS_DIR / f"audit-{stamp}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"  written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
