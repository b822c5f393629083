"""A broker group's replica health, node by node: ``mqadmin replicaStatus``
(docs/CLUSTER.md "Replica status").

Every member is asked for its ``Metadata`` on its client port (the ``DLedgerClient`` service,
the same ACL as ``listMember``) twice: once for its commit index, then, at the lowest commit
index among the members that answered (an index all of them committed, so all must hold the
same entries there), for its chained checksum at that index (docs/RAFT.md section 13). The
report flags a member that is repairing, members whose chains differ at that common index,
non-zero damage counters and a member that did not answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc

from client.errors import MQClientError
from client.members import list_members
from client.route import ChannelPool

# One Metadata call: a node answers from memory (a few microseconds); a node that does not
# answer in this long is reported unreachable rather than holding the command up.
METADATA_TIMEOUT_S = 5.0

# Asks one node for its Metadata: (client address, chain index or 0) -> answer.
MetadataCall = Callable[[str, int], dpb.MetadataResponse]


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One member as it answered (``answer`` None: it did not; ``error`` says why)."""

    node_id: str
    client_addr: str
    answer: dpb.MetadataResponse | None
    error: str = ""
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    rows: tuple[ReplicaRow, ...]
    chain_index: int  # the common committed index the chains were compared at (0: none)
    flags: tuple[str, ...] = field(default=())  # group-wide findings, one line each

    @property
    def flagged(self) -> bool:
        return bool(self.flags) or any(r.flags for r in self.rows)


def metadata_caller(channels: ChannelPool) -> MetadataCall:
    def call(addr: str, chain_index: int) -> dpb.MetadataResponse:
        stub = dpb_grpc.DLedgerClientStub(channels.get(addr))
        resp: dpb.MetadataResponse = stub.Metadata(
            dpb.MetadataRequest(chain_index=chain_index), timeout=METADATA_TIMEOUT_S
        )
        return resp

    return call


def _ask(call: MetadataCall, addr: str, chain_index: int) -> dpb.MetadataResponse | str:
    """The answer, or the reason there is none (one line)."""
    if not addr:
        return "no client address known"
    try:
        return call(addr, chain_index)
    except grpc.RpcError as exc:
        err = MQClientError.from_rpc(exc)
        return f"{err.code}: {' '.join(err.message.split())[:200]}"


def node_flags(m: dpb.MetadataResponse) -> list[str]:
    """What one member's own answer shows that needs an operator."""
    flags = []
    if m.repairing:
        flags.append(f"repairing (log ends at {m.last_index}, promised {m.promised_index})")
    found = sum(m.corruption_found.values())
    if found:
        by = ",".join(f"{k}={v}" for k, v in sorted(m.corruption_found.items()) if v)
        flags.append(f"damage found {found} ({by})")
    if m.chain_mismatches:
        flags.append(f"chain mismatches in replication {m.chain_mismatches}")
    if m.committed_repairs:
        flags.append(f"committed entries repaired {m.committed_repairs}")
    rebuilt = sum(m.state_rebuilds.values())
    if rebuilt:
        by = ",".join(f"{k}={v}" for k, v in sorted(m.state_rebuilds.items()) if v)
        flags.append(f"state rebuilt after a content repair {rebuilt} ({by})")
    if m.rewind_restarts_recent > 1:
        # More than one rebuild within the member's window (docs/RAFT.md section 13): one
        # fault explains one; the member stops with REWIND_REPEATS past its limit.
        flags.append(
            f"restarted {m.rewind_restarts_recent} times in a row to rebuild its state after "
            "content repairs (it stops with REWIND_REPEATS past its limit): a peer may keep "
            "forging appends; turn on mTLS"
        )
    if m.chain_check_mismatches:
        flags.append(f"periodic chain check mismatches {m.chain_check_mismatches}")
    derived = sum(m.derived_mismatches.values())
    if derived:
        by = ",".join(f"{k}={v}" for k, v in sorted(m.derived_mismatches.items()) if v)
        flags.append(f"derived-state mismatches {derived} ({by})")
    return flags


def chain_flags(answers: dict[str, dpb.MetadataResponse], index: int) -> list[str]:
    """Members whose chains differ at ``index`` (a group-wide finding), and members that do
    not hold it (a snapshot base above it: not comparable, not a fault)."""
    known = {n: a.chain for n, a in answers.items() if a.chain_known and a.chain_index == index}
    if len(set(known.values())) <= 1:
        return []
    sides = ", ".join(f"{n}={v:016x}" for n, v in sorted(known.items()))
    return [f"chain differs at committed index {index}: {sides}"]


def level_flags(answers: dict[str, dpb.MetadataResponse]) -> list[str]:
    """Members whose release supports less than the group's feature level (the highest any
    member applied): the leader sends them nothing until they are upgraded. A member of a
    release before feature levels reports 0, read as level 1."""
    level = max((a.feature_level or 1 for a in answers.values()), default=1)
    return [
        f"{n} supports feature level {a.supported_feature_level or 1} < group level {level}: "
        f"upgrade it (runs {a.release or '0.2.0 or older'})"
        for n, a in sorted(answers.items())
        if (a.supported_feature_level or 1) < level
    ]


def replica_status(call: MetadataCall, members: Sequence[tuple[str, str]]) -> ReplicaReport:
    """Ask every member (node id, client address) and compare (see the module docstring)."""
    first = {node: _ask(call, addr, 0) for node, addr in members}
    up = {n: a for n, a in first.items() if isinstance(a, dpb.MetadataResponse)}
    index = min((a.commit_index for a in up.values()), default=0)
    answers: dict[str, dpb.MetadataResponse | str] = dict(first)
    if index:
        for node, addr in members:
            if node in up:
                answers[node] = _ask(call, addr, index)
    rows = []
    for node, addr in members:
        a = answers[node]
        if isinstance(a, str):
            rows.append(ReplicaRow(node, addr, None, a, (f"no answer: {a}",)))
        else:
            rows.append(ReplicaRow(node, addr, a, "", tuple(node_flags(a))))
    compared = {r.node_id: r.answer for r in rows if r.answer is not None}
    group_flags = (chain_flags(compared, index) if index else []) + level_flags(compared)
    return ReplicaReport(tuple(rows), index, tuple(group_flags))


def group_replica_status(channels: ChannelPool, addr: str) -> ReplicaReport:
    """The report of the group ``addr`` (any member's client address) belongs to."""
    members = list_members(channels, addr)
    return replica_status(
        metadata_caller(channels), [(m.node_id, m.client_addr) for m in members.members]
    )
