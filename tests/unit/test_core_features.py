"""The group feature level in the Raft core (docs/RAFT.md "Feature level"): raised through a
CONFIG entry once every member reported support, never lowered, never sent to a member below
it, and never persisted by a member that does not support it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dledger.core import (
    DROP_FEATURE_LEVEL,
    DROP_MALFORMED,
    AppendRequest,
    AppendResponse,
    ChangeKind,
    ConfChange,
    ConfChangePendingError,
    ConfigError,
    ConfState,
    FeatureLevelError,
    RaftConfig,
    RaftNode,
)
from dledger.core.membership import decode
from dledger.log import Entry, EntryType
from dledger.sim.harness import Cluster
from dledger.sim.memlog import MemLog
from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL

OLD = RaftConfig(supported_feature_level=BASELINE_LEVEL)


def _raise(c: Cluster, level: int = 2) -> int:
    leader = c.leader()
    assert leader is not None
    proposal = c.nodes[leader].propose_feature_level(level)
    c.deliver()
    return proposal.last_index


def test_level_one_config_bytes_are_the_previous_releases() -> None:
    conf = ConfState(frozenset({"n0", "n1"}), index=7)
    body = conf.encode()
    assert b"features" not in body
    assert body == b'{"v":1,"voters":["n0","n1"],"learners":[],"removed":[],"addrs":[]}'
    raised = conf.raised(2, 9)
    assert raised.index == 9 and raised.voters == conf.voters
    assert decode(raised.encode(), 9) == raised
    assert decode(body, 7).features == BASELINE_LEVEL


@pytest.mark.parametrize("bad", [b"0", b"true", b'"2"', b"65537", b"-1", b"1.5"])
def test_a_config_body_with_a_bad_level_is_malformed(bad: bytes) -> None:
    body = b'{"v":1,"voters":["n0"],"learners":[],"removed":[],"addrs":[],"features":' + bad
    with pytest.raises(ValueError, match="features"):
        decode(body + b"}", 3)


def test_raise_commits_once_every_member_reported_and_is_carried_by_changes() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(times=2)
    index = _raise(c)
    for nid in c.ids:
        node = c.nodes[nid]
        assert node.feature_level == 2 and node.commit_index >= index
        conf = node.conf_state
        assert conf.index == index and conf.features == 2
    status = c.nodes[leader].status()
    assert status.feature_level == 2
    assert {p.supported_feature_level for p in status.peers} == {FEATURE_LEVEL}
    assert not any(p.withheld for p in status.peers)
    # A membership change keeps the level; a restart replays it from the log.
    c.join("n3")
    c.nodes[leader].propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3"))
    c.deliver()
    assert c.nodes[leader].conf_state.features == 2
    assert c.nodes["n3"].feature_level == 2
    assert c.crash_and_restart("n1").feature_level == 2


def test_raise_refused_while_a_member_has_not_reported_names_it() -> None:
    c = Cluster(3)
    c.isolated.add("n2")
    leader = c.elect()
    if leader == "n2":  # pragma: no cover - n2 is isolated, it cannot win
        raise AssertionError("an isolated node won")
    c.tick(times=2)
    node = c.nodes[leader]
    last = node.last_index
    with pytest.raises(FeatureLevelError, match="member n2 has not answered") as info:
        node.propose_feature_level(2)
    assert info.value.code == "FEATURE_LEVEL_UNSUPPORTED"
    assert node.last_index == last and node.feature_level == BASELINE_LEVEL
    c.isolated.clear()
    c.tick(times=3)
    _raise(c)
    assert all(c.nodes[n].feature_level == 2 for n in c.ids)


def test_a_member_that_reported_then_went_down_blocks_the_raise() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(times=2)
    down = next(n for n in c.ids if n != leader)
    c.isolated.add(down)  # it answered with level 2 earlier in this term
    c.tick(times=c.config.election_timeout_ticks + 1)
    assert c.leader() == leader
    with pytest.raises(FeatureLevelError, match=f"member {down} has not answered"):
        c.nodes[leader].propose_feature_level(2)
    c.isolated.clear()
    c.tick(times=2)
    _raise(c)


def test_raise_refused_for_an_old_member_and_for_bad_levels() -> None:
    c = Cluster(3, configs={"n2": OLD})
    c.isolated.add("n2")  # n2 must not lead: it could not raise
    leader = c.elect()
    c.isolated.clear()
    c.tick(times=3)
    node = c.nodes[leader]
    with pytest.raises(FeatureLevelError, match="member n2 supports feature levels up to 1"):
        node.propose_feature_level(2)
    with pytest.raises(FeatureLevelError, match="up to 2, not 3"):
        node.propose_feature_level(FEATURE_LEVEL + 1)
    with pytest.raises(FeatureLevelError, match="only raised"):
        node.propose_feature_level(BASELINE_LEVEL)
    assert node.feature_level == BASELINE_LEVEL


def test_raise_waits_for_the_terms_noop_and_for_a_pending_change() -> None:
    c = Cluster(3)
    c.drop = lambda m: isinstance(m, AppendResponse)  # nothing commits
    leader = c.elect()
    with pytest.raises(ConfChangePendingError, match="has not committed an entry of term"):
        c.nodes[leader].propose_feature_level(2)
    c.drop = None
    c.tick(times=2)
    node = c.nodes[leader]
    c.join("n3")
    node.propose_conf_change(ConfChange(ChangeKind.ADD_LEARNER, "n3"))
    with pytest.raises(ConfChangePendingError, match="not committed yet"):
        node.propose_feature_level(2)
    c.deliver()
    c.tick(times=2)
    _raise(c)
    assert c.nodes["n3"].feature_level == 2


def test_a_lowering_config_is_dropped_as_malformed() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(times=2)
    _raise(c)
    follower = next(n for n in c.ids if n != leader)
    fnode = c.nodes[follower]
    lnode = c.nodes[leader]
    last = lnode.last_index
    lowered = replace(lnode.conf_state, features=BASELINE_LEVEL)
    entry = Entry(lnode.term, last + 1, lowered.encode(), EntryType.CONFIG)
    before = fnode.dropped.get(DROP_MALFORMED, 0)
    fnode.step(
        AppendRequest(
            leader,
            follower,
            lnode.term,
            prev_log_index=last,
            prev_log_term=lnode.term,
            entries=(entry,),
            leader_commit=lnode.commit_index,
        )
    )
    assert fnode.dropped[DROP_MALFORMED] == before + 1
    assert fnode.last_index == last and fnode.feature_level == 2


def test_a_member_never_persists_a_level_above_its_support() -> None:
    c = Cluster(3, configs={"n2": OLD})
    leader = c.elect()
    c.tick(times=2)
    if leader == "n2":  # pragma: no cover - the seed makes another leader
        pytest.skip("n2 led")
    lnode = c.nodes[leader]
    raised = lnode.conf_state.raised(2, lnode.last_index + 1)
    entry = Entry(lnode.term, raised.index, raised.encode(), EntryType.CONFIG)
    old = c.nodes["n2"]
    last = old.last_index
    old.step(
        AppendRequest(
            leader,
            "n2",
            lnode.term,
            prev_log_index=last,
            prev_log_term=lnode.term,
            entries=(entry,),
            leader_commit=lnode.commit_index,
        )
    )
    assert old.dropped[DROP_FEATURE_LEVEL] == 1 and old.last_index == last


def test_entries_are_withheld_from_a_member_below_the_level() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(times=2)
    _raise(c)
    follower = next(n for n in c.ids if n != leader)
    # The follower restarts with an older release: its answers report level 1.
    c.configs[follower] = OLD
    with pytest.raises(FeatureLevelError, match="feature level is 2"):
        c.crash_and_restart(follower)
    # (A real node refuses to start; here a wiped copy of an old release comes back.)
    c.logs[follower] = MemLog()
    c.start(follower)
    c.tick(times=3)
    lnode = c.nodes[leader]
    lnode.propose([b"after"])
    c.deliver()
    c.tick(times=3)
    assert lnode.commit_index == lnode.last_index  # the other follower makes the majority
    old = c.nodes[follower]
    assert old.last_index == 0  # nothing sent: not even the log's first entries
    peer = next(p for p in lnode.status().peers if p.peer_id == follower)
    assert peer.withheld and peer.supported_feature_level == BASELINE_LEVEL
    # Heartbeats still reach it: it follows this leader and does not campaign.
    assert old.leader_id == leader
    # Upgraded again, it reports level 2 and catches up.
    c.configs[follower] = c.config
    c.crash_and_restart(follower)
    c.tick(times=5)
    assert c.nodes[follower].last_index == lnode.last_index
    assert c.nodes[follower].feature_level == 2


def test_an_answer_without_a_level_counts_as_the_baseline() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(times=2)
    lnode = c.nodes[leader]
    follower = next(n for n in c.ids if n != leader)
    lnode.step(
        AppendResponse(follower, leader, lnode.term, success=True, match_index=0)
    )  # a 0.2.0 peer sends no level
    peer = next(p for p in lnode.status().peers if p.peer_id == follower)
    assert peer.supported_feature_level == BASELINE_LEVEL
    with pytest.raises(FeatureLevelError, match=f"member {follower} supports feature levels up"):
        lnode.propose_feature_level(2)
    bad = AppendResponse(
        follower, leader, lnode.term, success=True, supported_feature_level=1 << 20
    )
    lnode.step(bad)
    assert lnode.dropped[DROP_MALFORMED] == 1


def test_a_log_above_the_nodes_support_is_refused_at_start() -> None:
    log = MemLog()
    conf = ConfState(frozenset({"n0"})).raised(2, 1)
    log.append([Entry(1, 1, conf.encode(), EntryType.CONFIG)])
    with pytest.raises(FeatureLevelError, match=r"feature level is 2 .* supports up to 1"):
        RaftNode("n0", ["n0"], log, OLD, random.Random(0))
    node = RaftNode("n0", ["n0"], log, RaftConfig(), random.Random(0))
    assert node.feature_level == 2
    # A log whose CONFIG entries lower the level is damaged, not a level to run at.
    lowered = replace(conf, index=2, features=BASELINE_LEVEL)
    log.append([Entry(1, 2, lowered.encode(), EntryType.CONFIG)])
    with pytest.raises(ConfigError, match="lowers the feature level from 2 to 1"):
        RaftNode("n0", ["n0"], log, RaftConfig(), random.Random(0))


def test_the_mutation_raises_without_reports() -> None:
    mutated = RaftConfig(mutations=frozenset({"raise_without_reports"}))
    c = Cluster(3, mutated, configs={"n2": replace(OLD, mutations=mutated.mutations)})
    c.isolated.add("n2")
    leader = c.elect()
    c.tick(times=2)
    c.nodes[leader].propose_feature_level(2)  # n2 never reported: refused unmutated
    c.deliver()
    assert c.nodes[leader].feature_level == 2
