"""The Spark side: a session on 127.0.0.1 (or any master), one Spark task per index range,
each task a ``mapInArrow`` call that scans its range on every replica and yields a few rows.

Nothing but aggregates, findings and divergent-entry rows leaves the tasks: no step
collects entries to the driver, and there is no shuffle.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_audit.derived import run_derived_task
from spark_audit.errors import AuditError
from spark_audit.model import TASK_DERIVED, GroupPlan, TaskSpec, to_i64
from spark_audit.scan import iter_rows, run_task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
APP_NAME = "mqaudit"
# How often the driver logs the job's progress.
PROGRESS_INTERVAL_S = 2.0
# Divergent-entry rows kept in the JSON report (all of them go to Parquet).
MISMATCH_SAMPLE_ROWS = 100
# Rows per Arrow batch a task yields (bounds a task's memory for large outputs).
ROWS_PER_BATCH = 10_000
# Packages shipped to the executors (the job's code, the codec it parses with, what that codec's
# package imports: prockit for dledger.storage's fatal exits, and the error codes both name).
SHIPPED_PACKAGES = ("spark_audit", "dledger", "prockit", "msgcodec", "mqerrors", "mqrelease")

OUTPUT_COLUMNS: tuple[tuple[str, str], ...] = (
    # finding, mismatch, pair, part, end, leaf, derived, task (count = CPU microseconds)
    ("kind", "string"),
    ("what", "string"),  # the finding's kind (model.What) or the part's committed/tail
    ("group", "string"),
    ("task", "long"),
    ("replica", "string"),
    ("peer", "string"),
    ("file", "string"),
    ("path", "string"),
    ("index", "long"),
    ("index_end", "long"),
    ("offset", "long"),
    ("count", "long"),
    ("detail", "string"),
    ("term", "long"),
    ("digest", "long"),  # u64 stored as signed 64-bit
    ("peer_term", "long"),
    ("peer_digest", "long"),
    ("bytes", "long"),
    ("min_term", "long"),
    ("max_term", "long"),
    ("unordered", "long"),  # u64 stored as signed 64-bit
    ("ordered", "long"),
    ("mismatches", "long"),  # task rows: divergent-entry rows the task wrote
)
OUTPUT_DDL = ", ".join(f"`{name}` {typ}" for name, typ in OUTPUT_COLUMNS)
U64_COLUMNS = ("digest", "peer_digest", "unordered")
MISMATCH_COLUMNS = (
    "group",
    "index",
    "replica",
    "term",
    "digest",
    "peer",
    "peer_term",
    "peer_digest",
    "file",
    "offset",
)


class AuditJobError(AuditError):
    """Spark could not start or run the job."""


def _pyarrow() -> Any:
    """``pyarrow`` (it ships no type information)."""
    return importlib.import_module("pyarrow")


def _arrow_schema() -> Any:
    pa = _pyarrow()

    types = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, types[typ]) for name, typ in OUTPUT_COLUMNS])


class TaskRunner:
    """The function ``mapInArrow`` runs on the executors (pickled with the plans and the
    tasks): its input is ``spark.range`` over the positions in ``tasks``, so the JVM makes
    the input rows and no Python stage runs before the scan."""

    def __init__(self, plans: Sequence[GroupPlan], tasks: Sequence[TaskSpec] = ()) -> None:
        self.plans = {p.group: p for p in plans}
        self.tasks = tuple(tasks)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Arrow record batches of positions in ``tasks`` (column ``id``) in, record batches
        of OUTPUT_COLUMNS out."""
        pa = _pyarrow()

        schema = _arrow_schema()
        names = [name for name, _ in OUTPUT_COLUMNS]
        for batch in batches:
            for at in batch.column("id").to_pylist():
                task = self.tasks[int(at)]
                plan = self.plans[task.group]
                t0 = time.monotonic()
                cpu0 = time.process_time()
                if task.kind == TASK_DERIVED:
                    result = run_derived_task(plan, task)
                else:
                    result = run_task(plan, task)
                cpu_us = int((time.process_time() - cpu0) * 1e6)
                log.info(
                    "task=%d group=%s range=[%d,%s) bytes=%d elapsed_s=%.2f",
                    task.task_id,
                    task.group,
                    task.lo,
                    task.hi or "end",
                    result.scanned_bytes,
                    time.monotonic() - t0,
                )
                rows: list[dict[str, Any]] = []
                for row in iter_rows(plan, task, result):
                    for col in U64_COLUMNS:
                        if col in row:
                            row[col] = to_i64(int(row[col]))  # type: ignore[call-overload]
                    rows.append({n: row.get(n) for n in names})
                    if len(rows) >= ROWS_PER_BATCH:
                        yield pa.RecordBatch.from_pylist(rows, schema=schema)
                        rows = []
                # The task's own cost: bytes scanned and CPU time (load-independent rate).
                rows.append(
                    {
                        n: v
                        for n, v in (
                            ("kind", "task"),
                            ("group", task.group),
                            ("task", task.task_id),
                            ("bytes", result.scanned_bytes),
                            ("count", cpu_us),
                            ("mismatches", len(result.mismatches)),
                        )
                    }
                )
                yield pa.RecordBatch.from_pylist(rows, schema=schema)


