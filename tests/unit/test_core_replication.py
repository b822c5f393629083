"""Log replication: NOOP on election, figure-8 commit rule, pipelining, back-off, truncation."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    AppendRequest,
    AppendResponse,
    BackPressureError,
    Message,
    NotLeaderError,
    ProgressState,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Role,
    VoteResponse,
)
from dledger.log import Entry, EntryType, HardState
from dledger.sim.harness import Cluster, drain, finish_ready
from dledger.sim.memlog import MemLog


def _drain(node: RaftNode, log: MemLog) -> list[Message]:
    return drain(node, log)


def _preset(log: MemLog, terms: list[int]) -> None:
    log.append([Entry(t, i + 1, b"e%d" % (i + 1)) for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term=max(terms, default=0)))


def _standalone_leader(terms: list[int], config: RaftConfig) -> tuple[RaftNode, MemLog]:
    """n0 of {n0, n1, n2} with a preset log, elected with n1's vote; nothing replicated."""
    log = MemLog()
    _preset(log, terms)
    node = RaftNode("n0", ["n1", "n2"], log, config, random.Random(0))
    while node.role is not Role.CANDIDATE:
        node.tick()
    _drain(node, log)
    node.step(VoteResponse("n1", "n0", node.term, granted=True))
    assert node.role is Role.LEADER
    return node, log


def _appends_to(msgs: list[Message], to: str) -> list[AppendRequest]:
    return [m for m in msgs if isinstance(m, AppendRequest) and m.to_id == to]


@pytest.mark.parametrize("n", [3, 5, 7])
def test_replicates_and_commits_in_order(n: int) -> None:
    c = Cluster(n, seed=n)
    leader = c.elect()
    for i in range(20):
        c.nodes[leader].propose([b"m%d" % i])
    c.tick(times=2)
    expected = [b"m%d" % i for i in range(20)]
    for nid in c.ids:
        assert c.bodies(nid) == expected
        assert c.nodes[nid].commit_index == c.nodes[leader].last_index


def test_new_leader_appends_noop_of_its_term() -> None:
    c = Cluster(3)
    leader = c.elect()
    node = c.nodes[leader]
    last = c.logs[leader].read(node.last_index)
    assert last.type == EntryType.NOOP and last.term == node.term
    assert node.commit_index == node.last_index  # committed through the NOOP


def test_figure8_old_term_entry_not_committed_by_count() -> None:
    cfg = RaftConfig(pre_vote=False)
    node, log = _standalone_leader([1, 2], cfg)  # NOOP of term 3 at index 3
    _drain(node, log)
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=2))
    _drain(node, log)
    assert node.commit_index == 0  # index 2 (term 2) is on a majority but is not of term 3
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=3))
    _drain(node, log)
    assert node.commit_index == 3  # committing the NOOP commits everything before it


def test_mutation_commit_old_term_by_count() -> None:
    cfg = RaftConfig(pre_vote=False, mutations=frozenset({"commit_old_term_by_count"}))
    node, log = _standalone_leader([1, 2], cfg)
    _drain(node, log)
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=2))
    _drain(node, log)
    assert node.commit_index == 2


def test_leader_counts_itself_only_when_persisted() -> None:
    c = Cluster(3)
    leader = c.elect()
    a, b = (x for x in c.ids if x != leader)
    c.isolated.add(b)
    c.hold_persist.add(leader)
    node = c.nodes[leader]
    before = node.commit_index
    node.propose([b"x"])
    c.deliver()
    assert c.nodes[a].last_index == node.last_index  # a acknowledged it (sent before persist)
    assert c.logs[leader].last_index() < node.last_index  # the leader's copy is not written
    assert node.commit_index == before  # and the leader does not count it
    c.release(leader)
    assert node.commit_index == node.last_index


def test_probe_sends_one_append_at_a_time() -> None:
    cfg = RaftConfig(pre_vote=False, max_append_batch_entries=1)
    node, log = _standalone_leader([1], cfg)
    msgs = _drain(node, log)
    assert len(_appends_to(msgs, "n1")) == 1  # the probe
    node.propose([b"a"])
    node.propose([b"b"])
    assert _appends_to(_drain(node, log), "n1") == []  # still probing: wait for an answer
    assert node.status().peers[0].state == ProgressState.PROBE.value


