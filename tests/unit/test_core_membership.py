"""Membership changes in the Raft core: one server at a time, learners, the known fixes."""

from __future__ import annotations

import pytest

from dledger.core import (
    DROP_NOT_MEMBER,
    AppendRequest,
    AppendResponse,
    ChangeKind,
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
    RaftConfig,
    Role,
    TransferInProgressError,
    VoteRequest,
)
from dledger.core.membership import (
    MAX_REMOVED_IDS,
    MemberAddr,
    Membership,
    addresses_in_use,
    decode,
    joining,
)
from dledger.log import EntryType
from dledger.sim.harness import Cluster


def _change(c: Cluster, kind: ChangeKind, nid: str) -> None:
    leader = c.leader()
    assert leader is not None
    c.nodes[leader].propose_conf_change(ConfChange(kind, nid))
    c.deliver()


def _voters(c: Cluster, nid: str) -> frozenset[str]:
    return c.nodes[nid].conf_state.voters


def test_learner_catches_up_without_voting_then_is_promoted() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.nodes[leader].propose([b"a", b"b"])
    c.deliver()
    c.join("n3")
    _change(c, ChangeKind.ADD_LEARNER, "n3")
    learner = c.nodes["n3"]
    assert learner.conf_state.learners == {"n3"}
    assert learner.last_index == c.nodes[leader].last_index
    assert c.bodies("n3") == [b"a", b"b"]
    # A learner never campaigns, however long it hears nothing.
    c.isolated.add(leader)
    for _ in range(50):
        learner.tick()
        c.process("n3")
    assert learner.role is Role.FOLLOWER and learner.term == c.nodes[leader].term
    c.isolated.clear()
    c.tick(times=3)
    _change(c, ChangeKind.PROMOTE, "n3")
    assert all(_voters(c, n) == {"n0", "n1", "n2", "n3"} for n in c.ids)
    status = c.nodes[leader].status()
    assert status.voters == ("n0", "n1", "n2", "n3") and status.learners == ()


def test_grow_to_five_and_back_to_three_removing_the_leader() -> None:
    c = Cluster(3)
    first = c.elect()
    for nid in ("n3", "n4"):
        c.join(nid)
        _change(c, ChangeKind.ADD_LEARNER, nid)
        c.tick(times=2)
        _change(c, ChangeKind.PROMOTE, nid)
    assert _voters(c, first) == {"n0", "n1", "n2", "n3", "n4"}
    # Removing the leader hands leadership over first; the new leader takes the removal.
    with pytest.raises(TransferInProgressError, match="handed to"):
        c.nodes[first].propose_conf_change(ConfChange(ChangeKind.REMOVE, first))
    c.deliver()
    second = c.leader()
    assert second is not None and second != first
    c.tick(times=2)
    _change(c, ChangeKind.REMOVE, first)
    other = next(x for x in ("n0", "n1", "n2") if x not in (first, second))
    c.tick(times=2)
    _change(c, ChangeKind.REMOVE, other)
    final = frozenset({"n0", "n1", "n2", "n3", "n4"} - {first, other})
    assert _voters(c, second) == final
    c.nodes[second].propose([b"after"])
    c.deliver()
    for nid in final:
        assert c.bodies(nid)[-1] == b"after"
    # The removed members do not campaign: they know they were removed.
    c.tick(times=40)
    assert c.leader() == second
    assert c.nodes[first].role is Role.FOLLOWER


def test_bad_changes_are_refused_and_change_nothing() -> None:
    c = Cluster(3)
    leader = c.elect()
    node = c.nodes[leader]
    before = node.conf_state
    last = node.last_index
    bad = [
        (ChangeKind.ADD_VOTER, "n1", "already a voter"),
        (ChangeKind.ADD_LEARNER, "n1", "already a voter"),
        (ChangeKind.PROMOTE, "n1", "already a voter"),
        (ChangeKind.PROMOTE, "n9", "not a learner"),
        (ChangeKind.REMOVE, "n9", "not a member"),
        (ChangeKind.ADD_LEARNER, "bad id!", "must be 1-64"),
        (ChangeKind.ADD_LEARNER, "x" * 65, "must be 1-64"),
    ]
    for kind, nid, text in bad:
        with pytest.raises(ConfChangeError, match=text) as info:
            node.propose_conf_change(ConfChange(kind, nid))
        assert info.value.code == "INVALID_MEMBERSHIP_CHANGE"
    assert node.conf_state == before and node.last_index == last


