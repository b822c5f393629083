"""The leader's byte window per follower (RaftConfig.max_inflight_bytes, issue 36): beside the
count of appends in flight, the bytes of their bodies are bounded, freed by acks and cleared
with the window; one append always goes, however big."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    AppendRequest,
    AppendResponse,
    ConfigError,
    Message,
    RaftConfig,
    RaftNode,
    Role,
    VoteResponse,
)
from dledger.core.config import MAX_INFLIGHT_BYTES_LIMIT
from dledger.core.progress import Progress
from dledger.log import Entry, HardState
from dledger.sim.harness import Cluster, drain
from dledger.sim.memlog import MemLog

# Bodies of 4 bytes and a window of 10 bytes: two appends of one body fit (8 bytes), a third
# (12 bytes) does not; the count limit (64) is never what stops the sending here.
BODY = b"abcd"
WINDOW_BYTES = 10


def _leader(config: RaftConfig) -> tuple[RaftNode, MemLog]:
    """n0 of {n0, n1, n2}, elected with n1's vote, n1 switched to replicate at index 2 (the
    election's NOOP); nothing else in flight."""
    log = MemLog()
    log.append([Entry(1, 1, b"e1")])
    log.flush()
    log.save_hard_state(HardState(term=1))
    node = RaftNode("n0", ["n1", "n2"], log, config, random.Random(0))
    while node.role is not Role.CANDIDATE:
        node.tick()
    drain(node, log)
    node.step(VoteResponse("n1", "n0", node.term, granted=True))
    assert node.role is Role.LEADER
    (probe,) = _appends_to(drain(node, log), "n1")
    node.step(_ack(node, probe.prev_log_index + len(probe.entries)))
    drain(node, log)
    return node, log


def _config(**kw: int) -> RaftConfig:
    base = {"max_append_batch_entries": 1, "max_inflight_bytes": WINDOW_BYTES}
    base.update(kw)
    return RaftConfig(pre_vote=False, **base)  # type: ignore[arg-type]


def _ack(node: RaftNode, match: int, last_log_index: int = 0) -> AppendResponse:
    return AppendResponse(
        "n1", "n0", node.term, success=True, match_index=match, last_log_index=last_log_index
    )


def _appends_to(msgs: list[Message], to: str) -> list[AppendRequest]:
    return [m for m in msgs if isinstance(m, AppendRequest) and m.to_id == to]


def _sent_indexes(node: RaftNode, log: MemLog) -> list[int]:
    return [e.index for m in _appends_to(drain(node, log), "n1") for e in m.entries]


def _n1_inflight_bytes(node: RaftNode) -> int:
    (n1,) = [p for p in node.status().peers if p.peer_id == "n1"]
    return n1.inflight_bytes


def test_the_leader_stops_at_the_byte_window_and_resumes_as_acks_free_it() -> None:
    node, log = _leader(_config())
    node.propose([BODY] * 6)  # indexes 3..8
    assert _sent_indexes(node, log) == [3, 4]  # 8 bytes in flight; a third would make 12
    assert _n1_inflight_bytes(node) == 8
    node.tick()
    assert _sent_indexes(node, log) == []  # nothing more while the window is full
    node.step(_ack(node, 3))
    assert _sent_indexes(node, log) == [5]  # one append's bytes freed: one more goes
    node.step(_ack(node, 5))
    assert _sent_indexes(node, log) == [6, 7]
    assert _n1_inflight_bytes(node) == 8


def test_a_batch_is_cut_to_the_room_left_in_the_window() -> None:
    node, log = _leader(_config(max_append_batch_entries=64))
    node.propose([BODY] * 6)
    sent = _appends_to(drain(node, log), "n1")
    # 10 bytes of room: the first batch takes two bodies, the 2 bytes left fit no third.
    assert [len(m.entries) for m in sent] == [2]
    assert _n1_inflight_bytes(node) == 8


def test_an_entry_over_the_window_goes_alone() -> None:
    node, log = _leader(_config(max_append_batch_entries=64))
    big = b"x" * (3 * WINDOW_BYTES)
    node.propose([big])  # index 3
    node.propose([BODY])  # index 4
    assert _sent_indexes(node, log) == [3]  # nothing in flight: it goes, and alone
    assert _n1_inflight_bytes(node) == len(big)
    node.step(_ack(node, 3))
    assert _sent_indexes(node, log) == [4]


def test_a_big_entry_waits_until_the_window_is_empty() -> None:
    node, log = _leader(_config())
    node.propose([BODY])  # index 3
    node.propose([b"y" * WINDOW_BYTES])  # index 4: 4 + 10 bytes would overflow the window
    assert _sent_indexes(node, log) == [3]
    node.step(_ack(node, 3))
    assert _sent_indexes(node, log) == [4]


def test_a_rejected_append_clears_the_byte_count() -> None:
    node, log = _leader(_config())
    node.propose([BODY] * 6)
    assert _sent_indexes(node, log) == [3, 4]
    # n1 lost entry 3 (say its append was dropped): it rejects the append after it.
    node.step(
        AppendResponse(
            "n1", "n0", node.term, success=False, rejected_index=3, conflict_index=3,
            last_log_index=2,
        )
    )  # fmt: skip
    assert _n1_inflight_bytes(node) == 0
    (probe,) = _appends_to(drain(node, log), "n1")
    assert probe.prev_log_index == 2
    node.step(_ack(node, 3))  # the probe's answer: back to replicate, the window is empty
    assert _sent_indexes(node, log) == [4, 5]


