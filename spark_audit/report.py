"""Driver side: turn the tasks' rows into per-segment and per-replica checksums, merged
findings and per-pair first divergences; print the summary table and write the JSON report."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from mqrelease import BASELINE_LEVEL
from spark_audit.crc import crc32c_combine
from spark_audit.model import (
    ORDERED_KEY_BYTES,
    U64_MASK,
    Finding,
    GroupPlan,
    ReplicaPlan,
    Severity,
    What,
    severity_of,
    to_u64,
)
from spark_audit.ranges import RangeSummary, collect_leaves, compare_ranges, repair_procedure

REPORT_VERSION = 1
EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
# Findings printed in the human summary (the JSON report has them all).
MAX_PRINTED_FINDINGS = 50
# Findings over contiguous indexes in the same file are merged across task boundaries.
MERGED_KINDS = frozenset(
    {
        What.CORRUPT_ENTRY,
        What.MISSING_ENTRIES,
        What.BEHIND,
        What.INDEX_MISMATCH,
        What.TAIL_CORRUPT,
        What.TAIL_INDEX_MISMATCH,
    }
)
# Findings that name the first index of a run spread over tasks: keep the lowest, add counts.
FIRST_OF_KINDS = frozenset({What.DIVERGENT_ENTRY, What.UNCOMMITTED_TAIL})
# Information findings a replica's status shows when it has no error (the rest are noted
# only in the findings' lines).
STATUS_NOTES = frozenset({What.BEHIND, What.BELOW_FEATURE_LEVEL})


@dataclass(slots=True)
class Checksums:
    first_index: int = 0
    last_index: int = 0
    count: int = 0
    bytes: int = 0
    min_term: int = 0
    max_term: int = 0
    unordered: int = 0
    ordered: int = 0

    def add(self, row: dict[str, Any]) -> None:
        """Append a piece; pieces must come in index order."""
        n = int(row["count"])
        if not n:
            return
        if not self.count:
            self.first_index = int(row["index"])
            self.min_term = int(row["min_term"])
        self.last_index = int(row["index_end"])
        self.min_term = min(self.min_term, int(row["min_term"]))
        self.max_term = max(self.max_term, int(row["max_term"]))
        self.bytes += int(row["bytes"])
        self.unordered = (self.unordered + to_u64(int(row["unordered"]))) & U64_MASK
        self.ordered = crc32c_combine(self.ordered, int(row["ordered"]), n * ORDERED_KEY_BYTES)
        self.count += n

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["unordered"] = f"{self.unordered:016x}"
        d["ordered"] = f"{self.ordered:08x}"
        return d


@dataclass(slots=True)
class SegmentSummary:
    file: str
    committed: Checksums = field(default_factory=Checksums)
    tail_count: int = 0
    tail_bytes: int = 0


@dataclass(slots=True)
class ReplicaSummary:
    replica: str
    root: str
    first_index: int
    commit_index: int
    last_index: int = -1
    end_file: str = ""
    end_offset: int = -1
    committed: Checksums = field(default_factory=Checksums)
    tail_count: int = 0
    segments: dict[str, SegmentSummary] = field(default_factory=dict)
    status: str = "ok"
    # The feature level the store reached and its node's supported one (0: not known).
    feature_level: int = BASELINE_LEVEL
    supported_feature_level: int = 0
    release: str = ""
    # "consumequeue"/"key_index" -> {"files": n, "records": n} checked (empty: none there)
    derived: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def scanned_bytes(self) -> int:
        """Bytes of entries read on this replica (committed and tail)."""
        return sum(s.committed.bytes + s.tail_bytes for s in self.segments.values())


@dataclass(slots=True)
class PairSummary:
    replica: str
    peer: str
    first_divergent_index: int
    count: int
    committed: bool


@dataclass(slots=True)
class GroupReport:
    group: str
    audited_index: int
    audited_from: str
    first_index: int
    replicas: list[ReplicaSummary]
    pairs: list[PairSummary]
    findings: list[Finding]
    mismatch_count: int = 0
    mismatch_sample: list[dict[str, Any]] = field(default_factory=list)
    ranges: RangeSummary = field(default_factory=RangeSummary)
    feature_level: int = BASELINE_LEVEL  # the group's: the highest any member's store reached

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]


@dataclass(slots=True)
class AuditReport:
    groups: list[GroupReport]
    master: str
    session_start_s: float
    job_s: float
    tasks: int
    parquet_path: str | None = None
    task_cpu_s: float = 0.0  # CPU time the tasks spent scanning and comparing
    workers_start_s: float = 0.0  # starting the Python workers before the job (0: not done)
    reused_ranges: int = 0  # ranges answered from the digest store (--digests), not read
    reused_entries: int = 0
    reused_bytes: int = 0  # bytes of entries of those ranges (over every replica)

    def mb_per_s(self, nbytes: int) -> float:
        """``nbytes`` over the job's wall time, in MB/s (every replica is read during it)."""
        return nbytes / 1e6 / self.job_s if self.job_s > 0 else 0.0

    @property
    def clean(self) -> bool:
        return not any(g.errors for g in self.groups)

    @property
    def exit_code(self) -> int:
        return EXIT_CLEAN if self.clean else EXIT_FINDINGS

    @property
    def scanned_bytes(self) -> int:
        """Bytes of entries read by this audit (not those of reused ranges)."""
        return (
            sum(
                sum(s.committed.bytes + s.tail_bytes for s in r.segments.values())
                for g in self.groups
                for r in g.replicas
            )
            - self.reused_bytes
        )


