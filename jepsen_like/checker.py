"""Checkers over a history and the final state of the group. Pure functions, no I/O.

Each returns a :class:`CheckResult`; a run passes when every result is valid. Values are
unique integers; a read is ``[queue, offset, v]`` (for the ``log`` workload the queue is 0
and the offset is the Raft index).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from jepsen_like.history import MONITOR, NEMESIS, Op, pairs

logger = logging.getLogger(__name__)

# Examples kept per checker in results.json (the counts are always complete).
MAX_EXAMPLES = 20
WRITE_FS = frozenset({"send", "append"})
READ_FS = frozenset({"poll", "read"})
DRAIN_F = "drain"
# The nemesis that damages stores (jepsen_like.nemesis), and what a damaged node must be
# again: a voter that leads or follows, repaired within this many seconds of its damage
# (issue 31 "Must show": repaired and voting again within 60 s, with no manual step).
STORAGE = "storage"
VOTING_ROLES = frozenset({"LEADER", "FOLLOWER"})
REPAIRED_WITHIN_S = 60.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    valid: bool
    count: int  # how many problems (or, for ``duplicated``, duplicated values)
    summary: str
    examples: list[Any] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NodeState:
    """What one node holds after heal: entry checksums up to its commit index, its chained
    checksum at the index the nodes were compared to (``chain_index``, 0: not known), its
    ConsumeQueues (queue key -> ``[(offset, msg_id)]``), its role, repair state and whether
    the configuration has it as a voter; ``error`` when it could not be read."""

    node: str
    commit_index: int = 0
    last_index: int = 0
    checksums: list[tuple[int, int, int]] = field(default_factory=list)  # (index, term, crc)
    consume_queues: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    error: str = ""
    role: str = ""
    repairing: bool = False
    voter: bool = False
    chain_index: int = 0
    chain: int = 0

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> NodeState:
        return NodeState(
            node=str(d["node"]),
            commit_index=int(d.get("commit_index", 0)),
            last_index=int(d.get("last_index", 0)),
            checksums=[(int(a), int(b), int(c)) for a, b, c in d.get("checksums", [])],
            consume_queues={
                str(k): [(int(o), str(m)) for o, m in v]
                for k, v in d.get("consume_queues", {}).items()
            },
            error=str(d.get("error", "")),
            role=str(d.get("role", "")),
            repairing=bool(d.get("repairing", False)),
            voter=bool(d.get("voter", False)),
            chain_index=int(d.get("chain_index", 0)),
            chain=int(d.get("chain", 0)),
        )


def _ex(items: Iterable[Any]) -> list[Any]:
    out = []
    for i, item in enumerate(items):
        if i >= MAX_EXAMPLES:
            break
        out.append(item)
    return out


class _Index:
    """Facts the checkers share: writes by outcome, reads, and the final drain."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self.invoked: dict[int, Op] = {}
        self.acked: dict[int, tuple[Op, Op]] = {}  # v -> (invoke, ok)
        self.failed: set[int] = set()
        self.unknown: set[int] = set()
        self.reads: list[tuple[Op, list[tuple[int, int, int]]]] = []
        self.drain: list[tuple[int, int, int]] = []
        self.drain_failed: list[Op] = []
        self.drain_done = False
        for inv, done in pairs(ops):
            if inv.f in WRITE_FS:
                v = int(inv.value["v"])
                self.invoked[v] = inv
                if done is None or done.type == "info":
                    self.unknown.add(v)
                elif done.type == "ok":
                    self.acked[v] = (inv, done)
                else:
                    self.failed.add(v)
            elif inv.f in READ_FS or inv.f == DRAIN_F:
                if done is None or done.type != "ok":
                    if inv.f == DRAIN_F:
                        self.drain_failed.append(done or inv)
                    continue
                triples = [(int(q), int(o), int(v)) for q, o, v in done.value]
                if inv.f == DRAIN_F:
                    self.drain.extend(triples)
                    self.drain_done = True
                else:
                    self.reads.append((done, triples))
        # value -> drain positions; (queue, offset) -> value
        self.drain_pos: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.at: dict[tuple[int, int], int] = {}
        for q, o, v in self.drain:
            self.drain_pos[v].append((q, o))
            self.at[(q, o)] = v


