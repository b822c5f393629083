"""Leader election: randomized timeouts, vote rules, persistence, pre-vote, check-quorum."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    REJECT_LEADER_LEASE,
    REJECT_STALE_LOG,
    AppendRequest,
    RaftConfig,
    RaftNode,
    Role,
    VoteRequest,
    VoteResponse,
)
from dledger.log import Entry, HardState
from dledger.sim.harness import Cluster
from dledger.sim.memlog import MemLog

T = 10  # election_timeout_ticks of the default config


def _node_with_log(terms: list[int], config: RaftConfig | None = None, term: int = 0) -> RaftNode:
    log = MemLog()
    log.append([Entry(t, i + 1, b"x") for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term=max([term, *terms]), voted_for=None))
    return RaftNode("n0", ["n1", "n2"], log, config or RaftConfig(), random.Random(1))


@pytest.mark.parametrize("n", [3, 5, 7])
def test_group_elects_exactly_one_leader(n: int) -> None:
    c = Cluster(n, seed=n)
    leader = c.elect()
    assert c.leaders() == [leader]
    term = c.nodes[leader].term
    assert all(c.nodes[x].term == term for x in c.ids)
    assert all(c.nodes[x].leader_id == leader for x in c.ids)


def test_randomized_timeout_is_in_t_to_2t() -> None:
    first_campaign = []
    for seed in range(40):
        log = MemLog()
        node = RaftNode("n0", ["n1", "n2"], log, RaftConfig(pre_vote=False), random.Random(seed))
        for ticks in range(1, 3 * T):
            node.tick()
            if node.role is Role.CANDIDATE:
                first_campaign.append(ticks)
                break
    assert min(first_campaign) >= T
    assert max(first_campaign) < 2 * T
    assert len(set(first_campaign)) > 3  # really randomized


@pytest.mark.parametrize(
    ("cand_last_term", "cand_last_index", "granted"),
    [
        (2, 3, True),  # same log
        (2, 5, True),  # same last term, longer
        (3, 1, True),  # higher last term wins even if shorter
        (2, 2, False),  # same last term, shorter
        (1, 9, False),  # lower last term loses even if longer
    ],
)
def test_vote_only_for_up_to_date_log(
    cand_last_term: int, cand_last_index: int, granted: bool
) -> None:
    node = _node_with_log([1, 2, 2])
    node.step(VoteRequest("n1", "n0", 5, cand_last_index, cand_last_term))
    rd = node.ready()
    (resp,) = [m for m in rd.messages if isinstance(m, VoteResponse)]
    assert resp.granted is granted
    if not granted:
        assert resp.reject_reason == REJECT_STALE_LOG


def test_mutation_vote_without_log_check_grants_stale_candidate() -> None:
    node = _node_with_log([1, 2, 2], RaftConfig(mutations=frozenset({"vote_without_log_check"})))
    node.step(VoteRequest("n1", "n0", 5, 9, 1))
    (resp,) = node.ready().messages
    assert isinstance(resp, VoteResponse) and resp.granted


def test_vote_is_persisted_in_the_same_ready_as_the_reply() -> None:
    node = _node_with_log([1])
    node.step(VoteRequest("n1", "n0", 4, 1, 1))
    rd = node.ready()
    assert rd.hard_state == HardState(term=4, voted_for="n1")
    assert any(isinstance(m, VoteResponse) and m.granted for m in rd.messages)
    node.advance(rd)
    # a second candidate of the same term is refused, also after a restart from the store
    node.step(VoteRequest("n2", "n0", 4, 1, 1))
    (resp,) = node.ready().messages
    assert isinstance(resp, VoteResponse) and not resp.granted


def test_vote_survives_restart() -> None:
    c = Cluster(3)
    c.nodes["n0"].step(VoteRequest("n1", "n0", 4, 0, 0))
    c.process("n0")
    node = c.crash_and_restart("n0")
    assert (node.term, node.voted_for) == (4, "n1")
    node.step(VoteRequest("n2", "n0", 4, 0, 0))
    (resp,) = node.ready().messages
    assert isinstance(resp, VoteResponse) and not resp.granted


def test_mutation_reply_before_persisting_vote_loses_it() -> None:
    cfg = RaftConfig(mutations=frozenset({"reply_before_persisting_vote"}))
    c = Cluster(3, cfg)
    c.nodes["n0"].step(VoteRequest("n1", "n0", 4, 0, 0))
    c.process("n0")
    assert any(isinstance(m, VoteResponse) and m.granted for m in c.sent)
    node = c.crash_and_restart("n0")
    assert node.voted_for is None  # the vote was answered but never made durable


def test_higher_term_deposes_leader_at_once() -> None:
    c = Cluster(3)
    leader = c.elect()
    node = c.nodes[leader]
    other = next(x for x in c.ids if x != leader)
    node.step(AppendRequest(other, leader, node.term + 1, 0, 0, (), 0))
    assert node.role is Role.FOLLOWER
    assert node.leader_id == other


def _rejoin_and_campaign(c: Cluster, loner: str) -> None:
    """Heal, then let the loner's election timer fire before the leader's next heartbeat."""
    c.isolated.clear()
    sent_before = len(c.sent)
    for _ in range(3 * T):
        c.nodes[loner].tick()
        c.deliver()
        if any(isinstance(m, VoteRequest) and m.from_id == loner for m in c.sent[sent_before:]):
            return
    raise AssertionError("the loner never campaigned")


def test_pre_vote_keeps_partitioned_node_from_deposing_leader() -> None:
    c = Cluster(3, RaftConfig(pre_vote=True, check_quorum=False))
    leader = c.elect()
    term = c.nodes[leader].term
    loner = next(x for x in c.ids if x != leader)
    c.isolated.add(loner)
    c.tick(times=10 * T)
    assert c.nodes[loner].term == term  # pre-votes never raise the term
    _rejoin_and_campaign(c, loner)  # its log is as good as anyone's: only the lease stops it
    c.tick(times=3)
    assert c.leader() == leader
    assert c.nodes[leader].term == term


def test_without_pre_vote_a_rejoining_node_disrupts_the_leader() -> None:
    # Counterpart of the test above: proves that test depends on pre-vote.
    c = Cluster(3, RaftConfig(pre_vote=False, check_quorum=False))
    leader = c.elect()
    term = c.nodes[leader].term
    loner = next(x for x in c.ids if x != leader)
    c.isolated.add(loner)
    c.tick(times=10 * T)
    assert c.nodes[loner].term > term
    _rejoin_and_campaign(c, loner)
    c.tick(times=3)
    assert c.nodes[leader].term > term


def test_check_quorum_isolated_leader_steps_down_within_an_election_timeout() -> None:
    c = Cluster(5, RaftConfig(check_quorum=True))
    leader = c.elect()
    c.isolated.add(leader)
    ticks = 0
    while c.nodes[leader].role is Role.LEADER and ticks < 5 * T:
        c.nodes[leader].tick()
        ticks += 1
    assert c.nodes[leader].role is Role.FOLLOWER
    assert ticks <= T  # within one election timeout of the last answer


def test_mutation_leader_never_steps_down() -> None:
    c = Cluster(5, RaftConfig(mutations=frozenset({"leader_never_steps_down"})))
    leader = c.elect()
    c.isolated.add(leader)
    for _ in range(10 * T):
        c.nodes[leader].tick()
    assert c.nodes[leader].role is Role.LEADER


def test_leader_lease_followers_reject_votes_while_leader_is_live() -> None:
    c = Cluster(3, RaftConfig(check_quorum=True, pre_vote=False))
    leader = c.elect()
    a, b = (x for x in c.ids if x != leader)
    node = c.nodes[b]
    term = node.term
    node.step(VoteRequest(a, b, term + 5, 100, term))
    rd = node.ready()
    (resp,) = [m for m in rd.messages if isinstance(m, VoteResponse)]
    assert not resp.granted and resp.reject_reason == REJECT_LEADER_LEASE
    assert node.term == term  # the disruptive term was not adopted


def test_without_check_quorum_no_lease() -> None:
    c = Cluster(3, RaftConfig(check_quorum=False, pre_vote=False))
    leader = c.elect()
    a, b = (x for x in c.ids if x != leader)
    node = c.nodes[b]
    node.step(VoteRequest(a, b, node.term + 5, 100, node.term))
    assert node.term > c.nodes[leader].term


def test_lease_expires_after_election_timeout() -> None:
    c = Cluster(3, RaftConfig(check_quorum=True, pre_vote=True))
    leader = c.elect()
    a, b = (x for x in c.ids if x != leader)
    c.isolated.add(leader)
    for _ in range(T):
        c.nodes[b].tick()
    node = c.nodes[b]
    node.step(VoteRequest(a, b, node.term + 1, node.last_index, node.term))
    rd = node.ready()
    assert any(isinstance(m, VoteResponse) and m.granted for m in rd.messages)


def test_candidate_with_stale_log_cannot_win() -> None:
    c = Cluster(3, RaftConfig(pre_vote=False, check_quorum=False))
    leader = c.elect()
    stale = next(x for x in c.ids if x != leader)
    c.isolated.add(stale)
    c.nodes[leader].propose([b"a", b"b"])
    c.tick(times=2)
    c.isolated.clear()
    # the stale node campaigns first; it must lose to an up-to-date one
    for _ in range(3 * T):
        c.nodes[stale].tick()
        c.deliver()
        if c.nodes[stale].role is Role.CANDIDATE:
            break
    assert c.nodes[stale].role is not Role.LEADER
    new_leader = c.elect()
    assert new_leader != stale