def _ship_code(directory: Path) -> Path:
    """A zip of the packages the executors import, for ``SparkContext.addPyFile``."""
    root = Path(__file__).resolve().parent.parent
    out = directory / "raftmq_audit_code.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in SHIPPED_PACKAGES:
            for path in sorted((root / pkg).rglob("*.py")):
                z.write(path, path.relative_to(root).as_posix())
    return out


# Applications whose executors already have the code (Spark refuses a second file of the
# same name), and the directory holding the zip (Spark reads it when executors ask).
_SHIPPED: set[str] = set()
_SHIP_DIR: list[Path] = []


def _ship_once(spark: SparkSession) -> None:
    sc = spark.sparkContext
    app = str(sc.applicationId)
    if app in _SHIPPED:
        return
    if not _SHIP_DIR:
        directory = Path(tempfile.mkdtemp(prefix="mqaudit-code-"))
        atexit.register(shutil.rmtree, directory, True)
        _SHIP_DIR.append(directory)
    zip_path = _SHIP_DIR[0] / "raftmq_audit_code.zip"
    if not zip_path.exists():
        _ship_code(_SHIP_DIR[0])
    sc.addPyFile(str(zip_path))
    _SHIPPED.add(app)


@dataclass(frozen=True, slots=True)
class SessionOptions:
    master: str | None = None  # None: $MASTER (spark-submit exports it), else local[*]
    bind_address: str = LOOPBACK
    driver_host: str = LOOPBACK
    conf: tuple[tuple[str, str], ...] = ()


def resolved_master(opts: SessionOptions) -> str | None:
    """The master to set on the builder; None when spark-submit already chose one."""
    if opts.master:
        return opts.master
    if os.environ.get("MASTER"):
        return None
    return DEFAULT_MASTER


def start_session(opts: SessionOptions) -> SparkSession:
    """A SparkSession bound to ``opts.bind_address`` with the UI off. The Python the
    workers run is this one (PYSPARK_PYTHON must be set before the session starts)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", opts.bind_address)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(APP_NAME)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", opts.driver_host)
        .config("spark.driver.bindAddress", opts.bind_address)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Python workers outlive a task: a worker's start-up (interpreter, pyarrow, numpy,
        # the CRC tables) is paid once per executor core, not once per task.
        .config("spark.python.worker.reuse", "true")
    )
    master = resolved_master(opts)
    if master is not None:
        builder = builder.master(master)
    for key, value in opts.conf:
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise AuditJobError(f"cannot start Spark: {str(exc).splitlines()[0]}") from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _warm_task(batches: Iterator[Any]) -> Iterator[Any]:
    """What a warm-up task runs in a Python worker: the imports and tables a scan needs;
    it yields no rows."""
    from spark_audit import batch
    from spark_audit.scan import run_task  # what the audit's tasks run, imported now

    batch.warm()
    log.debug("Python worker ready for %s", run_task.__qualname__)
    for _ in batches:
        pass
    yield from ()


def warm_workers(spark: SparkSession) -> float:
    """Start the Python workers (one per core Spark has) with a job of empty tasks of the
    same shape as the audit's (``mapInArrow`` to the output schema, persisted, filtered,
    collected), so that the audit's first tasks find the workers running with the job's
    code loaded and the JVM's code for the plan already compiled. Returns the seconds."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    _ship_once(spark)
    n = max(int(spark.sparkContext.defaultParallelism), 1)
    try:
        out = spark.range(0, n, 1, n).mapInArrow(_warm_task, OUTPUT_DDL)
        out = out.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            out.filter(F.col("kind") != "mismatch").collect()
        finally:
            out.unpersist()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AuditJobError(f"the Python workers did not start: {first}") from exc
    elapsed = time.monotonic() - t0
    log.info("Python workers ready in %.1f s (%d cores)", elapsed, n)
    return elapsed


