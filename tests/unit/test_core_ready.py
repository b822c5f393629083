"""The Ready contract: the core never writes; Ready carries the entries, the truncation point
and the hard state; which messages may go before the persist; commit notices coalesced."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    AppendRequest,
    AppendResponse,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    VoteRequest,
    VoteResponse,
)
from dledger.core.raftlog import RaftLog
from dledger.log import DLedgerError, Entry, HardState, persist
from dledger.sim.harness import Cluster, drain, finish_ready
from dledger.sim.memlog import MemLog

CFG = RaftConfig(pre_vote=False, check_quorum=False)


def _follower(terms: list[int]) -> tuple[RaftNode, MemLog]:
    """n0 of {n0, n1, n2} holding ``terms`` (stored, durable), following n1 in term 5."""
    log = MemLog()
    log.append([Entry(t, i + 1, b"e%d" % (i + 1)) for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term=5))
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    return node, log


def _append(prev: int, prev_term: int, terms: list[int], commit: int = 0) -> AppendRequest:
    entries = tuple(Entry(t, prev + 1 + i, b"x%d" % (prev + 1 + i)) for i, t in enumerate(terms))
    return AppendRequest("n1", "n0", 5, prev, prev_term, entries, commit)


def test_step_never_writes_the_store() -> None:
    node, log = _follower([1, 1, 2, 2])
    before = log.entries()
    node.step(_append(2, 1, [5, 5, 5]))  # conflicts at index 3: the log is cut there
    assert log.entries() == before  # nothing written, nothing cut
    assert node.last_index == 5 and node.last_term == 5
    rd = node.ready()
    assert rd.truncate_from == 3
    assert [e.index for e in rd.entries] == [3, 4, 5]
    assert rd.early_messages == ()  # a follower's answer waits for the persist
    (ack,) = rd.messages
    assert isinstance(ack, AppendResponse) and ack.success and ack.match_index == 5
    assert log.entries() == before  # ready() writes nothing either
    finish_ready(node, log, rd)
    assert [e.term for e in log.entries()] == [1, 1, 5, 5, 5]
    assert node.stable_index == 5


def test_a_crash_before_the_persist_loses_the_unstable_tail() -> None:
    node, log = _follower([1, 1])
    node.step(_append(2, 1, [5, 5]))
    node.ready()  # handed to a driver that dies before persisting
    log.crash()
    node = RaftNode("n0", ["n1", "n2"], log, CFG, random.Random(0))
    assert node.last_index == 2  # the acknowledgement was never sent, so nothing is lost


def test_a_cut_during_a_persist_is_carried_by_the_next_ready() -> None:
    node, log = _follower([1])
    node.step(_append(1, 1, [5, 5, 5]))
    rd = node.ready()  # the job writing 2..4 is in flight
    node.step(AppendRequest("n1", "n0", 6, 2, 5, (Entry(6, 3, b"y"),), 0))  # term 6 cuts at 3
    persist(log, rd.hard_state, rd.truncate_from, rd.entries, flush=True)
    node.advance(rd)
    assert node.stable_index == 2  # 3 and 4 were written but are no longer this log's
    assert log.last_index() == 4
    rd = node.ready()
    assert rd.truncate_from == 3 and [(e.index, e.term) for e in rd.entries] == [(3, 6)]
    finish_ready(node, log, rd)
    assert [e.term for e in log.entries()] == [1, 5, 6]


def test_a_cut_into_the_stored_log_while_a_persist_runs() -> None:
    node, log = _follower([1, 1, 1])
    node.step(_append(3, 1, [5]))
    rd = node.ready()  # writes 4
    node.step(_append(1, 1, [5, 5]))  # conflicts at stored index 2
    persist(log, rd.hard_state, rd.truncate_from, rd.entries, flush=True)
    node.advance(rd)
    assert node.stable_index == 1
    rd = node.ready()
    assert rd.truncate_from == 2 and [e.index for e in rd.entries] == [2, 3]
    finish_ready(node, log, rd)
    assert [e.term for e in log.entries()] == [1, 5, 5]


def test_vote_request_and_vote_wait_for_the_hard_state() -> None:
    node, _ = _follower([])
    while node.role is not Role.CANDIDATE:
        node.tick()
    rd = node.ready()
    assert rd.hard_state == HardState(term=6, voted_for="n0")
    assert rd.early_messages == ()
    assert {type(m) for m in rd.messages} == {VoteRequest}
    node.advance(rd)
    voter, _ = _follower([])
    voter.step(VoteRequest("n2", "n0", 6, 0, 0))
    rd = voter.ready()
    assert rd.hard_state == HardState(term=6, voted_for="n2")
    assert rd.early_messages == () and isinstance(rd.messages[0], VoteResponse)


def test_leader_appends_go_before_its_persist_and_count_it_only_after() -> None:
    c = Cluster(3, CFG)
    leader = c.elect()
    node = c.nodes[leader]
    node.propose([b"a"])
    rd = node.ready()
    assert rd.entries and {type(m) for m in rd.early_messages} == {AppendRequest}
    assert rd.messages == ()
    for f in (x for x in c.ids if x != leader):
        node.step(AppendResponse(f, leader, node.term, True, match_index=node.last_index))
    # Both followers persisted it: committed by a majority without the leader's own copy,
    # but commit_index counts only what the leader's stored log holds.
    assert node.commit_index < node.last_index
    finish_ready(node, c.logs[leader], rd)
    assert node.commit_index == node.last_index
    rd = node.ready()
    assert [e.body for e in rd.committed] == [b"a"]


def _leader_with_idle_followers() -> tuple[Cluster, str, RaftNode]:
    c = Cluster(3, CFG)
    leader = c.elect()
    c.tick(times=2)
    return c, leader, c.nodes[leader]


def _ack_all(c: Cluster, leader: str, rd: Ready) -> None:
    node = c.nodes[leader]
    finish_ready(node, c.logs[leader], rd)
    for f in (x for x in c.ids if x != leader):
        node.step(AppendResponse(f, leader, node.term, True, match_index=node.last_index))


def _notices(rd: Ready) -> list[AppendRequest]:
    return [
        m
        for m in rd.early_messages
        if isinstance(m, AppendRequest) and m.no_reply and not m.entries
    ]


def _held_after_commit(c: Cluster, leader: str, node: RaftNode) -> Ready:
    """Propose, every follower acks: the commit advances and the next Ready holds notices."""
    node.propose([b"a"])
    _ack_all(c, leader, node.ready())
    rd = node.ready()
    assert rd.notices_held and _notices(rd) == [] and not rd.is_empty()
    return rd


def test_commit_notice_is_held_then_sent_at_release() -> None:
    c, leader, node = _leader_with_idle_followers()
    rd = _held_after_commit(c, leader, node)
    finish_ready(node, c.logs[leader], rd)
    assert not node.has_ready()  # held: nothing to do before the driver's linger ends
    node.release_notices()
    rd = node.ready()
    assert sorted(m.to_id for m in _notices(rd)) == [x for x in c.ids if x != leader]
    assert all(m.leader_commit == node.last_index for m in _notices(rd))
    assert not rd.notices_held
    finish_ready(node, c.logs[leader], rd)
    node.release_notices()  # a second call (a late timer) sends nothing more
    assert not node.has_ready()


def test_held_notice_is_dropped_when_a_later_append_carries_the_commit() -> None:
    c, leader, node = _leader_with_idle_followers()
    finish_ready(node, c.logs[leader], _held_after_commit(c, leader, node))
    committed = node.commit_index
    node.propose([b"b"])  # within the linger: its appends carry the commit index
    rd = node.ready()
    appends = [m for m in rd.early_messages if isinstance(m, AppendRequest)]
    assert len(appends) == 2 and all(m.leader_commit == committed for m in appends)
    assert not rd.notices_held  # nothing held any more: the driver may cancel its timer
    finish_ready(node, c.logs[leader], rd)
    node.release_notices()
    assert not node.has_ready()  # both notices superseded: nothing goes out


def test_a_hold_after_a_superseded_one_is_reported_anew() -> None:
    """A driver that cancelled its timer when the hold ended arms a new one for the next hold:
    the Ready of the next commit says notices_held again, and the notices go out only at the
    release (not with the acks that committed)."""
    c, leader, node = _leader_with_idle_followers()
    finish_ready(node, c.logs[leader], _held_after_commit(c, leader, node))
    node.propose([b"b"])
    rd = node.ready()
    assert not rd.notices_held
    _ack_all(c, leader, rd)
    rd = node.ready()
    assert rd.notices_held and _notices(rd) == []
    finish_ready(node, c.logs[leader], rd)
    node.release_notices()
    rd = node.ready()
    assert sorted(m.to_id for m in _notices(rd)) == [x for x in c.ids if x != leader]
    assert all(m.leader_commit == node.last_index for m in _notices(rd))


def test_commit_notice_is_not_held_when_an_append_in_the_same_ready_carries_it() -> None:
    c, leader, node = _leader_with_idle_followers()
    node.propose([b"a"])
    _ack_all(c, leader, node.ready())
    committed = node.commit_index
    node.propose([b"b"])  # before the next ready(): its appends carry the commit index
    rd = node.ready()
    assert _notices(rd) == [] and not rd.notices_held
    appends = [m for m in rd.early_messages if isinstance(m, AppendRequest)]
    assert len(appends) == 2 and all(m.leader_commit == committed for m in appends)


def test_one_notice_per_follower_for_several_commits() -> None:
    c, leader, node = _leader_with_idle_followers()
    node.propose([b"a"])
    node.propose([b"b"])
    rd = node.ready()
    finish_ready(node, c.logs[leader], rd)
    follower = next(x for x in c.ids if x != leader)
    for i in (node.last_index - 1, node.last_index):  # two acks, two commit advances
        node.step(AppendResponse(follower, leader, node.term, True, match_index=i))
    rd = node.ready()
    assert rd.notices_held
    finish_ready(node, c.logs[leader], rd)
    node.release_notices()
    rd = node.ready()
    assert [(m.to_id, m.leader_commit) for m in _notices(rd)] == [(follower, node.last_index)]


def test_tick_releases_held_notices_after_its_heartbeats() -> None:
    # Heartbeats every 5 ticks: the next tick sends none, so the released notices go out.
    c = Cluster(3, RaftConfig(pre_vote=False, check_quorum=False, heartbeat_interval_ticks=5))
    leader = c.elect()
    c.tick(times=5)
    node = c.nodes[leader]
    finish_ready(node, c.logs[leader], _held_after_commit(c, leader, node))
    node.tick()
    rd = node.ready()
    assert sorted(m.to_id for m in _notices(rd)) == [x for x in c.ids if x != leader]


def test_a_heartbeat_in_the_releasing_tick_supersedes_the_held_notices() -> None:
    c, leader, node = _leader_with_idle_followers()  # a heartbeat every tick
    finish_ready(node, c.logs[leader], _held_after_commit(c, leader, node))
    node.tick()
    sent = drain(node, c.logs[leader])
    assert all(isinstance(m, AppendRequest) and not m.no_reply for m in sent)
    assert sorted(m.to_id for m in sent) == [x for x in c.ids if x != leader]
    assert all(m.leader_commit == node.last_index for m in sent if isinstance(m, AppendRequest))


def test_held_notices_are_dropped_when_the_leader_steps_down() -> None:
    c, leader, node = _leader_with_idle_followers()
    finish_ready(node, c.logs[leader], _held_after_commit(c, leader, node))
    other = next(x for x in c.ids if x != leader)
    node.step(VoteRequest(other, leader, node.term + 1, node.last_index, node.last_term))
    assert node.role is Role.FOLLOWER
    node.release_notices()
    sent = drain(node, c.logs[leader])
    assert not any(isinstance(m, AppendRequest) for m in sent)


def test_drain_sends_early_messages_first() -> None:
    c = Cluster(3, CFG)
    leader = c.elect()
    node = c.nodes[leader]
    node.propose([b"a"])
    msgs = drain(node, c.logs[leader])
    assert msgs and all(isinstance(m, AppendRequest) for m in msgs)


def test_raftlog_reads_across_the_stored_prefix_and_the_tail() -> None:
    store = MemLog()
    store.append([Entry(1, 1, b"a"), Entry(1, 2, b"b")])
    rl = RaftLog(store)
    rl.append([Entry(2, 3, b"c"), Entry(2, 4, b"d")])
    assert (rl.last_index(), rl.last_term(), rl.stable_last()) == (4, 2, 2)
    assert [e.index for e in rl.read_range(1, 1 << 20, 10)] == [1, 2]  # stops at the store
    assert [e.index for e in rl.read_range(3, 1 << 20, 10)] == [3, 4]
    assert rl.read_range(5, 1 << 20, 10) == []
    assert [e.index for e in rl.read_range(3, 1, 10)] == [3]  # at least one entry
    with pytest.raises(DLedgerError):
        rl.term_at(5)


class _FullOnce(MemLog):
    """A store whose first append is refused as on a full disk (nothing of it written)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False

    def append(self, entries: list[Entry]) -> int:  # type: ignore[override]
        if not self.refused:
            self.refused = True
            raise DLedgerError("disk full")
        return super().append(entries)


