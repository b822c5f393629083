"""Benchmark of the DLedger log store (``python -m bench.store``).

Measures, in one run on the same disk: the raw fsync rate (4 KiB write + fsync), the
sequential write bandwidth (256 MiB written then one fsync), SYNC_FLUSH group commit with
64 appenders (128 B, 1 KiB, 16 KiB entries) both as OS threads doing ``append`` + ``flush``
and as coroutines on one event loop with one flush thread (how the server drives it), and
ASYNC_FLUSH from one thread appending batches. Prints a table and writes
``bench/results/store-<UTC timestamp>.json``. Bounded in time; removes its temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import tune_gc
from dledger.storage.store import FlushDiskType, SegmentedLogStore, StoreConfig

SIZES = [128, 1024, 16 * 1024]
SYNC_THREADS = 64
ASYNC_BATCH = 256
SEQ_TOTAL_BYTES = 256 << 20
SEQ_CHUNK_BYTES = 1 << 20


def fsync_rate(directory: Path, seconds: float) -> dict[str, float]:
    path = directory / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = os.urandom(4096)
    n = 0
    lat: list[float] = []
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            os.pwrite(fd, block, (n % 256) * 4096)
            os.fsync(fd)
            lat.append(time.perf_counter() - t)
            n += 1
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    lat.sort()
    return {
        "fsyncs_per_s": n / elapsed,
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000,
    }


def seq_bandwidth(directory: Path) -> dict[str, float]:
    path = directory / "seq.bin"
    chunk = os.urandom(SEQ_CHUNK_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(SEQ_TOTAL_BYTES // SEQ_CHUNK_BYTES):
            os.write(fd, chunk)
        t_written = time.perf_counter()
        os.fsync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {
        "bytes": SEQ_TOTAL_BYTES,
        "mb_per_s": SEQ_TOTAL_BYTES / elapsed / 1e6,
        "write_s": t_written - t0,
        "fsync_s": elapsed - (t_written - t0),
    }


def bench_sync(directory: Path, size: int, seconds: float, threads: int) -> dict[str, float]:
    root = directory / f"sync-{size}"
    store = SegmentedLogStore(root, StoreConfig(flush_disk_type=FlushDiskType.SYNC_FLUSH))
    body = os.urandom(size)
    stop = threading.Event()
    counts = [0] * threads
    errors: list[BaseException] = []
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def worker(k: int) -> None:
        term = 1
        try:
            while not stop.is_set():
                t = time.perf_counter()
                last = store.append_bodies(term, [body])
                store.flush()
                latencies[k].append(time.perf_counter() - t)
                assert store.flushed_index() >= last
                counts[k] += 1
        except BaseException as e:
            errors.append(e)

    flushes_before = store.flush_count
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    flushes = store.flush_count - flushes_before
    store.close()
    shutil.rmtree(root)
    if errors:
        raise errors[0]
    n = sum(counts)
    lat = sorted(x for per in latencies for x in per)
    return {
        "entry_bytes": size,
        "threads": threads,
        "appends": n,
        "appends_per_s": n / elapsed,
        "mb_per_s": n * size / elapsed / 1e6,
        "syncs": flushes,
        "syncs_per_append": flushes / n if n else 0.0,
        "entries_per_sync": n / flushes if flushes else 0.0,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else 0.0,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else 0.0,
    }


def bench_sync_event_loop(
    directory: Path, size: int, seconds: float, appenders: int
) -> dict[str, float]:
    """SYNC_FLUSH group commit the way ``dledger.server.node`` drives the store: concurrent
    appenders are coroutines on one event loop; one flush at a time runs in a worker thread
    and covers everything appended before it started; each appender waits for its index."""
    root = directory / f"sync-loop-{size}"
    store = SegmentedLogStore(root, StoreConfig(flush_disk_type=FlushDiskType.SYNC_FLUSH))
    body = os.urandom(size)
    latencies: list[float] = []
    appended = [0]
    sync_busy = [0.0]  # fraction of the time an fdatasync was running

    async def run() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(1, "bench-flush")
        waiters: list[tuple[int, asyncio.Future[None]]] = []
        kick = asyncio.Event()
        stop = asyncio.Event()

        async def committer() -> None:
            while True:
                await kick.wait()
                kick.clear()
                flushed = await loop.run_in_executor(pool, store.flush)
                still = []
                for index, fut in waiters:
                    if index <= flushed:
                        fut.set_result(None)
                    else:
                        still.append((index, fut))
                waiters[:] = still
                if waiters:
                    kick.set()

        async def appender() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                index = store.append_bodies(1, [body])
                fut: asyncio.Future[None] = loop.create_future()
                waiters.append((index, fut))
                kick.set()
                await fut
                latencies.append(time.perf_counter() - t)
                appended[0] += 1

        flush_task = asyncio.create_task(committer())
        flushes_before = store.flush_count
        sync_s_before = store.sync_seconds
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(appender()) for _ in range(appenders)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        sync_busy[0] = (store.sync_seconds - sync_s_before) / elapsed
        flush_task.cancel()
        pool.shutdown(wait=True)
        return elapsed, store.flush_count - flushes_before

    elapsed, flushes = asyncio.run(run())
    store.close()
    shutil.rmtree(root)
    n = appended[0]
    lat = sorted(latencies)
    return {
        "entry_bytes": size,
        "appenders": appenders,
        "appends": n,
        "appends_per_s": n / elapsed,
        "mb_per_s": n * size / elapsed / 1e6,
        "syncs": flushes,
        "syncs_per_append": flushes / n if n else 0.0,
        "entries_per_sync": n / flushes if flushes else 0.0,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else 0.0,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else 0.0,
        "sync_busy_fraction": sync_busy[0],
    }


def bench_async(directory: Path, size: int, seconds: float) -> dict[str, float]:
    root = directory / f"async-{size}"
    store = SegmentedLogStore(root, StoreConfig(flush_disk_type=FlushDiskType.ASYNC_FLUSH))
    bodies = [os.urandom(size)] * ASYNC_BATCH
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        store.append_bodies(1, bodies)
        n += ASYNC_BATCH
    elapsed = time.perf_counter() - t0
    store.flush()
    elapsed_durable = time.perf_counter() - t0
    store.close()
    shutil.rmtree(root)
    return {
        "entry_bytes": size,
        "batch": ASYNC_BATCH,
        "appends": n,
        "appends_per_s": n / elapsed,
        "mb_per_s": n * size / elapsed / 1e6,
        "appends_per_s_incl_final_flush": n / elapsed_durable,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each case")
    parser.add_argument("--threads", type=int, default=SYNC_THREADS)
    parser.add_argument("--dir", default=None, help="where to put the temp dir (same disk)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.threads <= 0:
        print("error: --seconds and --threads must be > 0", file=sys.stderr)
        return 2
    tune_gc()  # the collector settings the broker runs with
    started = datetime.now(UTC)
    m = _measure(args)
    ratios, targets = _judge(m)
    result: dict[str, Any] = {
        "bench": "store",
        "started_utc": started.isoformat(),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "seconds_per_case": args.seconds,
        "disk": {
            "fsync_4k": m["fsync"],
            "sequential_write": m["seq"],
            "sequential_write_around_sync_16k": m["around_16k"],
            "sequential_write_at_end": m["seq_end"],
        },
        "sync_flush_group_commit_threads": m["sync"],
        "sync_flush_group_commit_event_loop": m["sync_loop"],
        "async_flush_one_thread": m["asyn"],
        "ratios": ratios,
        "targets_met": targets,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"store-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    _print_summary(args.threads, m, ratios, targets)
    print(f"wrote {out}")
    return 0


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every case, in a temp dir removed after: the disk's raw figures, then SYNC_FLUSH on OS
    threads and on one event loop, then ASYNC_FLUSH."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.dir))
    try:
        m: dict[str, Any] = {
            "fsync": fsync_rate(tmp, min(args.seconds, 3.0)),
            "seq": seq_bandwidth(tmp),
            "sync": [bench_sync(tmp, size, args.seconds, args.threads) for size in SIZES],
            "sync_loop": [],
            "around_16k": [],
        }
        for size in SIZES:
            if size == 16384:
                # The disk's speed depends on which blocks a new file gets (on this VM, blocks
                # freed a moment ago write ~5x faster than never-written ones), so the
                # bandwidth that the target is judged against is measured right before and
                # right after the case, in the same directory, and the larger one is used.
                m["around_16k"].append(seq_bandwidth(tmp))
            m["sync_loop"].append(bench_sync_event_loop(tmp, size, args.seconds, args.threads))
            if size == 16384:
                m["around_16k"].append(seq_bandwidth(tmp))
        m["asyn"] = [bench_async(tmp, size, args.seconds) for size in SIZES]
        # Measured again at the end: how much the disk's speed moved during the run.
        m["seq_end"] = seq_bandwidth(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return m


def _judge(m: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    """The ratios the targets are judged on, and whether each target is met."""
    sync, fsync = m["sync"], m["fsync"]
    by_size = {r["entry_bytes"]: r for r in sync}
    loop_by_size = {r["entry_bytes"]: r for r in m["sync_loop"]}
    seq_16k = max(r["mb_per_s"] for r in m["around_16k"])
    sync_over_seq = loop_by_size[16384]["mb_per_s"] / seq_16k
    ratios: dict[str, Any] = {
        # The target is judged on the server's path (coroutines + one flush thread); the
        # 64-OS-thread figure is kept beside it: there Python's GIL hand-offs, not the disk,
        # limit how many appenders join each sync.
        "sync_16k_mb_per_s_over_seq_bandwidth": sync_over_seq,
        "seq_bandwidth_judged_against_mb_per_s": seq_16k,
        "sync_16k_threads_mb_per_s_over_seq_bandwidth": (
            by_size[16384]["mb_per_s"] / m["seq"]["mb_per_s"]
        ),
        "sync_syncs_per_append": {str(r["entry_bytes"]): r["syncs_per_append"] for r in sync},
        "sync_appends_per_s_over_raw_fsync_rate": {
            str(r["entry_bytes"]): r["appends_per_s"] / fsync["fsyncs_per_s"] for r in sync
        },
    }
    targets = {
        "sync_16k_at_least_half_seq_bandwidth": sync_over_seq >= 0.5,
        "async_1k_at_least_200k_appends_per_s": m["asyn"][1]["appends_per_s"] >= 200_000,
    }
    return ratios, targets


def _print_summary(
    threads: int, m: dict[str, Any], ratios: dict[str, Any], targets: dict[str, bool]
) -> None:
    fsync, seq, seq_end = m["fsync"], m["seq"], m["seq_end"]
    print(
        f"disk: fsync 4 KiB {fsync['fsyncs_per_s']:,.0f}/s (p50 {fsync['p50_ms']:.2f} ms); "
        f"sequential write {seq['mb_per_s']:,.0f} MB/s ({seq_end['mb_per_s']:,.0f} MB/s at the "
        "end of the run)"
    )
    print(f"SYNC_FLUSH, {threads} threads, append_durable (group commit):")
    for r in m["sync"]:
        print(
            f"  {r['entry_bytes']:>6} B: {r['appends_per_s']:>9,.0f} appends/s "
            f"{r['mb_per_s']:>7,.1f} MB/s  {r['entries_per_sync']:6.1f} entries/sync "
            f"({r['syncs_per_append']:.3f} syncs/append)  p50 {r['p50_ms']:.2f} ms"
        )
    print(
        f"SYNC_FLUSH, {threads} appenders on one event loop + one flush thread (the server's path):"
    )
    for r in m["sync_loop"]:
        print(
            f"  {r['entry_bytes']:>6} B: {r['appends_per_s']:>9,.0f} appends/s "
            f"{r['mb_per_s']:>7,.1f} MB/s  {r['entries_per_sync']:6.1f} entries/sync "
            f"({r['syncs_per_append']:.3f} syncs/append)  p50 {r['p50_ms']:.2f} ms  "
            f"syncing {r['sync_busy_fraction']:.0%} of the time"
        )
    print(f"ASYNC_FLUSH, one thread, batches of {ASYNC_BATCH}:")
    for r in m["asyn"]:
        print(
            f"  {r['entry_bytes']:>6} B: {r['appends_per_s']:>9,.0f} appends/s "
            f"{r['mb_per_s']:>7,.1f} MB/s"
        )
    print(
        "ratios: SYNC 16 KiB / sequential bandwidth = "
        f"{ratios['sync_16k_mb_per_s_over_seq_bandwidth']:.2f} (event loop, against "
        f"{ratios['seq_bandwidth_judged_against_mb_per_s']:,.0f} MB/s: the larger of "
        + " and ".join(f"{r['mb_per_s']:,.0f}" for r in m["around_16k"])
        + " MB/s measured just before and after),"
        f" {ratios['sync_16k_threads_mb_per_s_over_seq_bandwidth']:.2f} (OS threads, "
        f"against the first figure); targets met: {targets}"
    )


if __name__ == "__main__":
    sys.exit(main())
