"""The leader's view of one follower (etcd's ``tracker.Progress``): how far its log is known
to match, what to send it next, and which of three states paces the sending.

``PROBE``: one append at a time (``probe_sent``) until an answer shows where the follower's
log matches this leader's; ``REPLICATE``: appends pipelined from ``next`` on, at most the
configured number and bytes in flight (``inflight`` holds the last index of each, ascending,
``inflight_sizes`` the body bytes of each, ``inflight_bytes`` their sum);
``SNAPSHOT``: the follower's next entry is no longer in the leader's log, so only a snapshot
catches it up (``snapshot_inflight`` while the driver transfers one).

Pure bookkeeping: no messages are built here and nothing reads the log. The caller
(:class:`dledger.core.raft.RaftNode`) decides when a transition happens; the methods keep the
fields of a state consistent with each other.
"""

from __future__ import annotations

import enum
from collections import deque

__all__ = ["Progress", "ProgressState"]


class ProgressState(enum.Enum):
    PROBE = "probe"  # one append at a time until the follower's match point is found
    REPLICATE = "replicate"  # pipelined appends, at most max_inflight_appends in flight
    SNAPSHOT = "snapshot"  # behind the log's first index: caught up by a snapshot


class Progress:
    """One follower as its leader sees it. Created in ``PROBE`` from ``next_index``."""

    __slots__ = (
        "back_step",
        "commit_sent",
        "inflight",
        "inflight_bytes",
        "inflight_sizes",
        "last_heard_tick",
        "last_sent_tick",
        "match",
        "next",
        "no_room",
        "probe_sent",
        "readers_waiting",
        "repairing",
        "snapshot_inflight",
        "stalled_ticks",
        "state",
        "supported_feature_level",
    )

    def __init__(self, next_index: int) -> None:
        assert next_index >= 1, f"next index {next_index} below 1"
        self.match = 0  # highest index known to match the leader's log
        self.next = next_index  # first index to send next
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight: deque[int] = deque()  # last index of each append in flight, ascending
        self.inflight_sizes: deque[int] = deque()  # body bytes of each, in the same order
        self.inflight_bytes = 0  # sum of inflight_sizes
        # The last send was kept back because its next entry does not fit in the room left in
        # the byte window (the window is not full, yet blocks): reset by a send or a clear.
        self.no_room = False
        self.last_heard_tick = 0  # leader tick count when this follower last answered
        # Leader tick count when an append that asks for an answer (a heartbeat, a probe, a
        # batch) last went to this follower: its heartbeat is due heartbeat_interval_ticks on.
        self.last_sent_tick = 0
        self.commit_sent = 0  # highest commit index a message to it could let it apply
        self.stalled_ticks = 0  # ticks with appends unacknowledged and no progress
        self.snapshot_inflight = False  # SNAPSHOT state: the driver is transferring one
        self.repairing = False  # its last answer said so: not counted towards a commit
        # Its last answer said readers wait for its applies: its commit notices are not held.
        self.readers_waiting = False
        # How far the next probe goes back after a content mismatch (doubles each time, so
        # a divergence n entries back is found in log2(n) rounds; 1 again after an ack).
        self.back_step = 1
        # The feature level its last answer in this leader's term said it supports (0: no
        # answer yet; a release before feature levels reports mqrelease.BASELINE_LEVEL).
        self.supported_feature_level = 0

    # ------------------------------------------------------------------ state transitions

    def become_probe(self, next_index: int) -> None:
        """Probe from ``next_index``: forget what is in flight (its answers are stale)."""
        self.state = ProgressState.PROBE
        self.next = next_index
        self.probe_sent = False
        self.clear_inflight()
        self.stalled_ticks = 0

    def become_replicate(self) -> None:
        """The match point is found: pipeline from the entry after it."""
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.clear_inflight()

    def become_snapshot(self) -> bool:
        """Enter (or stay in) ``SNAPSHOT``; True when a transfer must be asked for (none is in
        flight), which is then counted as in flight."""
        if self.state is not ProgressState.SNAPSHOT:
            self.state = ProgressState.SNAPSHOT
            self.clear_inflight()
            self.probe_sent = False
        if self.snapshot_inflight:
            return False
        self.snapshot_inflight = True
        return True

    def snapshot_done(self, ok: bool, index: int) -> bool:
        """The driver's transfer ended (``ok``: the follower holds the snapshot at ``index``).
        True when it then probes from past the snapshot; False: it stays in ``SNAPSHOT``
        until its next answer asks for another transfer."""
        assert self.state is ProgressState.SNAPSHOT
        self.snapshot_inflight = False
        if not ok:
            return False
        self.become_probe(max(self.match, index) + 1)
        return True

    def leave_snapshot(self) -> None:
        """An answer in ``SNAPSHOT`` shows the follower continuable from the log: probe on."""
        self.become_probe(self.match + 1)
        self.snapshot_inflight = False

    # ------------------------------------------------------------------ answers and sends

    def acked(self, match_index: int) -> bool:
        """A success answer up to ``match_index``; True when it moved the match forward."""
        if match_index <= self.match:
            return False
        self.match = match_index
        self.next = max(self.next, match_index + 1)
        self.stalled_ticks = 0
        self.back_step = 1
        return True

    def sent(self, last_index: int, tick: int, size_bytes: int = 0) -> None:
        """An append asking for an answer went out, its last entry ``last_index`` (its prev
        when empty), its bodies ``size_bytes`` long, at leader tick ``tick``."""
        assert size_bytes >= 0, f"negative append size {size_bytes}"
        self.last_sent_tick = tick
        if self.state is ProgressState.PROBE:
            self.probe_sent = True
        else:
            self.next = last_index + 1
            self.inflight.append(last_index)
            self.inflight_sizes.append(size_bytes)
            self.inflight_bytes += size_bytes
            self.no_room = False

    def inflight_full(self, max_appends: int, max_bytes: int) -> bool:
        """Whether the pipelining window is full: ``max_appends`` appends in flight, or at
        least ``max_bytes`` of bodies (with nothing in flight it never is, so one append,
        however big, always goes)."""
        return len(self.inflight) >= max_appends or (
            bool(self.inflight) and self.inflight_bytes >= max_bytes
        )

    def blocked(self, max_appends: int, max_bytes: int) -> bool:
        """Whether the window keeps the next append back: full, or its room too small for the
        next entry (as the last send found)."""
        return self.no_room or self.inflight_full(max_appends, max_bytes)

    def free_up_to(self, index: int) -> None:
        """Appends whose last index is at most ``index`` are answered: out of flight."""
        inflight = self.inflight
        while inflight and inflight[0] <= index:
            self.free_oldest()

    def free_oldest(self) -> None:
        """The oldest append in flight is taken out of flight (answered, or presumed lost)."""
        self.inflight.popleft()
        self.inflight_bytes -= self.inflight_sizes.popleft()
        self.no_room = False  # the room grew: the next send finds out again
        assert self.inflight_bytes >= 0, f"in-flight bytes below 0: {self.inflight_bytes}"

    def clear_inflight(self) -> None:
        """Nothing is in flight any more (its answers are stale or it is all answered)."""
        self.inflight.clear()
        self.inflight_sizes.clear()
        self.inflight_bytes = 0
        self.no_room = False

    def lower_match(self, match_index: int) -> None:
        """The follower no longer holds what it acked above ``match_index`` (it lost or cut
        entries): count only that much, probe from the entry after it."""
        self.match = max(0, match_index)
        self.commit_sent = min(self.commit_sent, self.match)
        self.become_probe(self.match + 1)

    def notice_due(self, commit: int) -> bool:
        """Whether this follower needs a commit notice at leader commit index ``commit``: no
        append in flight (its answer would bring one) and no message sent to it yet carried
        what it can commit."""
        return not self.inflight and min(commit, self.match) > self.commit_sent