def test_persist_job_can_run_again_after_a_refused_append() -> None:
    store = _FullOnce()
    store.refused = True  # the preset entries go in
    store.append([Entry(1, i, b"e") for i in (1, 2, 3)])
    store.flush()
    store.refused = False  # the next append is refused
    job = (HardState(term=2, voted_for="n1"), 2, [Entry(2, 2, b"n")])
    with pytest.raises(DLedgerError):
        persist(store, *job, flush=True)
    assert store.last_index() == 1  # the cut was made, the append was not
    persist(store, *job, flush=True)  # the retry: the cut is a no-op now
    assert [(e.index, e.term) for e in store.entries()] == [(1, 1), (2, 2)]
    assert store.load_hard_state() == HardState(term=2, voted_for="n1")


def test_a_follower_with_readers_waiting_gets_its_notice_without_the_linger() -> None:
    """Its answer said readers wait for its apply: its notice goes out in the Ready of the
    commit; the other follower's is held as before and only it goes at the release."""
    c, leader, node = _leader_with_idle_followers()
    eager, other = (x for x in c.ids if x != leader)
    node.propose([b"a"])
    finish_ready(node, c.logs[leader], node.ready())
    last = node.last_index
    node.step(
        AppendResponse(eager, leader, node.term, True, match_index=last, readers_waiting=True)
    )
    node.step(AppendResponse(other, leader, node.term, True, match_index=last))
    rd = node.ready()
    assert [(m.to_id, m.leader_commit) for m in _notices(rd)] == [(eager, last)]
    assert rd.notices_held  # the other one's
    finish_ready(node, c.logs[leader], rd)
    node.release_notices()
    rd = node.ready()
    assert [m.to_id for m in _notices(rd)] == [other]