def test_a_heartbeat_answer_on_a_full_byte_window_frees_the_oldest_append_if_lost() -> None:
    node, log = _leader(_config())
    node.propose([BODY] * 6)
    assert _sent_indexes(node, log) == [3, 4]
    # Answers nothing new, and n1's log ends at 2: the append of entry 3 was lost.
    node.step(_ack(node, 2, last_log_index=2))
    assert _n1_inflight_bytes(node) == 8  # the oldest's 4 bytes freed, the next one's taken
    assert _sent_indexes(node, log) == [5]


def test_a_heartbeat_answer_from_a_follower_holding_the_appends_frees_nothing() -> None:
    node, log = _leader(_config())
    node.propose([BODY] * 6)
    assert _sent_indexes(node, log) == [3, 4]
    # Answers nothing new, but n1 holds 3 and 4 (it is still writing them).
    node.step(_ack(node, 2, last_log_index=4))
    assert _n1_inflight_bytes(node) == 8
    assert _sent_indexes(node, log) == []


def test_a_lagging_follower_never_holds_more_than_the_byte_window_unacked() -> None:
    """Issue 36: a follower being caught up receives appends faster than it writes them and
    answers the leader's heartbeats meanwhile (acking nothing new, its log holding all it
    received). What was sent to it and not acked stays within the byte window however many
    heartbeats it answers; once it acks, the rest goes. (Within the stall check's half
    election timeout: past it the leader probes again from the match.)"""
    node, log = _leader(_config(election_timeout_ticks=200))
    bodies = 40
    node.propose([BODY] * bodies)  # indexes 3..42
    received = _sent_indexes(node, log)
    for _ in range(60):
        node.tick()
        msgs = _appends_to(drain(node, log), "n1")
        received += [e.index for m in msgs for e in m.entries]
        for hb in (m for m in msgs if not m.entries):
            node.step(_ack(node, hb.prev_log_index, last_log_index=max(received)))
            received += _sent_indexes(node, log)
        unacked_bytes = len(BODY) * len([i for i in received if i > 2])
        assert unacked_bytes <= WINDOW_BYTES
    for _ in range(bodies):  # the follower writes what it holds and acks it
        if max(received) == bodies + 2:
            break
        node.step(_ack(node, max(received), last_log_index=max(received)))
        received += _sent_indexes(node, log)
    assert sorted(received) == list(range(3, bodies + 3))


def test_progress_frees_and_clears_the_bytes_with_the_appends() -> None:
    pr = Progress(11)
    assert pr.acked(10)
    pr.become_replicate()
    pr.sent(12, tick=1, size_bytes=100)
    pr.sent(15, tick=1, size_bytes=30)
    assert pr.inflight_bytes == 130 and pr.inflight_full(64, 130)
    assert not pr.inflight_full(64, 131)
    assert pr.acked(12)
    pr.free_up_to(pr.match)
    assert list(pr.inflight) == [15] and pr.inflight_bytes == 30
    pr.become_probe(13)
    assert not pr.inflight and pr.inflight_bytes == 0 and not pr.inflight_full(1, 1)


def test_the_window_never_stops_the_first_append() -> None:
    pr = Progress(1)
    pr.become_replicate()
    assert not pr.inflight_full(64, 1)  # nothing in flight: one append always goes


def test_replication_completes_with_a_tiny_byte_window() -> None:
    c = Cluster(3, RaftConfig(max_inflight_bytes=1, max_append_batch_entries=64))
    leader = c.elect()
    bodies = [b"m%d" % i for i in range(30)]
    c.nodes[leader].propose(bodies)
    c.tick(times=40)
    assert c.bodies("n1") == bodies and c.bodies("n2") == bodies


@pytest.mark.parametrize("value", [0, -1, MAX_INFLIGHT_BYTES_LIMIT + 1])
def test_an_out_of_range_byte_window_is_refused(value: int) -> None:
    with pytest.raises(ConfigError, match="max_inflight_bytes"):
        RaftConfig(max_inflight_bytes=value)


def _resent_to_n1(node: RaftNode, log: MemLog, ticks: int, answer_last: int | None) -> list[int]:
    """Entries sent to n1 over ``ticks`` ticks; n1 answers each heartbeat (acking nothing,
    its log ending at ``answer_last``) or, with None, answers nothing."""
    sent: list[int] = []
    for _ in range(ticks):
        node.tick()
        msgs = _appends_to(drain(node, log), "n1")
        sent += [e.index for m in msgs for e in m.entries]
        for hb in (m for m in msgs if not m.entries and answer_last is not None):
            node.step(_ack(node, hb.prev_log_index, last_log_index=answer_last or 0))
            sent += _sent_indexes(node, log)
    return sent


def test_a_silent_follower_is_not_sent_the_window_again() -> None:
    """Issue 36: a follower that answers nothing (busy writing and applying what it got, as
    one being caught up is) past the stall check's half election timeout is not probed: a
    probe sent the window again behind what was still on its way to it."""
    node, log = _leader(_config())
    node.propose([BODY] * 6)
    assert _sent_indexes(node, log) == [3, 4]
    stall_ticks = node.cfg.election_timeout_ticks // 2
    # Past the stall check, short of check-quorum's election timeout.
    assert _resent_to_n1(node, log, stall_ticks + 3, answer_last=None) == []
    assert node.role is Role.LEADER


def test_a_follower_answering_without_the_appends_in_flight_is_probed_again() -> None:
    """The stall check still finds a lost append: n1 answers its heartbeats, its log ending
    before the append in flight (the window not full, so no answer frees it)."""
    node, log = _leader(_config())
    node.propose([BODY])
    assert _sent_indexes(node, log) == [3]
    stall_ticks = node.cfg.election_timeout_ticks // 2
    assert 3 in _resent_to_n1(node, log, stall_ticks + 3, answer_last=2)