class SessionStarter(threading.Thread):
    """Starts the session and its Python workers in the background (while the driver
    plans the audit); ``result`` waits for them."""

    def __init__(self, opts: SessionOptions) -> None:
        super().__init__(name="audit-session", daemon=True)
        self._opts = opts
        self.spark: SparkSession | None = None
        self.session_s = 0.0
        self.workers_s = 0.0
        self._error: AuditJobError | None = None

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            self.spark = start_session(self._opts)
            self.session_s = time.monotonic() - t0
            self.workers_s = warm_workers(self.spark)
        except AuditJobError as exc:
            self._error = exc
        except Exception as exc:  # anything else Spark or py4j raises
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._error = AuditJobError(f"cannot start Spark: {first}")

    def result(self) -> SparkSession:
        self.join()
        if self._error is not None:
            raise self._error
        assert self.spark is not None
        return self.spark

    def stop(self) -> None:
        """Stop the session once it is up (the caller gave up on it)."""
        self.join()
        if self.spark is not None:
            self.spark.stop()


@dataclass(frozen=True, slots=True)
class JobOutput:
    rows: list[dict[str, Any]]  # every row except divergent-entry rows
    mismatch_counts: dict[str, int]  # divergent-entry rows per group
    mismatch_sample: list[dict[str, Any]]
    tasks: int
    elapsed_s: float


class _Progress(threading.Thread):
    def __init__(self, spark: SparkSession, total_tasks: int, est_bytes: int) -> None:
        super().__init__(name="audit-progress", daemon=True)
        self._tracker = spark.sparkContext.statusTracker()
        self._total = total_tasks
        self._est_bytes = est_bytes
        self._stop = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        done = 0
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            running = 0
            active = False
            for sid in self._tracker.getActiveStageIds():
                info = self._tracker.getStageInfo(sid)
                if info is not None and info.numTasks == self._total:
                    active = True
                    done, running = info.numCompletedTasks, info.numActiveTasks
            if not active and done:
                done = self._total  # the scan stage is over; what remains is bookkeeping
            elapsed = time.monotonic() - self._t0
            log.info(
                "progress: %d/%d ranges done, %d running, about %.0f MB of %.0f MB, %.1f s",
                done,
                self._total,
                running,
                self._est_bytes * done / max(self._total, 1) / 1e6,
                self._est_bytes / 1e6,
                elapsed,
            )

    def stop(self) -> None:
        self._stop.set()


def run_job(
    spark: SparkSession,
    plans: Sequence[GroupPlan],
    tasks: Sequence[TaskSpec],
    *,
    parquet_path: str | None = None,
) -> JobOutput:
    """Run ``tasks`` (one Spark task each) and return the rows the driver needs."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    if not tasks:
        return JobOutput([], {}, [], 0, 0.0)
    _ship_once(spark)
    replicas = {p.group: len(p.replicas) for p in plans}
    est_bytes = sum(t.est_bytes * replicas[t.group] for t in tasks)
    # One partition per task, holding the task's position in ``tasks``.
    task_df = spark.range(0, len(tasks), 1, len(tasks))
    runner = TaskRunner(plans, tasks)
    out = task_df.mapInArrow(runner, OUTPUT_DDL).persist(StorageLevel.MEMORY_AND_DISK)
    progress = _Progress(spark, len(tasks), est_bytes)
    progress.start()
    try:
        rows = [r.asDict() for r in out.filter(F.col("kind") != "mismatch").collect()]
        mismatches = out.filter(F.col("kind") == "mismatch")
        counts: dict[str, int] = {}
        for r in rows:
            if r["kind"] == "task" and r["mismatches"]:
                counts[r["group"]] = counts.get(r["group"], 0) + int(r["mismatches"])
        count = sum(counts.values())
        sample: list[dict[str, Any]] = []
        if count:
            ordered = mismatches.select(*MISMATCH_COLUMNS).orderBy("group", "index", "replica")
            sample = [r.asDict() for r in ordered.limit(MISMATCH_SAMPLE_ROWS).collect()]
            if parquet_path:
                ordered.write.mode("overwrite").parquet(parquet_path)
        elif parquet_path:
            mismatches.select(*MISMATCH_COLUMNS).write.mode("overwrite").parquet(parquet_path)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AuditJobError(f"the Spark job failed: {first}") from exc
    finally:
        progress.stop()
        with contextlib.suppress(Exception):
            out.unpersist()
    elapsed = time.monotonic() - t0
    log.info("job done tasks=%d rows=%d mismatches=%d elapsed_s=%.2f", len(tasks), len(rows),
             count, elapsed)  # fmt: skip
    return JobOutput(rows, counts, sample, len(tasks), elapsed)
