"""Content-verified log matching (issue 31, item 1): an entry's identity includes its content.

Each test plays one way a replica's content can differ from its leader's at the same (index,
term) and shows it is found, reported (counted; ERROR lines) and repaired. Each fails on the
code before dledger.chain, which matched logs by (index, term) alone."""

from __future__ import annotations

import logging
import random

import pytest

from dledger.chain import CHAIN_ORIGIN, CHAIN_UNKNOWN, agree, link, next_chain
from dledger.core import (
    REJECT_CHAIN_MISMATCH,
    AppendRequest,
    AppendResponse,
    RaftConfig,
    RaftNode,
    Role,
    VoteRequest,
    VoteResponse,
)
from dledger.log import Entry, HardState, persist
from dledger.sim.harness import drain
from dledger.sim.memlog import MemLog

CFG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, pre_vote=False)
TERM = 3


def _chain(entries: list[Entry]) -> int:
    c = CHAIN_ORIGIN
    for e in entries:
        c = next_chain(c, e.index, e.term, e.type, e.body)
    return c


def _follower(n: int = 2) -> tuple[RaftNode, MemLog, list[Entry]]:
    """n0 following n1 in TERM with entries 1..n committed (and applied)."""
    log = MemLog()
    log.save_hard_state(HardState(term=TERM))
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    entries = [Entry(TERM, i, b"e%d" % i) for i in range(1, n + 1)]
    node.step(AppendRequest("n1", "n0", TERM, 0, 0, tuple(entries), n, False, CHAIN_ORIGIN))
    drain(node, log)
    assert node.commit_index == n
    return node, log, entries


def _append(node: RaftNode, prev: list[Entry], entries: list[Entry], commit: int) -> None:
    last = prev[-1] if prev else None
    node.step(
        AppendRequest(
            "n1",
            "n0",
            TERM,
            last.index if last else 0,
            last.term if last else 0,
            tuple(entries),
            commit,
            prev_log_chain=_chain(prev),
        )
    )


def test_chain_function_is_fixed_and_never_unknown() -> None:
    # The documented record (docs/FORMAT.md): a third party gets the same value.
    assert link(CHAIN_ORIGIN, 1, 1, 0, 0, 0) == link(CHAIN_ORIGIN, 1, 1, 0, 0, 0)
    assert next_chain(CHAIN_ORIGIN, 1, 1, 0, b"a") != next_chain(CHAIN_ORIGIN, 1, 1, 0, b"b")
    assert next_chain(CHAIN_UNKNOWN, 1, 1, 0, b"a") == CHAIN_UNKNOWN
    assert agree(5, CHAIN_UNKNOWN) and not agree(5, 6)


