"""Snapshots in the core: a follower behind the leader's first index is caught up by one;
stale, malformed and foreign snapshots change nothing (dledger.core.snapshot)."""

from __future__ import annotations

import random

from dledger.core import (
    DROP_MALFORMED,
    DROP_SECOND_LEADER,
    AppendRequest,
    AppendResponse,
    InstallSnapshot,
    ProgressState,
    RaftConfig,
    RaftNode,
    Role,
)
from dledger.log import Entry, HardState
from dledger.sim.harness import Cluster
from dledger.sim.memlog import MemLog


def _lagging_cluster() -> tuple[Cluster, str, str]:
    """A leader that compacted its log past a follower that was cut off."""
    c = Cluster(3)
    leader = c.elect()
    lagging = next(n for n in c.ids if n != leader)
    c.isolated.add(lagging)
    for i in range(20):
        c.nodes[leader].propose([b"p%d" % i])
        c.deliver()
    applied = c.applied[leader][-1].index
    c.compact(leader, applied - 2)
    for nid in c.ids:
        if nid not in (leader, lagging):
            c.compact(nid, applied - 2)
    return c, leader, lagging


def test_follower_behind_the_first_index_is_caught_up_by_a_snapshot() -> None:
    c, leader, lagging = _lagging_cluster()
    first = c.logs[leader].first_index()
    assert c.logs[lagging].last_index() < first - 1
    c.isolated.clear()
    c.tick(times=10)  # a stalled replicate state falls back to probing within 5 ticks
    snaps = [m for m in c.sent if isinstance(m, InstallSnapshot)]
    assert len(snaps) == 1 and snaps[0].to_id == lagging
    log = c.logs[lagging]
    assert log.first_index() == snaps[0].snapshot_index + 1
    # Then appends: the follower holds the leader's log, applied state included.
    c.nodes[leader].propose([b"after"])
    c.deliver()
    assert log.last_index() == c.logs[leader].last_index()
    assert log.prefix_hash(log.last_index()) == c.logs[leader].prefix_hash(log.last_index())
    assert c.bodies(lagging)[-1] == b"after"
    assert c.nodes[lagging].commit_index == c.nodes[leader].commit_index
    assert c.nodes[leader].snapshots_sent == 1


def test_leader_sends_no_append_while_a_snapshot_is_in_flight_and_asks_again_on_failure() -> None:
    c, leader, lagging = _lagging_cluster()
    c.isolated.clear()
    c.drop = lambda m: isinstance(m, InstallSnapshot)  # the transfer never arrives
    c.tick(times=10)
    node = c.nodes[leader]
    pr = next(p for p in node.status().peers if p.peer_id == lagging)
    assert pr.state == ProgressState.SNAPSHOT.value
    sent = len(c.sent)
    c.tick(times=2)
    later = c.sent[sent:]
    appends = [m for m in later if isinstance(m, AppendRequest) and m.to_id == lagging]
    assert appends and all(not m.entries and m.prev_log_index == 0 for m in appends)
    assert not [m for m in later if isinstance(m, InstallSnapshot)]  # one in flight at a time
    node.report_snapshot(lagging, False)
    c.drop = None
    c.tick(times=10)
    assert c.logs[lagging].first_index() > 1  # asked again after the failure, then installed


def _follower_with_log(n: int) -> tuple[RaftNode, MemLog]:
    log = MemLog()
    log.append([Entry(1, i + 1, b"e%d" % (i + 1)) for i in range(n)])
    log.flush()
    log.save_hard_state(HardState(term=1))
    node = RaftNode("n1", ["n0", "n1", "n2"], log, RaftConfig(), random.Random(0))
    # Learn the leader and a commit index of n.
    node.step(AppendRequest("n0", "n1", 1, n, 1, (), n))
    while node.has_ready():
        node.advance(node.ready())
    assert node.commit_index == n
    return node, log


def test_snapshot_not_beyond_the_commit_index_is_ignored() -> None:
    node, log = _follower_with_log(10)
    node.step(InstallSnapshot("n0", "n1", 1, 8, 1))
    rd = node.ready()
    assert rd.snapshot is None and log.last_index() == 10
    (ack,) = rd.messages
    assert isinstance(ack, AppendResponse) and ack.success and ack.match_index == 10


def test_snapshot_whose_entry_the_log_holds_only_moves_the_commit() -> None:
    log = MemLog()
    log.append([Entry(1, i + 1, b"e") for i in range(10)])
    log.flush()
    log.save_hard_state(HardState(term=1))
    node = RaftNode("n1", ["n0", "n1", "n2"], log, RaftConfig(), random.Random(0))
    node.step(InstallSnapshot("n0", "n1", 1, 7, 1))
    rd = node.ready()
    assert rd.snapshot is None
    assert [e.index for e in rd.committed] == list(range(1, 8))


def test_snapshot_beyond_the_log_replaces_it_after_the_install() -> None:
    node, log = _follower_with_log(5)
    node.step(InstallSnapshot("n0", "n1", 2, 40, 2))
    assert node.term == 2 and node.leader_id == "n0"
    assert node.pending_snapshot is not None and node.last_index == 40
    rd = node.ready()
    assert rd.snapshot is not None and rd.snapshot.index == 40
    (ack,) = rd.messages  # sent only after the install (step 3)
    assert isinstance(ack, AppendResponse) and ack.match_index == 40
    assert not rd.committed
    log.install(rd.snapshot, [0] * 41, [rd.snapshot.chain] * 41)
    node.advance(rd)
    assert node.pending_snapshot is None
    assert node.status().applied_index == 40 and log.first_index() == 41
    # The next append continues from the snapshot.
    node.step(AppendRequest("n0", "n1", 2, 40, 2, (Entry(2, 41, b"x"),), 41))
    rd = node.ready()
    assert [e.index for e in rd.entries] == [41] and [e.index for e in rd.committed] == [41]


def test_malformed_and_foreign_snapshots_are_dropped() -> None:
    node, _ = _follower_with_log(5)
    for m in (
        InstallSnapshot("n0", "n1", 1, 0, 1),  # index 0
        InstallSnapshot("n0", "n1", 1, 9, 2),  # last term above the leader's
        InstallSnapshot("n0", "n1", 1, 1 << 63, 1),  # index beyond MAX_INDEX
    ):
        node.step(m)
    assert node.dropped[DROP_MALFORMED] == 3
    node.step(InstallSnapshot("n2", "n1", 1, 9, 1))  # n0 leads term 1
    assert node.dropped[DROP_SECOND_LEADER] == 1
    assert node.pending_snapshot is None and node.role is Role.FOLLOWER


def test_mutation_snapshot_out_of_order_installs_a_stale_one() -> None:
    log = MemLog()
    log.append([Entry(1, i + 1, b"e") for i in range(10)])
    log.flush()
    log.save_hard_state(HardState(term=1))
    cfg = RaftConfig(mutations=frozenset({"snapshot_out_of_order"}))
    node = RaftNode("n1", ["n0", "n1", "n2"], log, cfg, random.Random(0))
    node.step(AppendRequest("n0", "n1", 1, 10, 1, (), 10))
    while node.has_ready():
        node.advance(node.ready())
    node.step(InstallSnapshot("n0", "n1", 1, 6, 1))
    rd = node.ready()
    assert rd.snapshot is not None and rd.snapshot.index == 6  # rolls applied state back
