"""Driver side of the range comparison: join the tasks' leaf digests into one tree per
replica, descend where the trees differ, and name the replica that disagrees with the
majority on each differing leaf (``What.DAMAGED_RANGE``), with the repair procedure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spark_audit import merkle
from spark_audit.merkle import Leaf, Tree
from spark_audit.model import Finding, GroupPlan, ReplicaPlan, What, to_u64

# Differing leaves reported one by one; beyond it the rest are counted in the last finding.
MAX_RANGE_FINDINGS = 1000
# The repair of a replica the audit names as damaged (today's documented procedure: a
# member is replaced, docs/CLUSTER.md "Changing a group's members"; removed ids are never
# reused, so the replacement takes a new id).
REPAIR_PROCEDURE = (
    "replace member {replica} of group {group}: `mqadmin removeMember -n NAMESRV -b {group} "
    "-i {replica}` (locally: `mqcluster remove {replica}`); keep its store aside for analysis "
    "and never start {replica} on it again; then add a member with a new id and an empty "
    "store (locally: `mqcluster add`; on real machines: start a node with an empty store and "
    "dLegerJoinAddr, then `mqadmin promoteMember -n NAMESRV -b {group} -i NEWID`), see "
    'docs/CLUSTER.md "Changing a group\'s members"'
)


def repair_procedure(group: str, replica: str) -> str:
    return REPAIR_PROCEDURE.format(group=group, replica=replica)


@dataclass(slots=True)
class RangeSummary:
    """What the JSON report says about the range comparison of one group."""

    leaf_entries: int = merkle.LEAF_ENTRIES
    fanout: int = merkle.FANOUT
    leaves: int = 0
    levels: int = 0
    rounds: int = 0
    nodes_compared: int = 0
    roots: dict[str, str] = field(default_factory=dict)  # replica -> root digest (hex)
    differing_leaves: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "leaf_entries": self.leaf_entries,
            "fanout": self.fanout,
            "leaves": self.leaves,
            "levels": self.levels,
            "rounds": self.rounds,
            "nodes_compared": self.nodes_compared,
            "roots": self.roots,
            "differing_leaves": self.differing_leaves[:MAX_RANGE_FINDINGS],
        }


def collect_leaves(rows: Iterable[dict[str, Any]]) -> dict[str, dict[int, Leaf]]:
    """Per replica, leaf -> digest, the pieces several tasks reported added up."""
    out: dict[str, dict[int, Leaf]] = {}
    for r in rows:
        if r["kind"] != "leaf":
            continue
        leaves = out.setdefault(r["replica"], {})
        k = int(r["index"])
        leaves[k] = leaves.get(k, Leaf(0, 0)).add(int(r["count"]), to_u64(int(r["digest"])))
    return out


def _judged(plan: GroupPlan, leaf: int) -> tuple[int, int, list[ReplicaPlan]]:
    """The audited span of ``leaf`` and the replicas expected to hold all of it: their log
    starts at or before it and their own commit index covers it."""
    lo, hi = merkle.leaf_span(leaf, plan.leaf_entries)
    lo = max(lo, plan.first_index)
    hi = min(hi, plan.audited_index)
    judged = [
        rp
        for rp in plan.replicas
        if rp.first_index <= lo and (not rp.commit_known or rp.commit_index >= hi)
    ]
    return lo, hi, judged


def compare_ranges(
    plan: GroupPlan, leaves: dict[str, dict[int, Leaf]]
) -> tuple[RangeSummary, list[Finding]]:
    summary = RangeSummary(leaf_entries=plan.leaf_entries)
    if plan.audited_index < 1 or not plan.replicas:
        return summary, []
    n_leaves = merkle.leaf_of(plan.audited_index, plan.leaf_entries) + 1
    trees = {rp.replica: Tree(leaves.get(rp.replica, {}), n_leaves) for rp in plan.replicas}
    descent = merkle.descend(trees)
    summary.leaves = n_leaves
    summary.levels = len(next(iter(trees.values())).levels)
    summary.rounds = descent.rounds
    summary.nodes_compared = descent.nodes_compared
    summary.roots = {r: t.root.hex() for r, t in trees.items()}
    findings: list[Finding] = []
    for leaf in descent.differing_leaves:
        lo, hi, judged = _judged(plan, leaf)
        if hi < lo or len(judged) < 2:
            continue
        expected = hi - lo + 1
        got = {rp.replica: leaves.get(rp.replica, {}).get(leaf, Leaf(0, 0)) for rp in judged}
        # A replica whose commit index is unknown is judged only where it holds it all.
        unknown = {rp.replica for rp in judged if not rp.commit_known}
        got = {r: d for r, d in got.items() if r not in unknown or d.count == expected}
        verdict = merkle.judge_leaf(leaf, got)
        if not verdict.disagreeing:
            continue
        summary.differing_leaves.append(leaf)
        if len(findings) >= MAX_RANGE_FINDINGS:
            continue
        findings.extend(_range_findings(plan, lo, hi, expected, got, verdict))
    return summary, findings


def _range_findings(
    plan: GroupPlan,
    lo: int,
    hi: int,
    expected: int,
    got: dict[str, Leaf],
    verdict: merkle.LeafVerdict,
) -> list[Finding]:
    roots = {rp.replica: rp.root for rp in plan.replicas}
    out = []
    for r in verdict.disagreeing:
        d = got[r]
        held = f"holds {d.count} of its {expected} entries, digest {d.sum:016x}"
        if verdict.majority is None:
            detail = (
                f"indexes {lo}..{hi} (leaf {verdict.leaf}): {r} {held}; no majority of "
                f"{', '.join(sorted(got))} agrees on this range, so no replica can be named "
                "damaged: compare the divergent entries (--parquet) before repairing"
            )
            peer = ""
        else:
            m = verdict.majority
            detail = (
                f"indexes {lo}..{hi} (leaf {verdict.leaf}): {r} {held}; the majority "
                f"({', '.join(verdict.agreeing)}) holds {m.count} entries, digest "
                f"{m.sum:016x}; repair: {repair_procedure(plan.group, r)}"
            )
            peer = verdict.agreeing[0]
        out.append(
            Finding(What.DAMAGED_RANGE, plan.group, r, "", roots[r], lo, hi, -1, detail,
                    peer=peer, count=expected)
        )  # fmt: skip
    return out