def check_lost(ix: _Index) -> CheckResult:
    """Acknowledged writes that the final drain did not read (must be none)."""
    if not ix.drain_done or ix.drain_failed:
        return CheckResult(
            "lost",
            False,
            len(ix.acked),
            "the final drain did not complete, so nothing acknowledged can be shown present",
            _ex(op.value for op in ix.drain_failed),
        )
    lost = sorted(v for v in ix.acked if v not in ix.drain_pos)
    recovered = sum(1 for v in ix.unknown if v in ix.drain_pos)
    stats = {
        "acknowledged": len(ix.acked),
        "unknown_outcome": len(ix.unknown),
        "unknown_but_present": recovered,
        "failed": len(ix.failed),
        "drained": len(ix.drain),
    }
    examples = [
        {"v": v, "acked_at": ix.acked[v][1].time, "reported": ix.acked[v][1].value}
        for v in _ex(lost)
    ]
    return CheckResult(
        "lost",
        not lost,
        len(lost),
        f"{len(lost)} of {len(ix.acked)} acknowledged writes missing from the final drain",
        examples,
        stats,
    )


def check_unexpected(ix: _Index) -> CheckResult:
    """Reads of values that were never sent, or sent and then definitely failed."""
    seen = [(q, o, v) for _, triples in ix.reads for q, o, v in triples] + ix.drain
    bad = [
        {"queue": q, "offset": o, "v": v, "why": "never sent" if v not in ix.invoked else "failed"}
        for q, o, v in seen
        if v not in ix.invoked or v in ix.failed
    ]
    return CheckResult(
        "unexpected", not bad, len(bad), f"{len(bad)} reads of values never (or not) sent", _ex(bad)
    )


def check_duplicated(ix: _Index, max_duplicates: int = 0) -> CheckResult:
    """Values stored at more than one position (the producer's msg id dedup should make this
    0; ``max_duplicates`` allows an at-least-once budget)."""
    dups = {v: pos for v, pos in ix.drain_pos.items() if len(pos) > 1}
    return CheckResult(
        "duplicated",
        len(dups) <= max_duplicates,
        len(dups),
        f"{len(dups)} values stored more than once (allowed {max_duplicates})",
        _ex({"v": v, "positions": pos} for v, pos in sorted(dups.items())),
    )


def check_order(ix: _Index) -> CheckResult:
    """Read order agrees with commit order; acknowledgements agree with the log; real time.

    - the drain of each queue has strictly increasing offsets;
    - an acknowledged write is found at the (queue, offset) its acknowledgement reported;
    - a read during the run saw, at each (queue, offset), the value the drain has there, and
      each process read each queue at increasing offsets;
    - real time: if write A was acknowledged before write B was invoked, A precedes B in
      their queue.
    """
    problems: list[dict[str, Any]] = []
    last: dict[int, int] = {}
    for q, o, v in ix.drain:
        if q in last and o <= last[q]:
            problems.append({"kind": "drain-not-increasing", "queue": q, "offset": o, "v": v})
        last[q] = o
    for v, (_inv, ok) in ix.acked.items():
        reported = (int(ok.value["queue"]), int(ok.value["offset"]))
        found = ix.at.get(reported)
        if v in ix.drain_pos and found != v:
            problems.append(
                {"kind": "ack-position", "v": v, "reported": list(reported), "holds": found}
            )
    read_last: dict[tuple[str, int], int] = {}
    for op, triples in ix.reads:
        for q, o, v in triples:
            if ix.drain_done and ix.at.get((q, o)) != v:
                problems.append(
                    {
                        "kind": "read-diverges",
                        "process": op.process,
                        "queue": q,
                        "offset": o,
                        "read": v,
                        "final": ix.at.get((q, o)),
                        "time": op.time,
                    }
                )
            key = (op.process, q)
            if key in read_last and o <= read_last[key]:
                problems.append(
                    {"kind": "read-backwards", "process": op.process, "queue": q, "offset": o}
                )
            read_last[key] = o
    # Real-time order, per queue, over acknowledged writes at their drained positions:
    # walking offsets downwards, the earliest ack among later positions must not precede
    # the invoke of the write at this position.
    by_queue: dict[int, list[tuple[int, float, float, int]]] = defaultdict(list)
    for v, (inv, ok) in ix.acked.items():
        pos = ix.drain_pos.get(v)
        if pos:
            q, o = pos[0]
            by_queue[q].append((o, inv.time, ok.time, v))
    for q, rows in by_queue.items():
        rows.sort()
        min_ok = float("inf")
        min_ok_v = -1
        for o, inv_t, ok_t, v in reversed(rows):
            if min_ok < inv_t:
                problems.append(
                    {
                        "kind": "real-time",
                        "queue": q,
                        "v": v,
                        "offset": o,
                        "invoked_at": inv_t,
                        "later_v_acked_at": min_ok,
                        "later_v": min_ok_v,
                    }
                )
            if ok_t < min_ok:
                min_ok, min_ok_v = ok_t, v
    kinds: dict[str, int] = defaultdict(int)
    for p in problems:
        kinds[p["kind"]] += 1
    return CheckResult(
        "order",
        not problems,
        len(problems),
        f"{len(problems)} order violations" + (f" {dict(kinds)}" if kinds else ""),
        _ex(problems),
        {"reads": sum(len(t) for _, t in ix.reads), "by_kind": dict(kinds)},
    )


