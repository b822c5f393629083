"""Peers as adversaries (issue 16): the core drops and counts what no honest member could send,
and never raises out of step() or tick() for it."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    CAMPAIGN_REFUSED_MAX_TERM,
    DROP_ACK_BEYOND_LAST,
    DROP_MALFORMED,
    DROP_NOT_MEMBER,
    DROP_SECOND_LEADER,
    DROP_TERM_OUT_OF_RANGE,
    DROP_UNEXPECTED_TIMEOUT_NOW,
    MAX_TERM,
    MAX_TERM_JUMP,
    AppendRequest,
    AppendResponse,
    Message,
    ProposalTooLargeError,
    RaftConfig,
    RaftNode,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.log import Entry, HardState
from dledger.server.convert import from_pb, to_pb, validate
from dledger.sim.harness import drain
from dledger.sim.memlog import MemLog

CFG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, pre_vote=False)


def _drain(node: RaftNode, log: MemLog) -> list[Message]:
    return drain(node, log)


def _leader(config: RaftConfig = CFG) -> tuple[RaftNode, MemLog]:
    """n0 of {n0, n1, n2}, elected with n1's vote; its NOOP at index 1 is not replicated."""
    log = MemLog()
    node = RaftNode("n0", ["n1", "n2"], log, config, random.Random(0))
    while node.role is not Role.CANDIDATE:
        node.tick()
    _drain(node, log)
    node.step(VoteResponse("n1", "n0", node.term, granted=True))
    assert node.role is Role.LEADER
    _drain(node, log)
    return node, log


def _follower(term: int = 3, leader: str = "n1") -> tuple[RaftNode, MemLog]:
    """n0 following ``leader`` in ``term`` with entries 1..2 committed."""
    log = MemLog()
    log.save_hard_state(HardState(term=term))
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    entries = (Entry(term, 1, b"a"), Entry(term, 2, b"b"))
    node.step(AppendRequest(leader, "n0", term, 0, 0, entries, 2))
    _drain(node, log)
    assert node.leader_id == leader and node.commit_index == 2
    return node, log


def test_forged_ack_beyond_last_index_does_not_commit() -> None:
    """Old code: the leader took match_index=last+5 from the forged ack, committed its NOOP
    with no follower holding it, and the next heartbeat raised IndexOutOfRangeError."""
    node, log = _leader()
    last = node.last_index
    assert node.commit_index == 0
    forged = AppendResponse("n1", "n0", node.term, True, match_index=last + 5, last_log_index=99)
    node.step(forged)
    _drain(node, log)
    assert node.commit_index == 0
    assert node.dropped[DROP_ACK_BEYOND_LAST] == 1
    assert all(p.match_index <= last for p in node.status().peers)
    for _ in range(3):  # heartbeats read the term at each follower's match index
        node.tick()
        _drain(node, log)
    # A real ack still commits.
    node.step(AppendResponse("n1", "n0", node.term, True, match_index=last, last_log_index=last))
    _drain(node, log)
    assert node.commit_index == last


def test_forged_reject_beyond_last_index_is_dropped() -> None:
    """Old code (follower in the replicate state): probed from index 7 of a 1-entry log and
    raised AssertionError out of step()."""
    node, log = _leader()
    node.step(AppendResponse("n1", "n0", node.term, True, match_index=1, last_log_index=1))
    _drain(node, log)
    node.step(AppendResponse("n1", "n0", node.term, False, conflict_index=7, rejected_index=50))
    msgs = _drain(node, log)
    assert node.dropped[DROP_ACK_BEYOND_LAST] == 1
    assert not any(isinstance(m, AppendRequest) and m.prev_log_index > 1 for m in msgs)


@pytest.mark.parametrize("term", [MAX_TERM + 1, (1 << 64) - 1])
def test_term_beyond_max_is_refused_by_validate_and_core(term: int) -> None:
    """Old code: validate() had no upper bound and the core adopted 2^64-1 as its term."""
    hb = AppendRequest("n1", "n0", term, 0, 0, (), 0)
    assert validate(hb) == "term out of range"
    node, log = _follower()
    node.step(hb)
    _drain(node, log)
    assert node.term == 3 and log.load_hard_state().term == 3
    assert node.dropped[DROP_TERM_OUT_OF_RANGE] == 1