def test_forged_committed_entries_are_found_and_repaired_at_the_next_real_append(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's forged append: one append claiming the leader's id and term, two entries
    and a commit index is applied. The real leader's next append carries its entries at the
    same (index, term): before, they were "already present" and the forgery stayed for
    good; now the follower finds the content differs, says so, and takes the leader's."""
    node, log, good = _follower()
    forged = [Entry(TERM, 3, b"forged-1"), Entry(TERM, 4, b"forged-2")]
    _append(node, good, forged, 4)
    rd_msgs = drain(node, log)
    assert node.commit_index == 4 and log.read(3).body == b"forged-1"
    assert any(isinstance(m, AppendResponse) and m.success for m in rd_msgs)
    real = [Entry(TERM, 3, b"real-3"), Entry(TERM, 4, b"real-4"), Entry(TERM, 5, b"real-5")]
    with caplog.at_level(logging.ERROR, logger="dledger.core.raft"):
        _append(node, good, real, 5)
        rd = node.ready()
    assert rd.truncate_from == 3 and rd.rewind_to == 2  # forged 3, 4 were applied: roll back
    assert [e.index for e in rd.committed] == [3, 4, 5]
    persist(log, rd.hard_state, rd.truncate_from, rd.entries, flush=True)
    node.advance(rd)
    drain(node, log)
    assert [e.body for e in log.entries()] == [b"e1", b"e2", b"real-3", b"real-4", b"real-5"]
    st = node.status()
    assert st.chain_mismatches == 1 and st.committed_repairs == 1 and st.commit_index == 5
    line = next(r.getMessage() for r in caplog.records if "chain_mismatch" in r.getMessage())
    assert "index=3" in line and "peer=n1" in line
    assert f"peer_chain={_chain([*good, real[0]]):016x}" in line
    assert f"own_chain={_chain([*good, forged[0]]):016x}" in line
    assert any("repair_committed index=3" in r.getMessage() for r in caplog.records)


def test_prev_whose_content_differs_is_rejected_with_the_followers_chain() -> None:
    node, log, good = _follower(3)
    other = [good[0], Entry(TERM, 2, b"other"), good[2]]
    _append(node, other, [], 3)  # a heartbeat whose prev (3, TERM) matches by term only
    msgs = drain(node, log)
    rejects = [m for m in msgs if isinstance(m, AppendResponse) and not m.success]
    assert len(rejects) == 1
    assert rejects[0].rejected_index == 3 and rejects[0].match_chain == _chain(good)
    assert node.status().chain_mismatches == 1


def _leader_with_followers() -> tuple[RaftNode, MemLog]:
    """n0 leading {n0, n1, n2} in term 1 with entries 1 (NOOP) .. 4, all acked by n1."""
    log = MemLog()
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    while node.role is not Role.CANDIDATE:
        node.tick()
    drain(node, log)
    node.step(VoteResponse("n1", "n0", node.term, granted=True))
    drain(node, log)
    node.propose([b"a", b"b", b"c"])
    drain(node, log)
    return node, log


def test_leader_does_not_count_an_ack_whose_chain_differs() -> None:
    """Before: an ack of index 4 counted whatever the follower held there."""
    node, log = _leader_with_followers()
    term = node.term
    node.step(AppendResponse("n1", "n0", term, True, match_index=4, last_log_index=4,
                             match_chain=12345))  # fmt: skip
    msgs = drain(node, log)
    assert node.commit_index == 0
    assert node.status().chain_mismatches == 1
    probe = [m for m in msgs if isinstance(m, AppendRequest) and m.to_id == "n1"]
    assert probe and probe[-1].prev_log_index == 3  # probing back from the mismatch
    assert probe[-1].prev_log_chain == log.chain_at(3)
    # The honest ack (its chain agrees) counts.
    node.step(AppendResponse("n1", "n0", term, True, match_index=4, last_log_index=4,
                             match_chain=log.chain_at(4)))  # fmt: skip
    drain(node, log)
    assert node.commit_index == 4


def test_content_rejects_probe_back_twice_as_far_each_round() -> None:
    node, log = _leader_with_followers()
    term = node.term
    seen = []
    at = 4
    for _ in range(3):
        node.step(AppendResponse("n1", "n0", term, False, conflict_index=at, conflict_term=term,
                                 last_log_index=4, rejected_index=at, match_chain=777))  # fmt: skip
        probes = [m for m in drain(node, log) if isinstance(m, AppendRequest) and m.to_id == "n1"]
        at = probes[-1].prev_log_index
        seen.append(at)
    assert seen == [3, 1, 0]  # back 1, 2, 4: log2 of the distance in rounds


def test_vote_refused_when_the_voters_entry_at_the_candidates_last_differs() -> None:
    node, log, good = _follower(3)
    for _ in range(CFG.election_timeout_ticks * 2):
        node.tick()  # the leader lease lapses
    drain(node, log)
    other = [good[0], Entry(TERM, 2, b"other"), good[2]]
    node.step(VoteRequest("n2", "n0", TERM + 5, 3, TERM, last_log_chain=_chain(other)))
    msgs = drain(node, log)
    votes = [m for m in msgs if isinstance(m, VoteResponse)]
    assert votes and not votes[-1].granted and votes[-1].reject_reason == REJECT_CHAIN_MISMATCH
    node.step(VoteRequest("n1", "n0", TERM + 6, 3, TERM, last_log_chain=_chain(good)))
    votes = [m for m in drain(node, log) if isinstance(m, VoteResponse)]
    assert votes[-1].granted and votes[-1].log_index == 3 and votes[-1].log_chain == _chain(good)


def test_candidate_does_not_count_a_vote_from_a_log_that_differs() -> None:
    """A damaged member with the longest log would win with the votes of shorter logs that
    cannot compare at its last index: the voter's answer carries its chain at its own last
    index, and a candidate whose log differs there does not count it."""
    node, log, good = _follower(3)
    for _ in range(CFG.election_timeout_ticks * 3):
        node.tick()
        drain(node, log)
        if node.role is Role.CANDIDATE:
            break
    assert node.role is Role.CANDIDATE
    other = [good[0], Entry(TERM, 2, b"other")]
    node.step(VoteResponse("n1", "n0", node.term, True, log_index=2, log_term=TERM,
                           log_chain=_chain(other)))  # fmt: skip
    drain(node, log)
    assert node.role is Role.CANDIDATE and node.status().chain_mismatches == 1
    node.step(VoteResponse("n2", "n0", node.term, True, log_index=2, log_term=TERM,
                           log_chain=_chain(good[:2])))  # fmt: skip
    drain(node, log)
    assert node.role is Role.LEADER


def test_leader_relearns_a_follower_that_lost_acked_entries_in_a_repair() -> None:
    """A follower's ack sent before a repair cut its copy can arrive after the cut; its next
    rejection shows it lacks what it acked. Before: ignored as stale, and every heartbeat
    after it was rejected again (the follower never caught up)."""
    node, log = _leader_with_followers()
    term = node.term
    node.step(AppendResponse("n1", "n0", term, True, match_index=4, last_log_index=4,
                             match_chain=log.chain_at(4)))  # fmt: skip
    drain(node, log)
    assert next(p for p in node.status().peers if p.peer_id == "n1").match_index == 4
    node.step(AppendResponse("n1", "n0", term, False, conflict_index=3, conflict_term=0,
                             last_log_index=2, rejected_index=4))  # fmt: skip
    msgs = drain(node, log)
    assert next(p for p in node.status().peers if p.peer_id == "n1").match_index == 2
    probes = [m for m in msgs if isinstance(m, AppendRequest) and m.to_id == "n1"]
    assert probes and probes[-1].prev_log_index == 2 and len(probes[-1].entries) == 2


def test_a_member_its_leader_found_damaged_does_not_campaign_until_repaired() -> None:
    """A damaged member whose log is the longest could win with the votes of members that
    cannot compare with it, and hand its copy on: once its leader's chain disagrees with its
    own, it does not campaign until an append of a leader verified its log past that point."""
    node, log, good = _follower(3)
    other = [good[0], Entry(TERM, 2, b"other"), good[2]]
    _append(node, other, [], 3)  # the leader's chain at 3 is not this member's
    drain(node, log)
    for _ in range(CFG.election_timeout_ticks * 3):
        node.tick()
        drain(node, log)
    assert node.role is Role.FOLLOWER and node.term == TERM
    _append(node, good, [Entry(TERM, 4, b"e4")], 4)  # the leader's chain agrees up to 4
    drain(node, log)
    for _ in range(CFG.election_timeout_ticks * 3):
        node.tick()
        drain(node, log)
        if node.role is not Role.FOLLOWER:
            break
    assert node.role is Role.CANDIDATE