def _finding_from_row(row: dict[str, Any]) -> Finding:
    return Finding(
        What(row["what"]),
        row["group"],
        row["replica"] or "",
        row["file"] or "",
        row["path"] or "",
        int(row["index"] or 0),
        int(row["index_end"] if row["index_end"] is not None else 0),
        int(row["offset"] if row["offset"] is not None else -1),
        row["detail"] or "",
        row["peer"] or "",
        int(row["count"] or 0),
    )


def merge_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Join pieces of one problem that several tasks reported (contiguous index spans in the
    same file; the first divergent entry of a replica)."""
    out: list[Finding] = []
    first_of: dict[tuple[What, str, str], Finding] = {}
    ordered = sorted(findings, key=lambda f: (f.group, f.replica, f.what.value, f.index))
    for f in ordered:
        if f.what in FIRST_OF_KINDS:
            key = (f.what, f.group, f.replica)
            prev = first_of.get(key)
            if prev is None:
                first_of[key] = f
            else:
                keep = prev if prev.index <= f.index else f
                first_of[key] = Finding(
                    keep.what, keep.group, keep.replica, keep.file, keep.path, keep.index,
                    keep.index_end, keep.offset, keep.detail, keep.peer, prev.count + f.count,
                )  # fmt: skip
            continue
        if out and f.what in MERGED_KINDS:
            p = out[-1]
            if (
                (p.what, p.group, p.replica, p.file) == (f.what, f.group, f.replica, f.file)
                and p.index_end >= 0
                and p.index_end + 1 == f.index
            ):
                out[-1] = Finding(
                    p.what, p.group, p.replica, p.file, p.path, p.index, f.index_end, p.offset,
                    p.detail, p.peer, p.count + f.count,
                )  # fmt: skip
                continue
        out.append(f)
    out.extend(first_of.values())
    return sorted(
        out,
        key=lambda f: (f.group, f.severity is not Severity.ERROR, f.replica, f.index, f.what.value),
    )


def _rolled_back(plan: GroupPlan, replicas: dict[str, ReplicaSummary]) -> list[Finding]:
    """A replica whose log ends below the index its node promised (acknowledged as durable)
    forgot entries it vouched for: its store was rolled back or replaced."""
    out = []
    for rp in plan.replicas:
        last = replicas[rp.replica].last_index
        if rp.promised_index and last < rp.promised_index:
            out.append(
                Finding(What.ROLLED_BACK, plan.group, rp.replica, fs_name(rp.promise_uri),
                        rp.promise_uri, last + 1, rp.promised_index, 0,
                        f"its log ends at index {max(last, 0)} but the node promised index "
                        f"{rp.promised_index}: its store was rolled back or replaced; repair: "
                        f"{repair_procedure(plan.group, rp.replica)}",
                        count=rp.promised_index - max(last, 0))
            )  # fmt: skip
    return out


def fs_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _replica_summary(rp: ReplicaPlan) -> ReplicaSummary:
    return ReplicaSummary(
        rp.replica,
        rp.root,
        rp.first_index,
        rp.commit_index,
        feature_level=rp.feature_level,
        supported_feature_level=rp.supported_feature_level,
        release=rp.release,
    )


def _status(replica: str, findings: Sequence[Finding]) -> str:
    """The kinds of error found on ``replica``; without one, its notes (STATUS_NOTES); "ok"."""
    mine = [f for f in findings if f.replica == replica]
    bad = sorted({f.what.value for f in mine if f.severity is Severity.ERROR})
    noted = sorted({f.what.value for f in mine if f.what in STATUS_NOTES})
    return ",".join(bad or noted) or "ok"


def build_report(
    plans: Sequence[GroupPlan],
    rows: Sequence[dict[str, Any]],
    *,
    mismatch_counts: dict[str, int],
    mismatch_sample: Sequence[dict[str, Any]],
    master: str,
    session_start_s: float,
    job_s: float,
    tasks: int,
    parquet_path: str | None,
    workers_start_s: float = 0.0,
) -> AuditReport:
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_group[row["group"]].append(row)
    groups = []
    for plan in plans:
        grows = by_group.get(plan.group, [])
        replicas = {rp.replica: _replica_summary(rp) for rp in plan.replicas}
        parts = sorted(
            (r for r in grows if r["kind"] == "part"), key=lambda r: (r["replica"], r["index"])
        )
        for r in parts:
            rs = replicas[r["replica"]]
            seg = rs.segments.setdefault(r["file"], SegmentSummary(r["file"]))
            if r["what"] == "committed":
                seg.committed.add(r)
                rs.committed.add(r)
            else:
                seg.tail_count += int(r["count"])
                seg.tail_bytes += int(r["bytes"])
                rs.tail_count += int(r["count"])
        for r in grows:
            if r["kind"] == "derived":
                replicas[r["replica"]].derived[r["what"]] = {
                    "files": int(r["index"]),
                    "records": int(r["count"]),
                }
            if r["kind"] == "end":
                rs = replicas[r["replica"]]
                if int(r["index"]) >= rs.last_index:
                    rs.last_index = int(r["index"])
                    rs.end_file, rs.end_offset = r["file"], int(r["offset"])
        pair_acc: dict[tuple[str, str, bool], PairSummary] = {}
        for r in grows:
            if r["kind"] != "pair":
                continue
            committed = r["what"] == What.DIVERGENT_ENTRY.value
            key = (r["replica"], r["peer"], committed)
            p = pair_acc.get(key)
            if p is None:
                pair_acc[key] = PairSummary(
                    r["replica"], r["peer"], int(r["index"]), int(r["count"]), committed
                )
            else:
                p.first_divergent_index = min(p.first_divergent_index, int(r["index"]))
                p.count += int(r["count"])
        ranges, range_findings = compare_ranges(plan, collect_leaves(grows))
        range_findings.extend(_rolled_back(plan, replicas))
        findings = merge_findings(
            list(plan.findings)
            + [_finding_from_row(r) for r in grows if r["kind"] == "finding"]
            + range_findings
        )
        for rs in replicas.values():
            rs.status = _status(rs.replica, findings)
        sample = [dict(m) for m in mismatch_sample if m["group"] == plan.group]
        for m in sample:
            m["digest"] = f"{to_u64(int(m['digest'])):016x}"
            m["peer_digest"] = f"{to_u64(int(m['peer_digest'] or 0)):016x}"
        groups.append(
            GroupReport(
                plan.group,
                plan.audited_index,
                plan.audited_from,
                plan.first_index,
                list(replicas.values()),
                sorted(pair_acc.values(), key=lambda p: (not p.committed, p.replica, p.peer)),
                findings,
                mismatch_count=mismatch_counts.get(plan.group, 0),
                mismatch_sample=sample,
                ranges=ranges,
                feature_level=plan.feature_level,
            )
        )
    cpu_s = sum(int(r["count"] or 0) for r in rows if r["kind"] == "task") / 1e6
    return AuditReport(
        groups, master, session_start_s, job_s, tasks, parquet_path, cpu_s, workers_start_s
    )


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------


def _finding_json(f: Finding) -> dict[str, Any]:
    return {
        "what": f.what.value,
        "severity": severity_of(f.what).value,
        "group": f.group,
        "replica": f.replica,
        "peer": f.peer or None,
        "file": f.file,
        "path": f.path,
        "index": f.index,
        "index_end": f.index_end,
        "offset": f.offset,
        "count": f.count,
        "detail": f.detail,
    }


def report_json(report: AuditReport) -> dict[str, Any]:
    return {
        "version": REPORT_VERSION,
        "clean": report.clean,
        "exit_code": report.exit_code,
        "master": report.master,
        "session_start_s": round(report.session_start_s, 3),
        "workers_start_s": round(report.workers_start_s, 3),
        "job_s": round(report.job_s, 3),
        "tasks": report.tasks,
        "task_cpu_s": round(report.task_cpu_s, 3),
        "scanned_bytes": report.scanned_bytes,
        "reused": {
            "ranges": report.reused_ranges,
            "entries": report.reused_entries,
            "bytes": report.reused_bytes,
        },
        "parquet": report.parquet_path,
        "groups": [
            {
                "group": g.group,
                "audited_index": g.audited_index,
                "audited_from": g.audited_from,
                "first_index": g.first_index,
                "feature_level": g.feature_level,
                "replicas": [
                    {
                        "replica": r.replica,
                        "root": r.root,
                        "status": r.status,
                        "first_index": r.first_index,
                        "last_index": r.last_index,
                        "commit_index": r.commit_index,
                        "end": {"file": r.end_file, "offset": r.end_offset},
                        "committed": r.committed.as_json(),
                        "tail_count": r.tail_count,
                        "derived": r.derived,
                        "feature_level": r.feature_level,
                        "supported_feature_level": r.supported_feature_level or None,
                        "release": r.release or None,
                        "scanned_bytes": r.scanned_bytes,
                        "mb_per_s": round(report.mb_per_s(r.scanned_bytes), 1),
                        "segments": [
                            {
                                "file": s.file,
                                "committed": s.committed.as_json(),
                                "tail_count": s.tail_count,
                                "tail_bytes": s.tail_bytes,
                            }
                            for s in sorted(r.segments.values(), key=lambda s: s.file)
                        ],
                    }
                    for r in g.replicas
                ],
                "pairs": [asdict(p) for p in g.pairs],
                "findings": [_finding_json(f) for f in g.findings],
                "mismatch_count": g.mismatch_count,
                "mismatch_sample": g.mismatch_sample,
                "ranges": g.ranges.as_json(),
            }
            for g in report.groups
        ],
    }


def write_json(report: AuditReport, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report_json(report), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def _span(f: Finding) -> str:
    if f.index_end == -1:
        return f"{f.index}.."
    if f.index_end > f.index:
        return f"{f.index}..{f.index_end}"
    return str(f.index) if f.index else "-"


# The replica table's columns (docs/AUDIT.md "Reading the report").
SUMMARY_COLUMNS = (
    "replica",
    "first",
    "last",
    "commit",
    "audited",
    "bytes",
    "terms",
    "unordered",
    "ordered",
    "tail",
    "level",
    "MB/s",
    "status",
)


def write_summary(report: AuditReport, out: TextIO) -> None:
    for g in report.groups:
        out.write(
            f"group {g.group}: audited commit index {g.audited_index} (from {g.audited_from}), "
            f"first index {g.first_index}, feature level {g.feature_level}\n"
        )
        rows = [list(SUMMARY_COLUMNS)]
        for r in g.replicas:
            c = r.committed
            rows.append(
                [
                    r.replica,
                    str(r.first_index),
                    str(r.last_index) if r.last_index >= 0 else "?",
                    str(r.commit_index),
                    f"{c.first_index}..{c.last_index}" if c.count else "-",
                    str(c.bytes),
                    f"{c.min_term}..{c.max_term}" if c.count else "-",
                    f"{c.unordered:016x}",
                    f"{c.ordered:08x}",
                    str(r.tail_count),
                    f"{r.feature_level}/{r.supported_feature_level or '-'}",
                    f"{report.mb_per_s(r.scanned_bytes):.0f}",
                    r.status,
                ]
            )
        _table(rows, out)
        for r in g.replicas:
            if r.derived:
                parts = [
                    f"{k} {v['records']} records in {v['files']} files"
                    if k != "below_log"
                    else f"{v['records']} records below the log (retention) not checked"
                    for k, v in sorted(r.derived.items())
                ]
                out.write(f"  {r.replica} derived state checked: {', '.join(parts)}\n")
        rg = g.ranges
        if rg.leaves:
            out.write(
                f"  ranges: {rg.leaves} leaves of {rg.leaf_entries} indexes, fan-out "
                f"{rg.fanout}, {rg.levels} levels; compared in {rg.rounds} rounds "
                f"({rg.nodes_compared} digests), {len(rg.differing_leaves)} leaves differ\n"
            )
        for p in g.pairs:
            label = "diverge" if p.committed else "differ in the uncommitted tail"
            out.write(
                f"  {p.replica} and {p.peer} {label} from index {p.first_divergent_index} "
                f"({p.count} entries)\n"
            )
        for f in g.findings[:MAX_PRINTED_FINDINGS]:
            where = f"{f.file} offset {f.offset}" if f.file else f.path
            out.write(
                f"  {f.severity.value.upper():5} {f.what.value} replica={f.replica} "
                f"index={_span(f)} at {where}: {f.detail}\n"
            )
        if len(g.findings) > MAX_PRINTED_FINDINGS:
            out.write(f"  ... {len(g.findings) - MAX_PRINTED_FINDINGS} more in the JSON report\n")
        if g.mismatch_count:
            out.write(f"  {g.mismatch_count} divergent entry rows\n")
    mb = report.scanned_bytes / 1e6
    rate = report.mb_per_s(report.scanned_bytes)
    workers = (
        f", Python workers start {report.workers_start_s:.1f} s" if report.workers_start_s else ""
    )
    out.write(
        f"{'CLEAN' if report.clean else 'FAILED'}: {sum(len(g.errors) for g in report.groups)} "
        f"error(s); scanned {mb:.1f} MB in {report.tasks} tasks, job {report.job_s:.1f} s "
        f"({rate:.0f} MB/s; tasks used {report.task_cpu_s:.1f} CPU s), session start "
        f"{report.session_start_s:.1f} s{workers}, master {report.master}\n"
    )
    if report.reused_ranges:
        out.write(
            f"reused {report.reused_ranges} unchanged ranges from the digest store "
            f"({report.reused_entries} indexes, {report.reused_bytes / 1e6:.1f} MB not read)\n"
        )
    if report.parquet_path:
        out.write(f"divergent entry rows: {report.parquet_path}\n")