def check_replicas(nodes: Sequence[NodeState], convergence: str = "") -> CheckResult:
    """After heal every node committed and applied the leader's whole log (``convergence``
    is why not, as the run saw it), holds the same entries (index, term, checksum) up to the
    common commit index it was read to, and the same ConsumeQueues."""
    problems: list[dict[str, Any]] = []
    if not nodes:
        return CheckResult("replicas", False, 1, "no node state was collected")
    if convergence:
        problems.append({"kind": "not-converged", "why": convergence})
    for n in nodes:
        if n.error:
            problems.append({"kind": "unreadable", "node": n.node, "error": n.error})
    ok_nodes = [n for n in nodes if not n.error]
    commits = {n.node: n.commit_index for n in ok_nodes}
    if ok_nodes:
        ref = max(ok_nodes, key=lambda n: len(n.checksums))
        for n in ok_nodes:
            if n is ref:
                continue
            for mine, theirs in zip(n.checksums, ref.checksums, strict=False):
                if mine != theirs:
                    problems.append(
                        {
                            "kind": "entry-differs",
                            "index": mine[0],
                            n.node: list(mine),
                            ref.node: list(theirs),
                        }
                    )
                    break
            if len(n.checksums) != len(ref.checksums):
                problems.append(
                    {
                        "kind": "log-length-differs",
                        n.node: len(n.checksums),
                        ref.node: len(ref.checksums),
                    }
                )
        problems += _chain_problems(ok_nodes)
        problems += _queue_problems(ok_nodes)
    return CheckResult(
        "replicas",
        not problems,
        len(problems),
        f"{len(problems)} replica disagreements over {len(nodes)} nodes",
        _ex(problems),
        {
            "commit_index": commits,
            "entries_compared": min((len(n.checksums) for n in ok_nodes), default=0),
            "queues_compared": len({k for n in ok_nodes for k in n.consume_queues}),
        },
    )


def _queue_problems(nodes: Sequence[NodeState]) -> list[dict[str, Any]]:
    """Each node's ConsumeQueues against the node that holds the most records: the first
    record where a queue differs."""
    problems: list[dict[str, Any]] = []
    cq_ref = max(nodes, key=lambda n: sum(len(v) for v in n.consume_queues.values()))
    for n in nodes:
        if n is cq_ref:
            continue
        for key in sorted(set(n.consume_queues) | set(cq_ref.consume_queues)):
            mine_q = n.consume_queues.get(key, [])
            ref_q = cq_ref.consume_queues.get(key, [])
            if mine_q != ref_q:
                first = next(
                    (i for i, (a, b) in enumerate(zip(mine_q, ref_q, strict=False)) if a != b),
                    min(len(mine_q), len(ref_q)),
                )
                problems.append(
                    {
                        "kind": "consume-queue-differs",
                        "queue": key,
                        "at": first,
                        n.node: len(mine_q),
                        cq_ref.node: len(ref_q),
                    }
                )
    return problems


def _chain_problems(nodes: Sequence[NodeState]) -> list[dict[str, Any]]:
    """Nodes whose chained checksums (docs/RAFT.md section 13: equal chains at ``i`` mean
    equal entries ``1..i``, content included) differ at the same committed index."""
    by_index: dict[int, dict[str, int]] = defaultdict(dict)
    for n in nodes:
        if n.chain_index > 0:
            by_index[n.chain_index][n.node] = n.chain
    return [
        {"kind": "chain-differs", "index": i, **{k: f"{v:016x}" for k, v in sorted(ch.items())}}
        for i, ch in sorted(by_index.items())
        if len(set(ch.values())) > 1
    ]


def _repair_times(ops: Sequence[Op], faults: Sequence[Op]) -> list[dict[str, Any]]:
    """Per storage fault: seconds from the damage to the first state poll of the node that
    showed it not repairing after the last one that showed it repairing (before the node's
    next fault); ``None`` while it was still repairing at its last poll."""
    polls: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for op in ops:
        if op.process == MONITOR and op.f == "state" and op.type == "ok":
            polls[str(op.value["node"])].append((op.time, bool(op.value.get("repairing"))))
    out = []
    for k, f in enumerate(faults):
        node = str(f.value["node"])
        later = [g.time for g in faults[k + 1 :] if g.value["node"] == node]
        end = min(later, default=float("inf"))
        seen = [(t, r) for t, r in polls[node] if f.time <= t < end]
        last_repairing = max((t for t, r in seen if r), default=None)
        took: float | None = 0.0
        if last_repairing is not None:
            healthy = [t for t, r in seen if t > last_repairing and not r]
            took = round(healthy[0] - f.time, 2) if healthy else None
        out.append(
            {"node": node, "damage": f.value.get("damage"), "at": round(f.time, 2), "took": took}
        )
    return out