def test_replicate_pipelines_up_to_the_inflight_window() -> None:
    cfg = RaftConfig(pre_vote=False, max_append_batch_entries=1, max_inflight_appends=4)
    node, log = _standalone_leader([1], cfg)
    (probe,) = _appends_to(_drain(node, log), "n1")
    # follower n1 matches everything: switch to replicate
    node.step(
        AppendResponse("n1", "n0", node.term, success=True, match_index=probe.prev_log_index + 1)
    )
    _drain(node, log)
    node.propose([b"p%d" % i for i in range(10)])
    sent = _appends_to(_drain(node, log), "n1")
    assert len(sent) == 4  # pipelined, without waiting, but bounded
    assert all(len(m.entries) == 1 for m in sent)
    assert [m.entries[0].index for m in sent] == [3, 4, 5, 6]
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=3))
    sent = _appends_to(_drain(node, log), "n1")
    assert [m.entries[0].index for m in sent] == [7]  # one slot freed, one more sent


def test_batches_respect_entry_and_byte_limits() -> None:
    c = Cluster(3, RaftConfig(max_append_batch_entries=3, max_append_batch_bytes=10))
    leader = c.elect()
    c.nodes[leader].propose([b"1234"] * 10)
    c.tick(times=2)
    sizes = [len(m.entries) for m in c.sent if isinstance(m, AppendRequest) and m.entries]
    assert max(sizes) <= 2  # 3 bodies of 4 bytes exceed 10 bytes
    assert c.bodies("n1") == [b"1234"] * 10


def _divergent_cluster(conflict_len: int, config: RaftConfig) -> Cluster:
    c = Cluster(3, config)
    _preset(c.logs["n0"], [1, 1, 1, 3, 3])
    _preset(c.logs["n1"], [1, 1, 1] + [2] * conflict_len)
    _preset(c.logs["n2"], [1, 1, 1, 3, 3])
    for nid in c.ids:
        c.start(nid)
    return c


def test_fast_conflict_backoff_jumps_over_a_whole_term() -> None:
    c = _divergent_cluster(50, RaftConfig(pre_vote=False))
    c.tick_until(lambda: c.leader() in ("n0", "n2"))
    c.tick(times=3)
    rejections = [
        m for m in c.sent if isinstance(m, AppendResponse) and m.from_id == "n1" and not m.success
    ]
    assert 1 <= len(rejections) <= 2  # not one per conflicting entry (50)
    assert rejections[0].conflict_term == 2 and rejections[0].conflict_index == 4


def test_conflicting_suffix_is_truncated() -> None:
    c = _divergent_cluster(50, RaftConfig(pre_vote=False))
    c.tick_until(lambda: c.leader() in ("n0", "n2"))
    leader = c.leader()
    assert leader is not None
    c.nodes[leader].propose([b"after"])
    c.tick(times=3)
    assert c.logs["n1"].entries() == c.logs[leader].entries()
    assert c.logs["n1"].last_index() < 53


def test_mutation_no_truncate_conflict_keeps_divergent_log() -> None:
    cfg = RaftConfig(pre_vote=False, mutations=frozenset({"no_truncate_conflict"}))
    c = _divergent_cluster(2, cfg)
    c.tick_until(lambda: c.leader() in ("n0", "n2"))
    leader = c.leader()
    assert leader is not None
    c.tick(times=3)
    assert [e.term for e in c.logs["n1"].entries()][3:5] == [2, 2]  # kept the conflict
    assert c.logs["n1"].entries() != c.logs[leader].entries()


def test_follower_reports_and_repairs_committed_entries_its_leader_lacks() -> None:
    log = MemLog()
    _preset(log, [1, 1, 1])
    node = RaftNode("n1", ["n0", "n2"], log, RaftConfig(), random.Random(0))
    node.step(AppendRequest("n0", "n1", 1, 3, 1, (), 3))  # learns commit 3
    _drain(node, log)
    assert node.commit_index == 3
    # A leader (term 2) whose entries differ from the committed ones: it holds what a
    # majority acknowledged, so this copy is the damaged one (docs/RAFT.md section 13). Never
    # silent: counted, and repaired (the follower takes the leader's entries).
    bad = (Entry(2, 2, b"zz"), Entry(2, 3, b"zz"), Entry(2, 4, b"new"))
    node.step(AppendRequest("n0", "n1", 2, 1, 1, bad, 3))
    _drain(node, log)
    assert [e.term for e in log.entries()] == [1, 2, 2, 2]
    assert node.status().committed_repairs == 1 and node.status().chain_mismatches == 1