def test_a_late_answer_with_readers_waiting_is_told_while_a_hold_is_pending() -> None:
    """The slower follower answers after the commit, while the faster one's notice is held:
    with readers waiting it is told at once instead of at the release."""
    c, leader, node = _leader_with_idle_followers()
    fast, slow = (x for x in c.ids if x != leader)
    node.propose([b"a"])
    finish_ready(node, c.logs[leader], node.ready())
    last = node.last_index
    node.step(AppendResponse(fast, leader, node.term, True, match_index=last))
    rd = node.ready()
    assert rd.notices_held and _notices(rd) == []
    finish_ready(node, c.logs[leader], rd)
    node.step(AppendResponse(slow, leader, node.term, True, match_index=last, readers_waiting=True))
    rd = node.ready()
    assert [(m.to_id, m.leader_commit) for m in _notices(rd)] == [(slow, last)]
    finish_ready(node, c.logs[leader], rd)
    node.release_notices()
    assert [m.to_id for m in _notices(node.ready())] == [fast]


def test_a_followers_answers_say_whether_readers_wait() -> None:
    node, log = _follower([5])
    for waiting in (True, False):
        node.set_readers_waiting(waiting)
        node.step(_append(node.last_index, 5, [5]))
        rd = node.ready()
        finish_ready(node, log, rd)
        (ack,) = [m for m in rd.messages if isinstance(m, AppendResponse)]
        assert ack.success and ack.readers_waiting is waiting
    node.set_readers_waiting(True)
    node.step(_append(node.last_index + 5, 5, [5]))  # a gap: rejected, still says it
    (nack,) = [m for m in node.ready().messages if isinstance(m, AppendResponse)]
    assert not nack.success and nack.readers_waiting