def test_a_change_that_would_leave_no_majority_up_is_refused() -> None:
    c = Cluster(3)
    leader = c.elect()
    down = [x for x in c.ids if x != leader]
    c.isolated.add(down[0])
    c.tick(times=12)
    node = c.nodes[leader]
    # 2 of 3 up: removing the live follower leaves {leader, down[0]}: 1 of 2 up.
    with pytest.raises(ConfChangeError, match="would stop"):
        node.propose_conf_change(ConfChange(ChangeKind.REMOVE, down[1]))
    # Adding a voter makes 4, quorum 3, with 2 up.
    with pytest.raises(ConfChangeError, match="would stop"):
        node.propose_conf_change(ConfChange(ChangeKind.ADD_VOTER, "n3"))
    # Removing the down member is fine: 2 of 2 up.
    node.propose_conf_change(ConfChange(ChangeKind.REMOVE, down[0]))
    c.deliver()
    assert _voters(c, leader) == {leader, down[1]}


def test_second_change_while_one_is_in_flight_is_refused() -> None:
    c = Cluster(3)
    leader = c.elect()
    node = c.nodes[leader]
    c.isolated.update(x for x in c.ids if x != leader)  # the first change cannot commit
    node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3"))
    last = node.last_index
    with pytest.raises(ConfChangePendingError, match="not committed yet") as info:
        node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n4"))
    assert info.value.code == "MEMBERSHIP_CHANGE_PENDING"
    assert node.last_index == last and node.conf_state.learners == {"n3"}


def test_mutation_lets_a_second_change_in() -> None:
    c = Cluster(3, RaftConfig(mutations=frozenset({"conf_change_while_pending"})))
    leader = c.elect()
    node = c.nodes[leader]
    c.isolated.update(x for x in c.ids if x != leader)
    node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3"))
    node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n4"))
    assert node.conf_state.learners == {"n3", "n4"}


def test_new_leader_commits_an_entry_of_its_term_before_a_change() -> None:
    c = Cluster(3)
    c.drop = lambda m: isinstance(m, AppendResponse)  # its NOOP cannot commit
    leader = c.elect()
    node = c.nodes[leader]
    with pytest.raises(ConfChangePendingError, match="has not committed an entry of term"):
        node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3"))
    c.drop = None
    c.tick(times=2)
    _change(c, ChangeKind.ADD_LEARNER, "n3")
    assert node.conf_state.learners == {"n3"}


def test_promoting_a_lagging_learner_is_refused_until_it_caught_up() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.join("n3")
    c.isolated.add("n3")
    _change(c, ChangeKind.ADD_LEARNER, "n3")
    c.tick(times=12)
    with pytest.raises(ConfChangePendingError, match="learner n3"):
        c.nodes[leader].propose_conf_change(ConfChange(ChangeKind.PROMOTE, "n3"))
    c.isolated.clear()
    c.tick(times=3)
    _change(c, ChangeKind.PROMOTE, "n3")
    assert "n3" in _voters(c, leader)


def test_removed_id_cannot_come_back_and_its_votes_are_dropped() -> None:
    c = Cluster(4)
    leader = c.elect()
    gone = next(x for x in c.ids if x != leader)
    _change(c, ChangeKind.REMOVE, gone)
    with pytest.raises(ConfChangeError, match="was removed"):
        c.nodes[leader].propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, gone))
    node = c.nodes[leader]
    term = node.term
    before = node.dropped.get(DROP_NOT_MEMBER, 0)
    node.step(VoteRequest(gone, leader, term + 5, 10**6, term + 4))
    node.step(AppendResponse(gone, leader, term + 5, False))
    assert node.term == term and node.role is Role.LEADER
    assert node.dropped[DROP_NOT_MEMBER] == before + 2