def test_back_pressure_and_not_leader_errors() -> None:
    c = Cluster(3, RaftConfig(max_pending_proposal_bytes=10))
    leader = c.elect()
    follower = next(x for x in c.ids if x != leader)
    with pytest.raises(NotLeaderError) as info:
        c.nodes[follower].propose([b"x"])
    assert info.value.leader_id == leader and info.value.code == "NOT_LEADER"
    c.isolated.update(x for x in c.ids if x != leader)
    c.nodes[leader].propose([b"123456"])
    with pytest.raises(BackPressureError) as bp:
        c.nodes[leader].propose([b"123456"])
    assert bp.value.code == "BACK_PRESSURE"
    with pytest.raises(ProposalDroppedError):
        c.nodes[leader].propose([])
    c.isolated.clear()
    c.tick(times=2)
    c.nodes[leader].propose([b"123456"])  # committed: room again


def test_restarted_follower_relearns_commit() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.nodes[leader].propose([b"a", b"b"])
    c.tick(times=2)
    follower = next(x for x in c.ids if x != leader)
    node = c.crash_and_restart(follower)
    assert node.commit_index == 0
    c.tick(times=2)
    assert node.commit_index == c.nodes[leader].commit_index
    assert c.bodies(follower) == [b"a", b"b"]


def test_status_reports_peer_lag() -> None:
    c = Cluster(3)
    leader = c.elect()
    lagging = next(x for x in c.ids if x != leader)
    c.isolated.add(lagging)
    c.nodes[leader].propose([b"a", b"b", b"c"])
    c.deliver()
    st = c.nodes[leader].status()
    assert st.role is Role.LEADER and st.leader_id == leader
    lag = {p.peer_id: p.lag_entries for p in st.peers}
    assert lag[lagging] >= 3
    assert min(lag.values()) == 0


def _replicating_leader() -> tuple[RaftNode, MemLog]:
    """A leader whose followers both answered its first probe: appends are pipelined."""
    node, log = _standalone_leader([1], RaftConfig(pre_vote=False))
    (probe,) = _appends_to(_drain(node, log), "n1")
    for peer in ("n1", "n2"):
        node.step(
            AppendResponse(
                peer, "n0", node.term, success=True, match_index=probe.prev_log_index + 1
            )
        )
    _drain(node, log)
    return node, log


def test_proposals_and_commits_between_two_readies_share_one_message_per_follower() -> None:
    """Appends and commit notices are owed until ready(): two proposals in a row go out as
    one append per follower, and a commit learnt meanwhile rides on it (no extra notice)."""
    node, log = _replicating_leader()
    first = node.propose([b"a"])
    second = node.propose([b"b"])
    assert node.has_ready()
    msgs = _drain(node, log)
    for peer in ("n1", "n2"):
        (append,) = _appends_to(msgs, peer)
        assert [e.index for e in append.entries] == [first.first_index, second.first_index]
    # Both followers answer: the commit advances; nobody has appends in flight any more, so
    # each gets exactly one commit notice, held by the next ready() until the release.
    for peer in ("n1", "n2"):
        node.step(
            AppendResponse(peer, "n0", node.term, success=True, match_index=second.last_index)
        )
    assert node.commit_index == second.last_index
    assert _drain(node, log) == []
    node.release_notices()
    notices = _drain(node, log)
    for peer in ("n1", "n2"):
        (notice,) = _appends_to(notices, peer)
        assert notice.entries == () and notice.leader_commit == second.last_index
        assert notice.no_reply
    # A commit and a new proposal before the same ready(): the append carries the commit.
    third = node.propose([b"c"])
    _drain(node, log)
    for peer in ("n1", "n2"):
        node.step(AppendResponse(peer, "n0", node.term, success=True, match_index=third.last_index))
    fourth = node.propose([b"d"])
    msgs = _drain(node, log)
    for peer in ("n1", "n2"):
        (append,) = _appends_to(msgs, peer)
        assert [e.index for e in append.entries] == [fourth.first_index]
        assert append.leader_commit == third.last_index


