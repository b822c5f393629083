"""``mqaudit`` / ``python -m spark_audit``: audit the replicas of one or more groups.

    mqaudit STORE [STORE ...]                  one group: store dirs (dledger-*), broker
                                               storePathRootDirs or an mqcluster base dir
    mqaudit --group a=DIR,DIR,DIR --group b=...  several groups
    mqaudit --connect 127.0.0.1:10911,127.0.0.1:10921,127.0.0.1:10931
                                               a running group: each node tells its store
                                               path and commit index (a secure group: with
                                               --tls-ca and --credentials, or
                                               RAFTMQ_TLS_CA and RAFTMQ_CREDENTIALS)

Exit codes: 0 clean, 1 divergence or corruption found, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from mqsecurity.errors import SecurityError
from mqsecurity.options import add_security_arguments, security_from_args
from spark_audit.digests import DigestStore, Reuse, stamp_all
from spark_audit.job import (
    DEFAULT_MASTER,
    LOOPBACK,
    OUTPUT_COLUMNS,
    AuditJobError,
    SessionOptions,
    SessionStarter,
    resolved_master,
    run_job,
)
from spark_audit.merkle import LEAF_ENTRIES, MAX_LEAF_ENTRIES, MIN_LEAF_ENTRIES
from spark_audit.model import GroupPlan
from spark_audit.plan import (
    DEFAULT_GROUP,
    TASK_TARGET_BYTES,
    InputError,
    ReplicaSource,
    group_name_of,
    plan_group,
    plan_tasks,
    sources_from_paths,
    sources_from_running,
)
from spark_audit.report import EXIT_USAGE, AuditReport, build_report, write_json, write_summary

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_audit")

PROG = "mqaudit"
MIB = 1 << 20


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad usage: one line on stderr, exit code 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description=(
            "Audit the Raft log stores of raftmq replicas with Spark: check every entry's\n"
            "header, CRC32C and index record, checksum every segment, and compare the\n"
            "replicas index by index up to the audited commit index (the lowest commit index\n"
            "in their checkpoints, or --upto). Exit codes: 0 clean, 1 divergence or\n"
            "corruption found, 2 usage or input error. See docs/AUDIT.md."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  mqaudit /tmp/raftmq-cluster                 every replica of a local group\n"
            "  mqaudit run/n0/dledger-n0 run/n1/dledger-n1 run/n2/dledger-n2 --json r.json\n"
            "  mqaudit --connect 127.0.0.1:10911,127.0.0.1:10921,127.0.0.1:10931\n"
            "  mqaudit --master spark://127.0.0.1:7077 /data/broker-a --parquet /data/mismatch\n"
        ),
    )
    _add_input_arguments(p)
    _add_audit_arguments(p)
    add_security_arguments(p)  # how --connect reaches a secure group
    return p


def _add_input_arguments(p: argparse.ArgumentParser) -> None:
    """What to audit: stores, named groups, running groups, and up to which index."""
    p.add_argument(
        "stores",
        nargs="*",
        metavar="STORE",
        help="replica store directories of one group (or a directory holding dledger-* stores)",
    )
    p.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="NAME=STORE[,STORE...]",
        help="a named group and its replicas' stores (repeat for several groups)",
    )
    p.add_argument(
        "--connect",
        action="append",
        default=[],
        metavar="ADDR[,ADDR...]",
        help="client addresses of a running group's nodes (repeat for several groups)",
    )
    p.add_argument(
        "--upto",
        type=int,
        metavar="INDEX",
        help="audited commit index (default: the lowest commit index the replicas report)",
    )


def _add_audit_arguments(p: argparse.ArgumentParser) -> None:
    """How to run the audit (Spark, task sizes, digests) and where its report goes."""
    p.add_argument(
        "--master",
        metavar="URL",
        help=f"Spark master (default: $MASTER as spark-submit sets it, else {DEFAULT_MASTER})",
    )
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument(
        "--parquet",
        metavar="PATH",
        help="write one row per divergent committed entry as Parquet (any path Spark writes)",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        metavar="N",
        help="data segment size (default: inferred from the files)",
    )
    p.add_argument(
        "--task-mb",
        type=int,
        default=TASK_TARGET_BYTES // MIB,
        metavar="MB",
        help=f"MB of each replica's log per Spark task (default {TASK_TARGET_BYTES // MIB})",
    )
    p.add_argument(
        "--leaf-entries",
        type=int,
        default=LEAF_ENTRIES,
        metavar="N",
        help=f"Raft indexes per leaf of the range digests (default {LEAF_ENTRIES})",
    )
    p.add_argument(
        "--digests",
        metavar="FILE",
        help="the digest store: reuse the clean committed ranges a previous audit stored "
        "there whose files did not change, and store this audit's (docs/AUDIT.md)",
    )
    p.add_argument(
        "--no-derived",
        action="store_true",
        help="skip the ConsumeQueue and key index checks (the log alone)",
    )
    p.add_argument(
        "--bind-address",
        default=LOOPBACK,
        metavar="IP",
        help=f"address the driver binds (default {LOOPBACK})",
    )
    p.add_argument(
        "--driver-host",
        default=LOOPBACK,
        metavar="HOST",
        help=f"address executors reach the driver at (default {LOOPBACK}; set it on a real "
        "cluster)",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages")


def _split_named(value: str, option: str) -> tuple[str | None, list[str]]:
    name: str | None = None
    rest = value
    head, sep, tail = value.partition("=")
    if sep and "/" not in head and ":" not in head:
        name, rest = head, tail
    items = [v for v in rest.split(",") if v]
    if not items or (name is not None and not name):
        raise InputError(f"{option} {value!r}: expected [NAME=]ITEM[,ITEM...]")
    return name, items


def _sources(args: argparse.Namespace) -> list[tuple[str, list[ReplicaSource]]]:
    groups: list[tuple[str, list[ReplicaSource]]] = []
    if args.stores:
        name = (group_name_of(args.stores[0]) if len(args.stores) == 1 else None) or DEFAULT_GROUP
        groups.append((name, sources_from_paths(name, args.stores)))
    for value in args.group:
        gname, items = _split_named(value, "--group")
        if gname is None:
            raise InputError(f"--group {value!r}: expected NAME=STORE[,STORE...]")
        groups.append((gname, sources_from_paths(gname, items)))
    for value in args.connect:
        cname, items = _split_named(value, "--connect")
        try:
            security = security_from_args(args)
        except SecurityError as exc:
            raise InputError(str(exc)) from None
        srcs = sources_from_running(items, cname or "", security)
        groups.append((srcs[0].group, srcs))
    if not groups:
        raise InputError("nothing to audit: give store directories, --group or --connect")
    names = [g for g, _ in groups]
    if len(set(names)) != len(names):
        raise InputError(f"group names must differ, got {names}")
    return groups


def _conf(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise InputError(f"--conf {v!r}: expected KEY=VALUE")
        out.append((key, value))
    return tuple(out)


def _check_options(args: argparse.Namespace) -> None:
    if args.upto is not None and args.upto < 0:
        raise InputError(f"--upto must be >= 0, got {args.upto}")
    if args.segment_bytes is not None and args.segment_bytes <= 0:
        raise InputError(f"--segment-bytes must be > 0, got {args.segment_bytes}")
    if args.task_mb <= 0:
        raise InputError(f"--task-mb must be > 0, got {args.task_mb}")
    if not MIN_LEAF_ENTRIES <= args.leaf_entries <= MAX_LEAF_ENTRIES:
        raise InputError(
            f"--leaf-entries must be in [{MIN_LEAF_ENTRIES}, {MAX_LEAF_ENTRIES}], "
            f"got {args.leaf_entries}"
        )


def _plan_groups(
    args: argparse.Namespace, groups: Sequence[tuple[str, list[ReplicaSource]]]
) -> list[GroupPlan]:
    return [
        plan_group(
            name,
            srcs,
            upto=args.upto,
            segment_size_bytes=args.segment_bytes,
            leaf_entries=args.leaf_entries,
        )
        for name, srcs in groups
    ]


def plan(args: argparse.Namespace) -> list[GroupPlan]:
    _check_options(args)
    return _plan_groups(args, _sources(args))


def audit(
    spark: SparkSession,
    plans: Sequence[GroupPlan],
    *,
    task_bytes: int = TASK_TARGET_BYTES,
    parquet_path: str | None = None,
    session_start_s: float = 0.0,
    workers_start_s: float = 0.0,
    derived: bool = True,
    digests_path: str | None = None,
) -> AuditReport:
    """Run the audit of ``plans`` on ``spark`` and build its report (``derived``: check the
    replicas' ConsumeQueues and key index too; ``digests_path``: reuse the clean ranges a
    previous audit stored there whose files did not change, and store this audit's)."""
    tasks = plan_tasks(plans, task_bytes=task_bytes, derived=derived)
    store = DigestStore(digests_path, plans[0].leaf_entries) if digests_path and plans else None
    stamps = stamp_all(plans) if store is not None else {}
    reuse = store.split(plans, tasks) if store is not None else Reuse(to_run=list(tasks))
    log.info("auditing groups=%d replicas=%d tasks=%d reused=%d", len(plans),
             sum(len(p.replicas) for p in plans), len(reuse.to_run),
             reuse.reused_ranges)  # fmt: skip
    out = run_job(spark, plans, reuse.to_run, parquet_path=parquet_path)
    if store is not None:
        try:
            store.update(plans, tasks, out.rows, stamps, reuse)
        except OSError as exc:
            raise InputError(f"cannot write {digests_path}: {exc.strerror or exc}") from None
    blank = dict.fromkeys(name for name, _ in OUTPUT_COLUMNS)
    report = build_report(
        plans,
        out.rows + [{**blank, **r} for r in reuse.rows],
        mismatch_counts=out.mismatch_counts,
        mismatch_sample=out.mismatch_sample,
        master=str(spark.sparkContext.master),
        session_start_s=session_start_s,
        job_s=out.elapsed_s,
        tasks=out.tasks,
        parquet_path=parquet_path,
        workers_start_s=workers_start_s,
    )
    report.reused_ranges = reuse.reused_ranges
    report.reused_entries = reuse.reused_entries
    report.reused_bytes = reuse.reused_bytes
    return report


def main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """Run the CLI; with ``spark`` given, use that session (and leave it running)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format=f"{PROG}: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    starter: SessionStarter | None = None
    try:
        # Usage errors and stores that are not there fail before Spark starts.
        _check_options(args)
        conf = _conf(args.conf)
        groups = _sources(args)
        session_start_s = workers_start_s = 0.0
        if spark is None:
            # Spark and its Python workers start while the driver plans (checkpoints, file
            # lists, index records of every replica).
            opts = SessionOptions(args.master, args.bind_address, args.driver_host, conf)
            log.info("starting Spark master=%s", resolved_master(opts) or "(from spark-submit)")
            starter = SessionStarter(opts)
            starter.start()
        plans = _plan_groups(args, groups)
        if starter is not None:
            spark = starter.result()
            session_start_s, workers_start_s = starter.session_s, starter.workers_s
            log.info("Spark session ready in %.1f s, Python workers in %.1f s more",
                     session_start_s, workers_start_s)  # fmt: skip
        assert spark is not None
        report = audit(
            spark,
            plans,
            task_bytes=args.task_mb * MIB,
            derived=not args.no_derived,
            digests_path=args.digests,
            parquet_path=args.parquet,
            session_start_s=session_start_s,
            workers_start_s=workers_start_s,
        )
    except (InputError, AuditJobError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if starter is not None:
            starter.stop()
    write_summary(report, sys.stdout)
    if args.json:
        try:
            write_json(report, args.json)
        except OSError as exc:
            print(f"{PROG}: error: cannot write {args.json}: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
