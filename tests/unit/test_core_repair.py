"""Promises and the repair state (issue 31, docs/RAFT.md section 11): a member whose log ends
below what it acknowledged does not vote, campaign or count towards a commit until a leader
brought it back; a follower never claims a match it did not check."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    AppendRequest,
    AppendResponse,
    ConfigError,
    RaftConfig,
    RaftNode,
    Role,
    VoteRequest,
    VoteResponse,
)
from dledger.core.messages import REJECT_ALREADY_VOTED, REJECT_REPAIRING, Message
from dledger.core.repair import Promised, newer_hard_state
from dledger.log import Entry, HardState
from dledger.sim.harness import Cluster, drain, finish_ready
from dledger.sim.memlog import MemLog

CFG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, pre_vote=False)


def _grow(c: Cluster, leader: str, n: int) -> None:
    for i in range(n):
        c.nodes[leader].propose([b"e%d" % i])
        c.deliver()


def _forgetful_cluster(config: RaftConfig) -> tuple[Cluster, int]:
    """The issue's first scenario in a 3-node group: n2 is cut off while 20 entries commit on
    n0 (leader) and n1; n1's log is then put back to index 3 (its promise survives) and it
    restarts; the leader is cut off. Returns the cluster and the committed index."""
    c = Cluster(3, config)
    leader = c.elect()
    lagging = next(n for n in c.ids if n != leader)
    c.isolated.add(lagging)
    _grow(c, leader, 20)
    committed = c.nodes[leader].commit_index
    forgetful = next(n for n in c.ids if n not in (leader, lagging))
    assert c.logs[forgetful].promised >= committed > 3
    c.logs[forgetful].rollback(3)
    c.crash_and_restart(forgetful)
    c.isolated = {leader}
    return c, committed


def test_a_rolled_back_member_is_repairing_and_no_leader_loses_committed_entries() -> None:
    c, committed = _forgetful_cluster(CFG)
    leader = next(iter(c.isolated))
    forgetful = next(n for n in c.ids if c.nodes[n].repairing)
    st = c.nodes[forgetful].status()
    assert st.repairing and st.promised_index >= committed
    # The two others cannot elect a leader: the forgetful one neither campaigns nor votes.
    c.tick(times=60)
    assert c.leader() is None
    rejects = [
        m
        for m in c.sent
        if isinstance(m, VoteResponse) and m.from_id == forgetful and not m.granted
    ]
    assert rejects and all(m.reject_reason == REJECT_REPAIRING for m in rejects)
    assert not any(isinstance(m, VoteRequest) and m.from_id == forgetful for m in c.sent)
    # The old leader comes back, wins (its log has everything) and repairs the forgetful one.
    c.isolated = set()
    new = c.elect(2_000)
    assert c.nodes[new].commit_index >= committed
    c.tick_until(lambda: not c.nodes[forgetful].repairing, 500)
    node = c.nodes[forgetful]
    assert node.repairs_completed == 1 and node.status().repairs_completed == 1
    assert node.last_index >= committed
    for i in range(1, committed + 1):
        assert c.logs[forgetful].read(i) == c.logs[leader].read(i)


def test_mutation_forget_promise_elects_a_leader_that_lost_committed_entries() -> None:
    c, committed = _forgetful_cluster(_with(CFG, "forget_promise"))
    new = c.elect(2_000)
    assert new not in c.isolated
    assert c.nodes[new].last_index < committed or any(
        c.logs[new].read(i) != c.logs[next(iter(c.isolated))].read(i)
        for i in range(1, committed + 1)
    )


def _with(cfg: RaftConfig, mutation: str) -> RaftConfig:
    return RaftConfig(
        election_timeout_ticks=cfg.election_timeout_ticks,
        heartbeat_interval_ticks=cfg.heartbeat_interval_ticks,
        pre_vote=cfg.pre_vote,
        mutations=frozenset({mutation}),
    )


def test_a_repairing_followers_acks_count_towards_no_commit() -> None:
    log = MemLog()
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    while node.role is not Role.CANDIDATE:
        node.tick()
    drain(node, log)
    node.step(VoteResponse("n1", "n0", node.term, granted=True))
    drain(node, log)
    node.propose([b"x"])
    drain(node, log)
    term = node.term
    node.step(
        AppendResponse("n1", "n0", term, True, match_index=2, last_log_index=2, repairing=True)
    )
    drain(node, log)
    assert node.commit_index == 0  # n0 + a repairing n1: no majority
    node.step(AppendResponse("n1", "n0", term, True, match_index=2, last_log_index=2))
    drain(node, log)
    assert node.commit_index == 2


def _follower_with(entries: list[int], *, applied: int = 0) -> tuple[RaftNode, MemLog]:
    log = MemLog()
    log.save_hard_state(HardState(term=max(entries)))
    log.append([Entry(t, i + 1, b"e%d" % (i + 1)) for i, t in enumerate(entries)])
    log.flush()
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0), applied_index=applied)
    return node, log


def test_a_follower_never_acks_its_commit_index_without_checking_it() -> None:
    # The old leader of the issue: restarted with commit = applied = 5, its log conflicts
    # with the new leader's from index 4 on.
    node, log = _follower_with([1, 1, 1, 2, 2], applied=5)
    node.step(AppendRequest("n1", "n0", 3, 3, 1, (Entry(3, 4, b"x"),), 4))
    msgs = drain(node, log)
    # Its committed entry 4 differs from the leader's: never acknowledged as a match up to
    # the commit index 5 (the bug), but repaired (docs/RAFT.md section 13): the leader's entry
    # taken, and the only ack is of what it now holds of the leader's log.
    assert [m.match_index for m in msgs if isinstance(m, AppendResponse) and m.success] == [4]
    assert log.read(4).body == b"x" and node.status().committed_repairs == 1
    # A heartbeat whose prev matches is answered with that prev, not the commit index.
    node.step(AppendRequest("n1", "n0", 3, 3, 1, (), 4))
    acks = [m for m in drain(node, log) if isinstance(m, AppendResponse)]
    assert [(m.success, m.match_index) for m in acks] == [(True, 3)]


def test_start_with_applied_above_the_log_only_within_the_promise() -> None:
    log = MemLog()
    log.append([Entry(1, i, b"") for i in (1, 2, 3)])
    log.flush()
    node = RaftNode(
        "n0", ["n1", "n2"], log, CFG, random.Random(0), applied_index=8, promised=Promised(10)
    )
    assert node.repairing and node.commit_index == 3 and node.status().applied_index == 8
    with pytest.raises(ConfigError, match="promised index 10"):
        RaftNode(
            "n0", ["n1", "n2"], log, CFG, random.Random(0), applied_index=11, promised=Promised(10)
        )
    # Entries up to the applied index are not handed out again once a leader resends them.
    node.step(
        AppendRequest("n1", "n0", 2, 3, 1, tuple(Entry(1, i, b"%d" % i) for i in range(4, 11)), 10)
    )
    committed = []
    while node.has_ready():
        rd = node.ready()
        committed += [e.index for e in rd.committed]
        log.append(rd.entries)
        log.flush()
        log.save_promise(rd.promise, rd.hard_state)
        node.advance(rd)
    assert committed == [9, 10]
    assert not node.repairing and node.repairs_completed == 1


def test_promise_grows_with_acks_and_the_leaders_own_log_only() -> None:
    node, log = _follower_with([1, 1])
    node.step(AppendRequest("n1", "n0", 1, 2, 1, (Entry(1, 3, b"c"),), 2))
    rd = node.ready()
    assert rd.promise == 3 and rd.must_persist()
    finish_ready(node, log, rd)
    assert node.promised_index == 3 == log.promised
    node.step(AppendRequest("n1", "n0", 1, 3, 1, (), 3))  # a heartbeat: nothing new
    rd = node.ready()
    assert rd.promise is None and not rd.must_persist()
    finish_ready(node, log, rd)


def test_a_rolled_back_leader_candidate_does_not_campaign() -> None:
    node, _ = _follower_with([1, 1])
    log = MemLog()
    log.append([Entry(1, 1, b"")])
    log.flush()
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0), promised=Promised(5))
    for _ in range(100):
        node.tick()
    assert node.role is Role.FOLLOWER and node.term == 0


def test_lost_hard_state_takes_the_first_leaders_term_as_voted() -> None:
    log = MemLog()
    log.append([Entry(2, 1, b""), Entry(2, 2, b"")])
    log.flush()
    node = RaftNode(
        "n0", ["n1", "n2"], log, CFG, random.Random(0), promised=Promised(0, vote_lost=True)
    )
    assert node.repairing
    node.step(VoteRequest("n2", "n0", 4, 9, 3))
    assert [m.reject_reason for m in drain(node, log) if isinstance(m, VoteResponse)] == [
        REJECT_REPAIRING
    ]
    node.step(AppendRequest("n1", "n0", 4, 2, 2, (Entry(4, 3, b""),), 3))
    drain(node, log)
    assert node.voted_for == "n1" and not node.repairing
    # Another candidate of that term gets no vote: the term counts as voted.
    node.step(VoteRequest("n2", "n0", 4, 9, 4))
    resp = [m for m in drain(node, log) if isinstance(m, VoteResponse)]
    assert resp[0].reject_reason in (REJECT_ALREADY_VOTED, "leader_lease") and not resp[0].granted


def test_newer_hard_state_prefers_the_higher_term_then_the_vote() -> None:
    assert newer_hard_state(None, None) is None
    assert newer_hard_state(None, HardState(3, "a")) == HardState(3, "a")
    assert newer_hard_state(HardState(4), HardState(3, "a")) == HardState(4)
    assert newer_hard_state(HardState(3), HardState(3, "a")) == HardState(3, "a")
    assert newer_hard_state(HardState(3, "b"), HardState(3)) == HardState(3, "b")


def test_lost_meta_is_recovered_from_the_promise_copy_no_double_vote() -> None:
    c = Cluster(3, CFG)
    leader = c.elect()
    _grow(c, leader, 3)
    voter = next(n for n in c.ids if n != leader)
    hs = c.logs[voter].load_hard_state()
    assert hs.voted_for is not None or hs.term > 0
    c.logs[voter].lose_meta()
    node = c.crash_and_restart(voter)
    assert (node.term, node.voted_for) == (hs.term, hs.voted_for)
    assert not node.repairing


# --- An unknown promise: the promise file damaged in both slots (docs/RAFT.md section 11) ---


def _unknown_promise_follower() -> tuple[RaftNode, MemLog]:
    """n0 holds 1..3 of term 2 and a good ``meta`` (term 2, voted n1), but its promise file
    is damaged in both slots: what it acknowledged beyond index 3 is unknown."""
    log = MemLog()
    log.append([Entry(2, i, b"e%d" % i) for i in (1, 2, 3)])
    log.flush()
    log.save_hard_state(HardState(2, "n1"))
    log.damage_promise()
    promised, hs = log.start_state()
    assert promised == Promised(3, vote_lost=True) and hs == HardState(2, "n1")
    node = RaftNode(
        "n0", ["n1", "n2"], log, CFG, random.Random(0), promised=promised, hard_state=hs
    )
    return node, log


def _append(
    node: RaftNode, log: MemLog, prev: int, prev_term: int, entries: list[Entry], commit: int
) -> list[Message]:
    node.step(AppendRequest("n1", "n0", 4, prev, prev_term, tuple(entries), commit))
    return drain(node, log)


def test_an_unknown_promise_repairs_past_the_leaders_commit_index_not_its_first_entry() -> None:
    node, log = _unknown_promise_follower()
    assert node.repairing
    node.step(VoteRequest("n2", "n0", 4, 9, 3))
    votes = [m for m in drain(node, log) if isinstance(m, VoteResponse)]
    assert [m.reject_reason for m in votes] == [REJECT_REPAIRING] and not votes[0].granted
    # The leader of term 4 announces commit index 6 in its first append (the follower may
    # have acknowledged up to there before it lost its promise). An entry of term 4 alone
    # (the rule of a known promise) does not end the repair.
    out = _append(node, log, 3, 2, [Entry(4, 4, b"")], 6)
    acks = [m for m in out if isinstance(m, AppendResponse)]
    assert acks and all(m.repairing for m in acks)
    assert node.repairing and node.voted_for == "n1"
    # A later append with a higher commit index does not move the target (no chasing).
    _append(node, log, 4, 4, [Entry(4, 5, b"x")], 9)
    assert node.repairing
    _append(node, log, 5, 4, [Entry(4, 6, b"y")], 9)
    assert not node.repairing and node.repairs_completed == 1
    # Term 4 counts as voted: another candidate of that term gets nothing.
    node.step(VoteRequest("n2", "n0", 4, 9, 4))
    resp = [m for m in drain(node, log) if isinstance(m, VoteResponse)]
    assert resp and not resp[0].granted


def test_an_unknown_promise_needs_an_entry_of_the_leaders_term() -> None:
    """A new leader's commit index may lag what the previous term committed: the repair
    also needs an entry of the leader's own term (it comes after all it held when elected)."""
    node, log = _unknown_promise_follower()
    _append(node, log, 3, 2, [Entry(2, 4, b"a"), Entry(2, 5, b"b")], 2)
    assert node.repairing  # past the commit index 2, but no entry of term 4 yet
    _append(node, log, 5, 2, [Entry(4, 6, b"")], 2)
    assert not node.repairing