def test_a_follower_that_answers_after_the_commit_is_told_at_once() -> None:
    """n1's answer makes the majority; n2's, later, finds the entry committed already: n2 gets
    a commit notice at the release of the held notices (the driver's linger), not at the next
    heartbeat."""
    node, log = _replicating_leader()
    p = node.propose([b"a"])
    _drain(node, log)
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=p.last_index))
    assert node.commit_index == p.last_index
    assert _drain(node, log) == []
    node.release_notices()
    (notice,) = _drain(node, log)
    assert notice.to_id == "n1"
    node.step(AppendResponse("n2", "n0", node.term, success=True, match_index=p.last_index))
    assert node.has_ready()
    rd = node.ready()
    assert rd.notices_held and not rd.early_messages and not rd.messages
    finish_ready(node, log, rd)
    node.release_notices()
    (late,) = _drain(node, log)
    assert isinstance(late, AppendRequest) and late.to_id == "n2" and late.no_reply
    assert late.entries == () and late.leader_commit == p.last_index
    # Told once: a repeated answer owes nothing more.
    node.step(AppendResponse("n2", "n0", node.term, success=True, match_index=p.last_index))
    assert _drain(node, log) == []


def test_a_late_answer_while_notices_are_held_makes_no_ready() -> None:
    """One send in flight: n1's answer commits and holds a notice for n1; n2's answer comes
    while that hold is pending. It makes no Ready of its own (the pending release covers n2
    too), and the release tells both."""
    node, log = _replicating_leader()
    p = node.propose([b"a"])
    _drain(node, log)
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=p.last_index))
    rd = node.ready()
    assert rd.notices_held and [e.index for e in rd.committed] == [p.last_index]
    finish_ready(node, log, rd)
    node.step(AppendResponse("n2", "n0", node.term, success=True, match_index=p.last_index))
    assert not node.has_ready()
    node.release_notices()
    notices = _drain(node, log)
    assert sorted(m.to_id for m in notices) == ["n1", "n2"]
    assert all(isinstance(m, AppendRequest) and m.no_reply for m in notices)
    assert all(m.leader_commit == p.last_index for m in notices)


def test_commit_notices_need_no_answer_unless_rejected() -> None:
    log = MemLog()
    _preset(log, [1, 1])
    node = RaftNode("n1", ["n0", "n2"], log, RaftConfig(), random.Random(0))
    _drain(node, log)

    def notice(prev: int, prev_term: int, commit: int) -> list[Message]:
        node.step(AppendRequest("n0", "n1", 1, prev, prev_term, (), commit, no_reply=True))
        return _drain(node, log)

    assert notice(2, 1, 2) == []  # matches: the commit moves, no answer
    assert node.commit_index == 2
    (reject,) = notice(5, 1, 2)  # the leader thinks n1 has more than it does: it must say so
    assert isinstance(reject, AppendResponse) and not reject.success
    # A tick heartbeat (no_reply unset) is always answered.
    node.step(AppendRequest("n0", "n1", 1, 2, 1, (), 2))
    (answer,) = _drain(node, log)
    assert isinstance(answer, AppendResponse) and answer.success and answer.match_index == 2


def _answered_appends(msgs: list[Message]) -> dict[str, list[AppendRequest]]:
    """The appends in ``msgs`` that ask for an answer (heartbeats and batches), per follower."""
    out: dict[str, list[AppendRequest]] = {"n1": [], "n2": []}
    for m in msgs:
        if isinstance(m, AppendRequest) and not m.no_reply:
            out[m.to_id].append(m)
    return out


def _answer(node: RaftNode, msgs: list[Message]) -> None:
    for m in msgs:
        if isinstance(m, AppendRequest) and not m.no_reply:
            last = m.prev_log_index + len(m.entries)
            node.step(AppendResponse(m.to_id, "n0", node.term, success=True, match_index=last))


def test_a_follower_an_answered_append_reached_within_the_interval_gets_no_heartbeat() -> None:
    """Heartbeats every 3 ticks: an append resets its follower's heartbeat clock, so under a
    steady flow of proposals no heartbeat goes out, and the first one after the flow stops
    follows the last append by exactly the interval."""
    node, log = _standalone_leader([1], RaftConfig(pre_vote=False, heartbeat_interval_ticks=3))
    _answer(node, _drain(node, log))
    _answer(node, _drain(node, log))
    for _ in range(12):  # a proposal every tick: appends only
        node.tick()
        node.propose([b"x"])
        msgs = _drain(node, log)
        _answer(node, msgs)
        sent = _answered_appends(msgs)
        assert all(len(a) == 1 and a[0].entries for a in sent.values()), sent
        node.release_notices()
        _drain(node, log)
    for tick in (1, 2, 3):
        node.tick()
        sent = _answered_appends(_drain(node, log))
        heartbeats = [m.to_id for a in sent.values() for m in a if not m.entries]
        assert heartbeats == ([] if tick < 3 else ["n1", "n2"])
    assert node.role is Role.LEADER


