"""Benchmark of the Spark audit (``python -m bench.audit``).

Writes one replica's log store (default 1 GiB of segments, entries of ``--body-bytes``)
with the project's store, copies it to two more replicas, reads every file once so that the
page cache is warm, then times: the SparkSession start (reported apart), a first audit (it
also starts the Python workers) and ``--repeat`` more audits in local mode. Throughput is the
bytes of entries scanned over all replicas divided by the job's wall time. Prints a table and
writes ``bench/results/audit-<UTC timestamp>.json``. Removes its temp dir unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dledger.storage.store import FlushDiskType, SegmentedLogStore, StoreConfig

MIB = 1 << 20
DEFAULT_REPLICA_MB = 1024  # the size: 3 replicas x 1 GiB of segments
DEFAULT_BODY_BYTES = 16 * 1024  # a broker batch of a few dozen 1 KiB-ish messages
DEFAULT_REPEAT = 3
REPLICAS = ("n0", "n1", "n2")
# Entries appended per call while writing the store.
APPEND_BATCH = 256
# Distinct bodies cycled through (each entry still gets a unique prefix).
BODY_POOL = 64
READ_CHUNK_BYTES = 8 * MIB
RESULTS_DIR = Path(__file__).resolve().parent / "results"

log = logging.getLogger("bench.audit")


def write_replica(root: Path, replica_bytes: int, body_bytes: int) -> int:
    """One store of about ``replica_bytes`` of entries; returns its last index."""
    store_dir = root / REPLICAS[0] / f"dledger-{REPLICAS[0]}"
    config = StoreConfig(flush_disk_type=FlushDiskType.ASYNC_FLUSH, preallocate=False)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    p.add_argument("--replica-mb", type=int, default=DEFAULT_REPLICA_MB)
    p.add_argument("--body-bytes", type=int, default=DEFAULT_BODY_BYTES)
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--task-mb", type=int, default=0, help="MB per task (default: the job's)")
    p.add_argument("--dir", help="where to write the stores (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the stores")
    args = p.parse_args(argv)
    if args.replica_mb <= 0 or args.body_bytes <= 8 or args.repeat <= 0:
        p.error("--replica-mb, --body-bytes (> 8) and --repeat must be positive")
    logging.basicConfig(level=logging.INFO, format="bench.audit: %(message)s", stream=sys.stderr)
    logging.getLogger("spark_audit").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from spark_audit.__main__ import audit
    from spark_audit.job import SessionOptions, start_session
    from spark_audit.plan import TASK_TARGET_BYTES, plan_group, sources_from_paths

    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-audit-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.monotonic()
        last = write_replica(root, args.replica_mb * MIB, args.body_bytes)
        write_s = time.monotonic() - t0
        log.info("wrote 3 replicas of %d entries in %.1f s", last, write_s)
        warmed = warm(root)
        log.info("page cache warmed: %.0f MB read", warmed / 1e6)

        t0 = time.monotonic()
        spark = start_session(SessionOptions(master=args.master))
        session_s = time.monotonic() - t0
        log.info("SparkSession started in %.1f s", session_s)
        runs: list[dict[str, Any]] = []
        try:
            task_bytes = args.task_mb * MIB if args.task_mb else TASK_TARGET_BYTES
            for i in range(args.repeat + 1):
                plans = [plan_group("bench", sources_from_paths("bench", [str(root)]))]
                t0 = time.monotonic()
                report = audit(spark, plans, task_bytes=task_bytes)
                wall = time.monotonic() - t0
                assert report.clean, "the benchmark's stores must audit clean"
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
                    }
                )
                log.info(
                    "run %d%s: %.0f MB in %.2f s = %.0f MB/s (%d tasks, %.1f task CPU s, "
                    "load %.1f)",
                    i,
                    " (first: starts the Python workers)" if i == 0 else "",
                    mb,
                    wall,
                    mb / wall,
                    report.tasks,
                    report.task_cpu_s,
                    os.getloadavg()[0],
                )
        finally:
            spark.stop()
        warm_runs = [r for r in runs if not r["first"]]
        best = max(r["mb_per_s"] for r in warm_runs)
        mean = sum(r["mb_per_s"] for r in warm_runs) / len(warm_runs)
        # Throughput per CPU second of the tasks does not depend on what else the machine
        # runs; times the cores it bounds what an idle machine gives (Spark's own overhead
        # aside).
        per_cpu = max(r["mb_per_task_cpu_s"] for r in warm_runs)
        cores = os.cpu_count() or 1
        result = {
            "bench": "audit",
            "utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0],
            "python": platform.python_version(),
            "master": args.master,
            "replicas": len(REPLICAS),
            "replica_mb": args.replica_mb,
            "body_bytes": args.body_bytes,
            "entries_per_replica": last,
            "session_start_s": round(session_s, 3),
            "runs": runs,
            "warm_mb_per_s_best": best,
            "warm_mb_per_s_mean": round(mean, 1),
            "warm_mb_per_task_cpu_s_best": per_cpu,
            "cpu_bound_mb_per_s_all_cores": round(per_cpu * cores, 1),
        }
        print(
            f"audit of {len(REPLICAS)} x {args.replica_mb} MiB ({last} entries of "
            f"{args.body_bytes} B per replica), master {args.master}\n"
            f"  session start        {session_s:8.1f} s\n"
            f"  first run            {runs[0]['mb_per_s']:8.0f} MB/s (includes Python workers)\n"
            f"  warm runs, best      {best:8.0f} MB/s\n"
            f"  warm runs, mean      {mean:8.0f} MB/s\n"
            f"  per task CPU second  {per_cpu:8.0f} MB/s (x {cores} cores = "
            f"{per_cpu * cores:.0f} MB/s if the machine were idle)\n"
            f"  load average (1 min) {os.getloadavg()[0]:8.1f}"
        )
        RESULTS_DIR.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = RESULTS_DIR / f"audit-{stamp}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"  written to {out}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