def test_uint64_max_term_survives_the_wire_and_is_refused() -> None:
    pm = to_pb(AppendRequest("n1", "n0", (1 << 64) - 1, 0, 0, (), 0), "g")
    m = from_pb(pm)
    assert m is not None and validate(m) is not None


def test_term_jump_beyond_bound_is_dropped() -> None:
    node, log = _follower(term=3)
    node.step(AppendRequest("n1", "n0", 3 + MAX_TERM_JUMP + 1, 0, 0, (), 0))
    node.step(VoteRequest("n2", "n0", MAX_TERM, 0, 0))
    _drain(node, log)
    assert node.term == 3
    assert node.dropped[DROP_TERM_OUT_OF_RANGE] == 2
    node.step(AppendRequest("n1", "n0", 3 + MAX_TERM_JUMP, 2, 3, (), 2))  # the bound itself
    assert node.term == 3 + MAX_TERM_JUMP


def test_node_at_max_term_refuses_to_campaign() -> None:
    log = MemLog()
    log.save_hard_state(HardState(term=MAX_TERM))
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    for _ in range(3 * CFG.election_timeout_ticks):
        node.tick()
        for m in _drain(node, log):
            assert m.term <= MAX_TERM
    assert node.term == MAX_TERM and node.role is Role.FOLLOWER
    assert node.dropped[CAMPAIGN_REFUSED_MAX_TERM] >= 1


def test_forged_timeout_now_does_not_start_an_election() -> None:
    """Old code: any member's TimeoutNow, of any term, made the node campaign at once."""
    node, log = _follower(term=3, leader="n1")
    node.step(TimeoutNow("n2", "n0", 3))  # not the leader
    node.step(TimeoutNow("n1", "n0", 4))  # the leader, but a term it does not lead
    node.step(TimeoutNow("n2", "n0", 9))  # a later term
    msgs = _drain(node, log)
    assert node.role is Role.FOLLOWER and node.term == 3 and node.leader_id == "n1"
    assert not any(isinstance(m, VoteRequest) for m in msgs)
    assert node.dropped[DROP_UNEXPECTED_TIMEOUT_NOW] == 3
    node.step(TimeoutNow("n1", "n0", 3))  # the real transfer still works
    assert node.role is Role.CANDIDATE and node.term == 4


def test_second_leader_in_a_term_is_dropped() -> None:
    """Old code: a follower of n1 in term 3 adopted n2 as leader of term 3 and took its
    entries (overwriting uncommitted ones)."""
    node, log = _follower(term=3, leader="n1")
    forged = AppendRequest("n2", "n0", 3, 2, 3, (Entry(3, 3, b"forged"),), 3)
    node.step(forged)
    msgs = _drain(node, log)
    assert node.leader_id == "n1" and node.last_index == 2 and node.commit_index == 2
    assert not msgs
    assert node.dropped[DROP_SECOND_LEADER] == 1
    # Also after this node's election timer cleared the leader it knew (still term 3).
    node.step(VoteResponse("n1", "n0", 3, granted=False))
    node.step(forged)
    assert node.last_index == 2 and node.dropped[DROP_SECOND_LEADER] == 2


def test_append_to_the_leader_in_its_own_term_is_dropped() -> None:
    """Old code: raised AssertionError("two leaders ...") out of step()."""
    node, _ = _leader()
    node.step(AppendRequest("n1", "n0", node.term, 0, 0, (), 0))
    assert node.role is Role.LEADER
    assert node.dropped[DROP_SECOND_LEADER] == 1


def test_non_member_is_dropped_and_counted() -> None:
    node, log = _follower(term=3)
    # An answer from a non-member (a request from an unknown id is taken: a lagging
    # follower must hear a voter added by a configuration it has not seen yet).
    node.step(AppendResponse("intruder", "n0", 3, True, match_index=1))
    node.step(VoteRequest("n1", "n7", 4, 9, 4))  # addressed to someone else
    _drain(node, log)
    assert node.term == 3
    assert node.dropped[DROP_NOT_MEMBER] == 2
    assert node.status().dropped[DROP_NOT_MEMBER] == 2