def test_commit_notices_do_not_stand_in_for_heartbeats() -> None:
    """A no-reply commit notice brings no answer, so it cannot prove the follower alive for
    check-quorum: the heartbeat stays due one interval after the last answered append. And
    a follower that got an append is still sent the heartbeat the other one is due."""
    node, log = _standalone_leader([1], RaftConfig(pre_vote=False, heartbeat_interval_ticks=3))
    _answer(node, _drain(node, log))
    _answer(node, _drain(node, log))
    for _ in range(3):
        node.tick()
        _answer(node, _drain(node, log))
    node.tick()  # tick 1 of the interval: a proposal; n1 answers, n2 does not
    p = node.propose([b"a"])
    _drain(node, log)
    node.step(AppendResponse("n1", "n0", node.term, success=True, match_index=p.last_index))
    assert _drain(node, log) == []  # committed; n1's notice is held
    node.tick()  # tick 2: the held notice for n1 goes out with the tick
    notices = [m for m in _drain(node, log) if isinstance(m, AppendRequest) and m.no_reply]
    assert [m.to_id for m in notices] == ["n1"]
    node.step(AppendResponse("n2", "n0", node.term, success=True, match_index=p.last_index))
    _drain(node, log)
    node.release_notices()
    assert [m.to_id for m in _drain(node, log) if isinstance(m, AppendRequest)] == ["n2"]
    node.tick()  # tick 3: nothing due yet (the append went 2 ticks ago)
    assert _answered_appends(_drain(node, log)) == {"n1": [], "n2": []}
    node.tick()  # tick 4: both heartbeats due, whatever notices went since
    sent = _answered_appends(_drain(node, log))
    assert [len(sent["n1"]), len(sent["n2"])] == [1, 1]
    assert not sent["n1"][0].entries and not sent["n2"][0].entries


@pytest.mark.parametrize("seed", range(5))
def test_every_follower_gets_an_answered_append_at_least_every_interval(seed: int) -> None:
    """Proposals at random ticks, answers from one follower lost at random: each follower
    still receives an append that asks for an answer at least every heartbeat interval (what
    its election timer and the leader's check-quorum rely on), and a heartbeat only when
    nothing else went to it for a whole interval."""
    rng = random.Random(seed)
    interval = 1 + seed % 3
    cfg = RaftConfig(pre_vote=False, heartbeat_interval_ticks=interval)
    node, log = _standalone_leader([1], cfg)
    _answer(node, _drain(node, log))
    _answer(node, _drain(node, log))
    last_sent = {"n1": 0, "n2": 0}
    for tick in range(1, 80):
        node.tick()
        if rng.random() < 0.4:
            node.propose([b"x"])
        msgs = _drain(node, log)
        for peer, appends in _answered_appends(msgs).items():
            for m in appends:
                if not m.entries:
                    assert tick - last_sent[peer] >= interval, (peer, tick, last_sent)
                last_sent[peer] = tick
            assert tick - last_sent[peer] < interval, (peer, tick, last_sent)
        _answer(node, [m for m in msgs if rng.random() < 0.8 or m.to_id == "n1"])
        if rng.random() < 0.5:
            node.release_notices()
            _drain(node, log)
    assert node.role is Role.LEADER


def test_a_follower_that_lost_acknowledged_entries_gets_them_again() -> None:
    # A follower's store cut damage at open (docs/STORAGE.md "Damage and repair"): it
    # restarts with a log that ends below the match its leader holds for it. The leader
    # must walk back and send the lost entries again, not wait for ever at the old match.
    c = Cluster(3, seed=7)
    leader = c.elect()
    for i in range(30):
        c.nodes[leader].propose([b"m%d" % i])
    c.tick(times=2)
    victim = next(n for n in c.ids if n != leader)
    full = c.bodies(victim)
    assert len(full) == 30
    c.logs[victim].truncate_suffix(10)  # what the open's cut leaves: indexes 1..9
    c.crash_and_restart(victim)
    c.tick_until(lambda: c.bodies(victim) == full, max_ticks=200)
    assert c.nodes[victim].commit_index == c.nodes[leader].commit_index
