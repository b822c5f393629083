"""The leader's view of one follower (dledger.core.progress): each transition leaves the
fields of its state consistent."""

from __future__ import annotations

from dledger.core.progress import Progress, ProgressState


def _replicating(match: int) -> Progress:
    pr = Progress(match + 1)
    assert pr.acked(match)
    pr.become_replicate()
    return pr


def test_a_new_progress_probes_from_the_given_index() -> None:
    pr = Progress(7)
    assert (pr.state, pr.next, pr.match, pr.probe_sent) == (ProgressState.PROBE, 7, 0, False)


def test_a_probe_is_one_append_at_a_time_and_does_not_move_next() -> None:
    pr = Progress(5)
    pr.sent(4, tick=3)
    assert pr.probe_sent and pr.next == 5 and not pr.inflight and pr.last_sent_tick == 3


def test_replicate_pipelines_from_the_match_and_frees_what_is_acked() -> None:
    pr = _replicating(10)
    assert pr.state is ProgressState.REPLICATE and pr.next == 11
    pr.sent(12, tick=1)
    pr.sent(15, tick=1)
    assert list(pr.inflight) == [12, 15] and pr.next == 16
    assert pr.acked(12)
    pr.free_up_to(pr.match)
    assert list(pr.inflight) == [15] and pr.next == 16


def test_an_old_ack_moves_nothing() -> None:
    pr = _replicating(10)
    pr.back_step = 8
    pr.stalled_ticks = 3
    assert not pr.acked(9)
    assert (pr.match, pr.back_step, pr.stalled_ticks) == (10, 8, 3)
    assert pr.acked(11)
    assert (pr.match, pr.back_step, pr.stalled_ticks) == (11, 1, 0)


def test_becoming_a_prober_forgets_what_is_in_flight() -> None:
    pr = _replicating(3)
    pr.sent(9, tick=0)
    pr.stalled_ticks = 4
    pr.become_probe(4)
    assert pr.state is ProgressState.PROBE and not pr.inflight and pr.stalled_ticks == 0


def test_one_snapshot_request_in_flight_at_a_time() -> None:
    pr = _replicating(3)
    pr.sent(9, tick=0)
    assert pr.become_snapshot()  # ask for one
    assert pr.state is ProgressState.SNAPSHOT and not pr.inflight
    assert not pr.become_snapshot()  # one is in flight: no second request
    assert not pr.snapshot_done(False, 0)  # failed: stays, and may be asked for again
    assert pr.state is ProgressState.SNAPSHOT and not pr.snapshot_inflight
    assert pr.become_snapshot()


def test_a_snapshot_delivered_probes_past_it() -> None:
    pr = _replicating(3)
    pr.become_snapshot()
    assert pr.snapshot_done(True, 40)
    assert pr.state is ProgressState.PROBE and pr.next == 41 and not pr.snapshot_inflight


def test_an_answer_continuable_from_the_log_leaves_the_snapshot_state() -> None:
    pr = _replicating(3)
    pr.become_snapshot()
    pr.acked(20)
    pr.leave_snapshot()
    assert pr.state is ProgressState.PROBE and pr.next == 21 and not pr.snapshot_inflight


def test_a_lost_match_comes_down_and_the_probe_restarts_after_it() -> None:
    pr = _replicating(30)
    pr.commit_sent = 25
    pr.lower_match(12)
    assert (pr.match, pr.commit_sent, pr.next, pr.state) == (12, 12, 13, ProgressState.PROBE)


def test_a_commit_notice_is_due_only_without_appends_in_flight() -> None:
    pr = _replicating(10)
    pr.commit_sent = 5
    assert pr.notice_due(8)
    assert not pr.notice_due(5)  # it was told already
    pr.sent(12, tick=0)
    assert not pr.notice_due(8)  # the append's answer brings the commit along