def test_malformed_append_is_dropped_by_the_core_too() -> None:
    node, _ = _follower(term=3)
    node.step(AppendRequest("n1", "n0", 3, 2, 3, (Entry(3, 9, b"gap"),), 9))
    node.step(AppendRequest("n1", "n0", 4, -1, 0, (), 0))
    assert node.last_index == 2 and node.term == 3
    assert node.dropped[DROP_MALFORMED] == 2


def test_append_conflicting_with_committed_entries_is_a_reported_repair() -> None:
    """A leader holds what a majority acknowledged (leader completeness): when its entry at
    a committed index differs, this member's copy is the damaged one (docs/RAFT.md section
    11). It is never silent: counted, and the follower takes the leader's entry."""
    node, log = _follower(term=3, leader="n1")
    node.step(AppendRequest("n1", "n0", 5, 1, 3, (Entry(5, 2, b"other"),), 2))
    _drain(node, log)
    assert log.read(2).body == b"other" and node.commit_index == 2
    st = node.status()
    assert st.chain_mismatches == 1 and st.committed_repairs == 1


def test_follower_never_acks_an_index_it_does_not_hold() -> None:
    node, log = _follower(term=3)
    node.step(AppendRequest("n1", "n0", 3, 40, 3, (), 45))  # prev far beyond its log
    node.step(AppendRequest("n1", "n0", 3, 2, 3, (), 1 << 40))  # huge leader_commit
    msgs = _drain(node, log)
    acks = [m for m in msgs if isinstance(m, AppendResponse)]
    assert acks and all(m.match_index <= node.last_index for m in acks if m.success)
    assert not acks[0].success
    assert node.commit_index == 2


def test_proposal_larger_than_the_pending_limit_is_too_large_not_back_pressure() -> None:
    node, _ = _leader(RaftConfig(pre_vote=False, max_pending_proposal_bytes=100))
    with pytest.raises(ProposalTooLargeError) as info:
        node.propose([b"x" * 101])
    assert info.value.code == "ENTRY_TOO_LARGE"


def test_no_hostile_message_escapes_step() -> None:
    """Random hostile fields against a leader and a follower: nothing is raised, the state
    stays within what the node holds."""
    rng = random.Random(16)
    big = [0, 1, 2, 3, 5, 1 << 20, MAX_TERM, MAX_TERM + 1, (1 << 64) - 1]
    for make in (_leader, _follower):
        node, log = make()
        for _ in range(2000):
            term = rng.choice([node.term, node.term + 1, *big])
            frm = rng.choice(["n1", "n2", "x"])
            idx = rng.choice(big)
            kind = rng.randrange(5)
            m: Message
            if kind == 0:
                m = AppendResponse(frm, "n0", term, rng.random() < 0.5, idx, idx, idx, idx, idx)
            elif kind == 1:
                prev = rng.choice([0, 1, 2, node.last_index, idx])
                pterm = rng.choice([0, node.term, term])
                ents = tuple(Entry(term, prev + 1 + i, b"f") for i in range(rng.randrange(3)))
                m = AppendRequest(frm, "n0", term, prev, pterm, ents, idx)
            elif kind == 2:
                m = VoteRequest(frm, "n0", term, idx, rng.choice([0, term]), rng.random() < 0.5)
            elif kind == 3:
                m = VoteResponse(frm, "n0", term, rng.random() < 0.5, rng.random() < 0.5)
            else:
                m = TimeoutNow(frm, "n0", term)
            if validate(m) is None or rng.random() < 0.5:  # half bypass validate()
                node.step(m)
            if rng.random() < 0.2:
                node.tick()
            _drain(node, log)
            assert node.commit_index <= node.last_index
            assert node.term <= MAX_TERM
            assert all(p.match_index <= node.last_index for p in node.status().peers)