def check_repaired(ops: Sequence[Op], nodes: Sequence[NodeState] | None) -> CheckResult:
    """Every node the storage nemesis damaged repaired itself: it never refused to start
    (the harness then wipes the store: a manual step), it was not seen repairing longer than
    :data:`REPAIRED_WITHIN_S` after its damage, and at the end (``nodes``; None: a history
    alone, not checked) it answers, is not repairing, leads or follows, and is a voter of the
    configuration. A damaged node the membership nemesis removed is only counted."""
    faults = [
        op
        for op in ops
        if op.process == NEMESIS
        and op.f == "start"
        and op.value.get("fault") == STORAGE
        and "node" in op.value
        and not op.value.get("skipped")
    ]
    damaged = sorted({str(f.value["node"]) for f in faults})
    problems: list[dict[str, Any]] = [
        {"kind": "refused-start", **{k: op.value.get(k) for k in ("node", "damage", "reason")}}
        for op in ops
        if op.process == NEMESIS and op.f == "refused" and op.value.get("fault") == STORAGE
    ]
    times = _repair_times(ops, faults)
    for t in times:
        if t["took"] is not None and t["took"] > REPAIRED_WITHIN_S:
            problems.append({"kind": "slow-repair", **t})
    removed: list[str] = []
    by_node = {n.node: n for n in nodes or []}
    for node in damaged if nodes is not None else []:
        n = by_node.get(node)
        if n is None:
            removed.append(node)
        elif n.error:
            problems.append({"kind": "unreadable", "node": node, "error": n.error})
        elif n.repairing or not n.voter or n.role not in VOTING_ROLES:
            problems.append(
                {
                    "kind": "not-voting",
                    "node": node,
                    "repairing": n.repairing,
                    "voter": n.voter,
                    "role": n.role,
                }
            )
    kinds: dict[str, int] = defaultdict(int)
    for f in faults:
        kinds[str(f.value.get("damage"))] += 1
    done = [t["took"] for t in times if t["took"] is not None]
    return CheckResult(
        "repaired",
        not problems,
        len(problems),
        f"{len(problems)} problems over {len(faults)} storage faults on {damaged or 'no node'}",
        _ex(problems),
        {
            "faults": dict(kinds),
            "removed_by_membership": removed,
            "repairs": _ex(times),
            "longest_repair_s": max(done, default=0.0),
        },
    )


def check_leaders(ops: Sequence[Op]) -> CheckResult:
    """At most one leader per term among the states the monitor polled."""
    leaders: dict[int, set[str]] = defaultdict(set)
    polls = 0
    for op in ops:
        if op.process == MONITOR and op.f == "state" and op.type == "ok":
            polls += 1
            if op.value.get("role") == "LEADER":
                leaders[int(op.value["term"])].add(str(op.value["node"]))
    bad = {t: sorted(ns) for t, ns in leaders.items() if len(ns) > 1}
    return CheckResult(
        "leaders",
        not bad,
        len(bad),
        f"{len(bad)} terms with more than one leader ({len(leaders)} terms seen)",
        _ex({"term": t, "leaders": ns} for t, ns in sorted(bad.items())),
        {"polls": polls, "terms_with_leader": len(leaders)},
    )


def check_all(
    ops: Sequence[Op],
    nodes: Sequence[NodeState] | None,
    max_duplicates: int = 0,
    convergence: str = "",
) -> list[CheckResult]:
    """Every checker; ``nodes`` None skips the replica check (e.g. a history file alone);
    ``convergence``: why the nodes did not all catch up with the leader after heal."""
    ix = _Index(ops)
    results = [
        check_lost(ix),
        check_unexpected(ix),
        check_duplicated(ix, max_duplicates),
        check_order(ix),
    ]
    if nodes is not None:
        results.append(check_replicas(nodes, convergence))
    results.append(check_repaired(ops, nodes))
    results.append(check_leaders(ops))
    return results


def index(ops: Sequence[Op]) -> _Index:
    """The shared facts of a history (exposed for the report's counts)."""
    return _Index(ops)