def test_a_lagging_follower_hears_a_leader_it_does_not_know_yet() -> None:
    c = Cluster(3)
    leader = c.elect()
    lagging = next(x for x in c.ids if x != leader)
    c.isolated.add(lagging)
    c.join("n3")
    _change(c, ChangeKind.ADD_VOTER, "n3")
    assert "n3" not in _voters(c, lagging)
    c.nodes[leader].transfer_leadership("n3")
    c.deliver()
    assert c.leader() == "n3"
    c.isolated.clear()
    c.tick(times=3)
    assert c.nodes[lagging].leader_id == "n3"
    assert "n3" in _voters(c, lagging)


def test_a_cut_config_entry_is_undone_and_restart_replays_the_log() -> None:
    c = Cluster(5)
    leader = c.elect()
    follower, *rest = [x for x in c.ids if x != leader]
    # Only `follower` stores the change, and its ack is lost: it cannot commit.
    c.drop = lambda m: (
        (m.from_id == leader and m.to_id != follower)
        or (m.from_id == follower and m.to_id == leader)
    )
    c.nodes[leader].propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n5"))
    c.deliver()
    assert c.nodes[follower].conf_state.learners == {"n5"}
    c.drop = None
    c.isolated.update({leader, follower})
    c.tick_until(lambda: c.leader() in rest)
    new_leader = c.leader()
    assert new_leader is not None
    c.tick(times=2)
    c.isolated.clear()
    c.tick(times=3)
    # The next leader's log cut the entry on `follower`: it is back to the configuration before.
    assert c.nodes[follower].conf_state.learners == frozenset()
    assert c.nodes[follower].conf_state == c.nodes[new_leader].conf_state
    # Restart: the configuration comes back from the log.
    _change(c, ChangeKind.ADD_LEARNER, "n6")
    restarted = c.crash_and_restart(new_leader)
    assert restarted.conf_state.learners == {"n6"}


def test_conf_state_encoding_round_trips_and_rejects_garbage() -> None:
    conf = ConfState(frozenset({"n0", "n1"}), frozenset({"n2"}), ("old",), 7)
    assert decode(conf.encode(), 7) == conf
    for body in (
        b"",
        b"{",
        b"[]",
        b'{"v":2,"voters":["a"],"learners":[],"removed":[]}',
        b'{"v":1,"voters":[],"learners":[],"removed":[]}',
        b'{"v":1,"voters":["a","a"],"learners":[],"removed":[]}',
        b'{"v":1,"voters":["a"],"learners":["a"],"removed":[]}',
        b'{"v":1,"voters":["a b"],"learners":[],"removed":[]}',
        b'{"v":1,"voters":[1],"learners":[],"removed":[]}',
        b"\xff" * 10,
        b" " * 9000,
    ):
        with pytest.raises(ValueError):
            decode(body, 1)


def test_membership_history_at_truncate_compact_restore() -> None:
    base = ConfState(frozenset({"a"}))
    m = Membership(base)
    c5 = base.apply(ConfChange(ChangeKind.ADD_LEARNER, "b"), 5)
    c9 = c5.apply(ConfChange(ChangeKind.PROMOTE, "b"), 9)
    m.append(c5)
    m.append(c9)
    assert m.at(4) == base and m.at(5) == c5 and m.at(100) == c9
    assert m.pending_index(6) == 9 and m.pending_index(9) == 0
    assert m.truncate(9) and m.latest() == c5
    m.compact(5)
    assert m.latest() == c5 and m.at(1) == c5
    m.restore(base)
    assert m.latest() == base
    removed = base
    for i in range(MAX_REMOVED_IDS + 3):
        removed = removed.apply(ConfChange(ChangeKind.REMOVE, f"x{i}"), i + 1)
    assert len(removed.removed) == MAX_REMOVED_IDS and removed.removed[-1] == "x34"
    assert joining("j").voters == frozenset() and joining("j").learners == {"j"}


def test_config_entries_are_handed_to_the_driver_as_committed_config_entries() -> None:
    c = Cluster(3)
    leader = c.elect()
    _change(c, ChangeKind.ADD_LEARNER, "n3")
    types = [e.type for e in c.applied[leader]]
    assert EntryType.CONFIG in types