def test_a_damaged_promise_and_a_rollback_elect_no_leader_that_lost_committed_entries() -> None:
    """The issue's scenario with the promise file damaged too: the forgetful member neither
    votes nor counts until the old leader is back and has repaired it; then it votes again."""
    c = Cluster(3, CFG)
    leader = c.elect()
    lagging = next(n for n in c.ids if n != leader)
    c.isolated.add(lagging)
    _grow(c, leader, 20)
    committed = c.nodes[leader].commit_index
    forgetful = next(n for n in c.ids if n not in (leader, lagging))
    c.logs[forgetful].rollback(3)
    c.logs[forgetful].damage_promise()
    c.crash_and_restart(forgetful)
    assert c.nodes[forgetful].repairing
    c.isolated = {leader}
    before = len(c.sent)
    c.tick(times=60)
    assert c.leader() is None  # the forgetful one grants no vote to the lagging one
    votes = [m for m in c.sent[before:] if isinstance(m, VoteResponse) and m.from_id == forgetful]
    assert votes and not any(m.granted for m in votes)
    c.isolated = set()
    new = c.elect(2_000)
    assert c.nodes[new].commit_index >= committed
    c.tick_until(lambda: not c.nodes[forgetful].repairing, 500)
    assert not c.nodes[forgetful].repairing
    for i in range(1, committed + 1):
        assert c.logs[forgetful].read(i) == c.logs[new].read(i)
    # It votes again: with the leader gone, it and the lagging member elect one of them.
    c.isolated = {new}
    other = c.elect(3_000)
    assert other != new and c.nodes[other].commit_index >= committed
