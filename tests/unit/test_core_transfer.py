"""Leadership transfer and the preferred leader."""

from __future__ import annotations

import pytest

from dledger.core import (
    RaftConfig,
    Role,
    TimeoutNow,
    TransferInProgressError,
    UnknownPeerError,
    VoteRequest,
)
from dledger.sim.harness import Cluster

T = 10


def test_transfer_to_caught_up_follower() -> None:
    c = Cluster(3)
    leader = c.elect()
    target = next(x for x in c.ids if x != leader)
    term = c.nodes[leader].term
    c.nodes[leader].transfer_leadership(target)
    c.deliver()
    assert any(isinstance(m, TimeoutNow) and m.to_id == target for m in c.sent)
    assert c.leader() == target
    assert c.nodes[target].term == term + 1
    votes = [m for m in c.sent if isinstance(m, VoteRequest) and m.from_id == target]
    assert votes and all(m.leadership_transfer and not m.pre_vote for m in votes)


def test_transfer_catches_up_a_lagging_target_first() -> None:
    c = Cluster(3)
    leader = c.elect()
    target = next(x for x in c.ids if x != leader)
    c.isolated.add(target)
    c.nodes[leader].propose([b"a", b"b", b"c"])
    c.tick(times=2)
    c.isolated.clear()
    c.nodes[leader].transfer_leadership(target)
    with pytest.raises(TransferInProgressError) as info:
        c.nodes[leader].propose([b"refused"])
    assert info.value.code == "TRANSFER_IN_PROGRESS"
    c.deliver()
    assert c.leader() == target
    assert c.bodies(target)[:3] == [b"a", b"b", b"c"] or c.logs[target].last_index() >= 4
    new = c.nodes[target]
    assert [e.body for e in c.logs[target].entries() if e.body][:3] == [b"a", b"b", b"c"]
    assert new.role is Role.LEADER


def test_transfer_overrides_leader_lease() -> None:
    # check_quorum on: the followers are in lease, yet the transfer target must win.
    c = Cluster(5, RaftConfig(check_quorum=True, pre_vote=True))
    leader = c.elect()
    target = next(x for x in c.ids if x != leader)
    c.nodes[leader].transfer_leadership(target)
    c.deliver()
    assert c.leader() == target


def test_transfer_aborts_after_election_timeout() -> None:
    c = Cluster(3, RaftConfig(check_quorum=False))
    leader = c.elect()
    target = next(x for x in c.ids if x != leader)
    c.isolated.add(target)
    c.nodes[leader].transfer_leadership(target)
    assert c.nodes[leader].transfer_target == target
    with pytest.raises(TransferInProgressError):
        c.nodes[leader].propose([b"x"])
    c.tick([leader], times=T)
    assert c.nodes[leader].transfer_target is None
    assert c.nodes[leader].role is Role.LEADER
    c.nodes[leader].propose([b"x"])  # accepted again


def test_transfer_argument_errors() -> None:
    c = Cluster(3)
    leader = c.elect()
    with pytest.raises(UnknownPeerError):
        c.nodes[leader].transfer_leadership("n9")
    c.nodes[leader].transfer_leadership(leader)  # no-op
    assert c.nodes[leader].transfer_target is None


@pytest.mark.parametrize("n", [3, 5])
def test_preferred_leader_takes_over_when_caught_up(n: int) -> None:
    preferred = f"n{n - 1}"
    c = Cluster(n, RaftConfig(preferred_leader_id=preferred), seed=1)
    first = c.elect()
    if first == preferred:  # make someone else lead first
        other = "n0"
        c.nodes[first].transfer_leadership(other)
        c.deliver()
    c.tick_until(lambda: c.leader() == preferred, max_ticks=5 * T)
    assert c.leader() == preferred
    term = c.nodes[preferred].term
    c.tick(times=5 * T)
    assert c.leader() == preferred and c.nodes[preferred].term == term  # and it stays


def test_without_preferred_leader_nothing_moves() -> None:
    c = Cluster(3, seed=1)
    first = c.elect()
    c.tick(times=5 * T)
    assert c.leader() == first