def _change_before_term_commit(mutations: frozenset[str]) -> tuple[Cluster, str, str, int]:
    """The single-server change bug of the Raft thesis (raft-dev, 2015): a change left
    uncommitted by a crashed leader, a second one by the next leader before it committed in
    its own term, and the old leader then elected by a majority of its configuration. Returns
    the cluster, the old and the new leader, and the index the new leader committed."""
    cfg = RaftConfig(pre_vote=False, check_quorum=False, mutations=mutations)
    c = Cluster(4, cfg)
    old = "n0"
    _tick_until_leader(c, old)
    c.join("n4")
    # C1 = C0 + n4 reaches n4 only: not committed.
    c.drop = lambda m: m.from_id == old and m.to_id != "n4"
    c.nodes[old].propose_conf_change(ConfChange(ChangeKind.ADD_VOTER, "n4"))
    c.deliver()
    assert c.nodes["n4"].conf_state.voters == {"n0", "n1", "n2", "n3", "n4"}
    # The old leader crashes (C1 is on its disk). n1 is elected by n1, n2, n3 (3 of C0's
    # 4) and its NOOP is not acknowledged yet.
    c.crash_and_restart(old)
    c.isolated.update({old, "n4"})
    c.drop = lambda m: (
        isinstance(m, AppendResponse) or (isinstance(m, AppendRequest) and m.to_id == "n3")
    )
    new = "n1"
    _tick_until_leader(c, new)
    assert c.nodes[new].commit_index < c.nodes[new].last_index
    # C2 = C0 - n3, committed by n1 and n2 (2 of 3); n3 never hears of term 2's entries.
    c.nodes[new].propose_conf_change(ConfChange(ChangeKind.REMOVE, "n3"))
    c.drop = lambda m: m.to_id == "n3" or m.from_id == "n3"
    c.deliver()
    c.tick([new])
    committed = c.nodes[new].commit_index
    return c, old, new, committed


def test_change_before_term_commit_is_refused() -> None:
    with pytest.raises(ConfChangePendingError, match="has not committed an entry of term"):
        _change_before_term_commit(frozenset())


def test_mutation_change_before_term_commit_loses_a_committed_entry() -> None:
    c, old, new, committed = _change_before_term_commit(
        frozenset({"conf_change_before_term_commit"})
    )
    assert c.nodes[new].conf_state.voters == {"n0", "n1", "n2"}
    assert committed == c.nodes[new].last_index  # C2 is committed
    # The old leader comes back with C1 (5 voters) and wins with n0, n3, n4: 3 of 5.
    c.isolated.clear()
    c.isolated.update({new, "n2"})
    c.drop = None
    _tick_until_leader(c, old)
    # Two configurations whose majorities do not overlap: a leader of a later term that
    # lacks an entry committed in an earlier one (leader completeness is broken).
    assert c.nodes[old].term > c.nodes[new].term
    assert c.logs[old].last_index() < committed or c.logs[old].term_at(committed) != (
        c.logs[new].term_at(committed)
    )


def _tick_until_leader(c: Cluster, nid: str, max_ticks: int = 200) -> None:
    for _ in range(max_ticks):
        if c.nodes[nid].role is Role.LEADER:
            return
        c.nodes[nid].tick()
        c.deliver()
    raise AssertionError(f"{nid} did not become leader")


def test_addresses_travel_with_the_configuration_and_may_not_be_reused() -> None:
    c = Cluster(3)
    leader = c.elect()
    node = c.nodes[leader]
    in_use = addresses_in_use(
        node.conf_state, {"n0": ("h:1", "h:11"), "n1": ("h:2", ""), "n2": ("h:3", "")}
    )
    with pytest.raises(ConfChangeError, match="already in use by member n1"):
        node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:2"), in_use)
    with pytest.raises(ConfChangeError, match="already in use by member n0"):
        node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:9", "h:11"), in_use)
    with pytest.raises(ConfChangeError, match="without spaces"):
        node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h :9"), in_use)
    node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4", "h:14"), in_use)
    c.deliver()
    for nid in c.ids:
        assert c.nodes[nid].conf_state.addr_of("n3") == MemberAddr("n3", "h:4", "h:14")
    c.tick(times=3)
    _change(c, ChangeKind.REMOVE, "n3")
    assert c.nodes[leader].conf_state.addr_of("n3") is None
