"""A DLedger member's Raft metrics (docs/METRICS.md "Raft").

Gauges are read at scrape time from the node's state (on its event loop: `mqmetrics.server`);
only the append and fsync histograms are fed on the way, by `RaftStats`, which a node has when
its process serves metrics (``DLedgerNode.raft_stats``; None: nothing is measured). Every label
set is bounded: ``peer`` by the group's members (`dledger.core.config.MAX_GROUP_SIZE`),
``role`` and ``reason`` by fixed vocabularies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from dledger.core import Role, Status
from dledger.log import Entry
from dledger.server.confrepair import REPAIR_SOURCES
from dledger.server.rewinds import MAX_REWIND_RESTARTS, REBUILD_KINDS, REWIND_RESTART_WINDOW_S
from mqmetrics.families import (
    counter,
    gauge,
    histogram,
    labelled_counter,
    labelled_gauge,
    state_set,
)
from mqmetrics.hot import BYTES_BUCKETS, COUNT_BUCKETS, FSYNC_BUCKETS_S, Histogram

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

ROLES = tuple(r.value for r in Role)


class RaftStats:
    """What the node measures on the way: each persist job's entries and bytes (on the event
    loop) and each data sync's seconds (in the store's flush threads, under its lock)."""

    __slots__ = ("append_bytes", "append_entries", "fsync_s")

    def __init__(self) -> None:
        self.append_entries = Histogram(COUNT_BUCKETS)
        self.append_bytes = Histogram(BYTES_BUCKETS)
        self.fsync_s = Histogram(FSYNC_BUCKETS_S)

    def appended(self, entries: Sequence[Entry]) -> None:
        self.append_entries.observe(len(entries))
        self.append_bytes.observe(sum(len(e.body) for e in entries))


def _feature_families(node: DLedgerNode, st: Status) -> list[Metric]:
    """The group feature level (docs/RAFT.md section 14) as this member sees it."""
    return [
        gauge(
            "raft_feature_level",
            "The group's committed feature level as this member applied it (docs/RAFT.md "
            '"Feature level")',
            node.feature_level(),
        ),
        gauge(
            "raft_supported_feature_level",
            "The highest group feature level this member's release supports",
            st.supported_feature_level,
        ),
        gauge(
            "raft_peers_below_feature_level",
            "On the leader: members whose last report is below the group's feature level, "
            "to which it sends no entries (upgrade them)",
            sum(1 for p in st.peers if p.withheld),
        ),
    ]


def raft_families(node: DLedgerNode) -> list[Metric]:
    """The Raft families of a started node."""
    st = (core := node.core).status()
    out: list[Metric] = [
        labelled_gauge(
            "node_info",
            "This member: its Raft group and node id (always 1)",
            ["group", "node"],
            [([node.cfg.group, node.cfg.self_id], 1)],
        ),
        state_set("raft_role", "1 for this member's Raft role", "role", ROLES, st.role.value),
        gauge("raft_term", "Current Raft term", st.term),
        gauge(
            "raft_commit_index",
            "Highest committed index in this member's stored log",
            st.commit_index,
        ),
        gauge("raft_applied_index", "Highest index applied to the state machine", st.applied_index),
        gauge("raft_last_index", "Last index of this member's log (stored or not)", st.last_index),
        gauge(
            "raft_first_index", "First index still in the log (retention)", node.store.first_index()
        ),
        gauge("raft_flushed_index", "Highest index durable on disk", node.store.flushed_index()),
        labelled_gauge(
            "raft_follower_match_index",
            "Leader only: highest index known replicated on each follower",
            ["peer"],
            (([p.peer_id], p.match_index) for p in st.peers),
        ),
        labelled_gauge(
            "raft_follower_lag_entries",
            "Leader only: entries of the leader's log each follower does not hold yet",
            ["peer"],
            (([p.peer_id], p.lag_entries) for p in st.peers),
        ),
        counter(
            "raft_pre_votes_started",
            "Pre-vote campaigns this member started",
            core.pre_votes_started,
        ),
        counter(
            "raft_elections_started",
            "Elections (new terms) this member started",
            core.elections_started,
        ),
        counter(
            "raft_elections_won", "Elections this member won (became leader)", core.elections_won
        ),
        gauge(
            "raft_repairing",
            "1 while this member's log ends below what it promised: no votes, no quorums",
            int(st.repairing),
        ),
        gauge(
            "raft_promised_index",
            "Highest index this member acknowledged as durable (its promise file)",
            st.promised_index,
        ),
        counter(
            "raft_repairs_completed",
            "Repairs this member completed since start (it votes and counts again)",
            st.repairs_completed,
        ),
        counter(
            "corruption_chain_mismatch",
            "Content mismatches this member saw: a peer's chain differs from its own at an "
            "index both hold with the same term (docs/RAFT.md section 13)",
            st.chain_mismatches,
        ),
        counter(
            "corruption_committed_repairs",
            "Times this member cut committed entries of its own that differed by content from "
            "its leader's, and took the leader's",
            st.committed_repairs,
        ),
        *_snapshot_families(node),
        labelled_counter(
            "raft_dropped_messages",
            "Peer messages dropped or refused, by reason (dledger.core and node DROP_*)",
            ["reason"],
            (([reason], n) for reason, n in sorted(node.dropped().items())),
        ),
    ]
    return [
        *out,
        *_feature_families(node, st),
        *_link_families(node),
        *_damage_families(node),
        *_stat_families(node.raft_stats),
    ]


# What finds damage (dledger.server.node DLedgerNode.on_damage and the store's open): a
# fixed vocabulary, so the label set is bounded.
# ``promise``: the promise file damaged in both slots at start (docs/RAFT.md section 11).
# ``membership``: membership.json damaged at start (dledger.server.confrepair).
DAMAGE_FINDERS = (
    "open",
    "start",
    "scrub",
    "read",
    "replication",
    "get",
    "snapshot",
    "promise",
    "membership",
)


def _chain_check_counts(node: DLedgerNode) -> dict[str, int]:
    """The chain check's mismatches by peer: every current member but this one (0 when none),
    and any former member that differed. Labels are member ids only, so the set is bounded by
    the group's members over the process's life."""
    counts = {p.peer_id: 0 for p in node.core.status().peers}
    counts.update(node.chain_check_mismatches)
    return counts


def _damage_families(node: DLedgerNode) -> list[Metric]:
    """Damage found in this member's log and the scrubber's progress (docs/METRICS.md
    "Damage and scrubbing"). Counted since the process started (a repair restarts it: the
    open that cut the damage counts it again as ``found_by="open"``)."""
    found = node.corruption_found
    repairs = node.membership_repairs
    report = node.store.damage
    scrub = node.scrubber
    out = [
        labelled_counter(
            "corruption_found",
            "Damaged log entries this member found, by what found them",
            ["found_by"],
            (([f], found.get(f, 0)) for f in DAMAGE_FINDERS),
        ),
        counter(
            "corruption_entries_cut",
            "Entries the last open cut from the log at damage (fetched again from the leader)",
            report.entries_lost if report is not None else 0,
        ),
        gauge(
            "corruption_first_damaged_index",
            "Index of the first damaged entry the last open cut (0: none)",
            report.first_index if report is not None else 0,
        ),
        labelled_counter(
            "corruption_state_rebuilds",
            "Rebuilds of the application's state this start carried out after a content "
            "repair it could not roll back in place, by how (replay of the log, or snapshot)",
            ["how"],
            (([how], node.state_rebuilds.get(how, 0)) for how in REBUILD_KINDS),
        ),
        gauge(
            "corruption_rewind_restarts_recent",
            "Restarts to rebuild the state after content repairs within the last "
            f"{REWIND_RESTART_WINDOW_S:.0f} s, as counted at this start (the member stops "
            f"with REWIND_REPEATS past {MAX_REWIND_RESTARTS}: a peer keeps forging)",
            node.rewind_restarts_recent,
        ),
        labelled_counter(
            "corruption_membership_repairs",
            "Damaged membership.json files this start repaired, by where the configuration "
            "came from (log, settings, quorum)",
            ["source"],
            (([src], repairs.get(src, 0)) for src in REPAIR_SOURCES),
        ),
        labelled_counter(
            "corruption_chain_check_mismatch",
            "Rounds of the periodic chain check in which a peer's chain differed from this "
            "leader's at a committed index (docs/RAFT.md section 13), by peer",
            ["peer"],
            (([peer], n) for peer, n in sorted(_chain_check_counts(node).items())),
        ),
    ]
    if scrub is None:
        return out
    return [
        *out,
        gauge("scrub_rate_bytes_per_second", "The scrubber's pace", scrub.bytes_per_s),
        counter(
            "scrub_bytes_verified", "Bytes of entries the scrubber checked", scrub.bytes_verified
        ),
        counter("scrub_entries_verified", "Entries the scrubber checked", scrub.entries_verified),
        counter("scrub_passes", "Complete passes of the scrubber over the log", scrub.passes),
        counter("scrub_damage_found", "Damaged entries the scrubber found", scrub.damage_found),
        gauge("scrub_next_index", "The next index the scrubber checks", scrub.position_index),
    ]


def _snapshot_families(node: DLedgerNode) -> list[Metric]:
    out, into = node.snapshots_out, node.snapshots_in
    return [
        counter("raft_snapshots_sent", "Snapshot transfers this leader completed", out.sent),
        counter(
            "raft_snapshots_failed",
            "Snapshot transfers this leader started that failed (restarted whole)",
            out.failed,
        ),
        counter(
            "raft_snapshot_bytes_sent",
            "Bytes of data this leader streamed in snapshots (runs of zeros not counted)",
            out.bytes_sent,
        ),
        counter(
            "raft_snapshots_installed",
            "Snapshots this member installed (it was behind its leader's first index)",
            into.installed,
        ),
    ]


def _link_families(node: DLedgerNode) -> list[Metric]:
    links = sorted(node.peer_links().items())
    return [
        labelled_counter(
            "raft_peer_reconnects",
            "Times the outbound stream to each peer broke and was reopened",
            ["peer"],
            (([p], link.reconnects) for p, link in links),
        ),
        labelled_counter(
            "raft_peer_messages_sent",
            "Messages written to each peer's stream",
            ["peer"],
            (([p], link.sent) for p, link in links),
        ),
        labelled_counter(
            "raft_peer_messages_dropped",
            "Messages to each peer dropped: its queue was full or its stream broke",
            ["peer"],
            (([p], link.dropped) for p, link in links),
        ),
        labelled_gauge(
            "raft_peer_link_socket",
            "1 while the link to each peer rides its peer socket, 0 otherwise (gRPC stream)",
            ["peer"],
            (([p], 1 if link.carrier == "socket" else 0) for p, link in links),
        ),
    ]


def _stat_families(stats: RaftStats | None) -> list[Metric]:
    """The histograms a node feeds when its process serves metrics."""
    if stats is None:
        return []
    return [
        histogram("raft_fsync_duration_seconds", "Seconds per data sync of the log", stats.fsync_s),
        histogram(
            "raft_append_entries",
            "Entries per append to the local log (one persist job)",
            stats.append_entries,
        ),
        histogram(
            "raft_append_bytes",
            "Entry body bytes per append to the local log",
            stats.append_bytes,
        ),
    ]
