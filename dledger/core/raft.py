"""The Raft state machine of one group member. See the package docstring for the driver contract."""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Hashable, Mapping, Sequence

from dledger.chain import CHAIN_MAX, CHAIN_UNKNOWN, agree, next_chain
from dledger.chain import fmt as chain_fmt
from dledger.core import snapshot as snap
from dledger.core.config import (
    MAX_ENTRIES_PER_PROPOSAL,
    MAX_GROUP_SIZE,
    MAX_INDEX,
    MAX_READY_COMMITTED_BYTES,
    MAX_TERM,
    MAX_TERM_JUMP,
    RaftConfig,
)
from dledger.core.errors import (
    BackPressureError,
    ConfigError,
    NotLeaderError,
    ProposalDroppedError,
    ProposalTooLargeError,
    TransferInProgressError,
    UnknownPeerError,
)
from dledger.core.membership import (
    MAX_FEATURE_LEVEL,
    PROMOTE_MAX_LAG_ENTRIES,
    ChangeKind,
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
    Membership,
    bootstrap,
    check_change,
    decode,
)
from dledger.core.messages import (
    CAMPAIGN_REFUSED_MAX_TERM,
    DROP_ACK_BEYOND_LAST,
    DROP_FEATURE_LEVEL,
    DROP_MALFORMED,
    DROP_NOT_MEMBER,
    DROP_SECOND_LEADER,
    DROP_TERM_OUT_OF_RANGE,
    DROP_UNEXPECTED_TIMEOUT_NOW,
    REJECT_ALREADY_VOTED,
    REJECT_CHAIN_MISMATCH,
    REJECT_LEADER_LEASE,
    REJECT_REPAIRING,
    REJECT_STALE_LOG,
    REJECT_STALE_TERM,
    AppendRequest,
    AppendResponse,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.core.progress import Progress, ProgressState
from dledger.core.quorum import VoteResult, committed_index, has_quorum, vote_result
from dledger.core.raftlog import RaftLog
from dledger.core.ready import PeerStatus, Proposal, Ready, Role, SoftState, Status
from dledger.core.repair import Promised, Repair, start_repair
from dledger.core.snapshot import InstallSnapshot, SnapshotMeta, SnapshotRequest
from dledger.log import Entry, EntryType, FeatureLevelError, HardState, LogStore
from mqrelease import BASELINE_LEVEL

logger = logging.getLogger(__name__)


def _check_members(
    node_id: str, peer_ids: Sequence[str], config: RaftConfig, conf: ConfState | None
) -> ConfState:
    """The configuration to start from; ConfigError for duplicates, too many, an unknown
    preferred leader, or a given configuration that does not know this node."""
    if conf is not None:
        # The group's configuration may have dropped the preferred leader since: it is then
        # ignored (only a voter is handed leadership).
        if node_id in conf.removed:
            raise ConfigError(f"{node_id} was removed from the group ({conf.describe()})")
        return conf
    others = tuple(p for p in peer_ids if p != node_id)
    if len(set(others)) != len(others):
        raise ConfigError(f"duplicate peer ids in {list(peer_ids)}")
    if len(others) + 1 > MAX_GROUP_SIZE:
        raise ConfigError(f"group of {len(others) + 1} exceeds {MAX_GROUP_SIZE} members")
    pref = config.preferred_leader_id
    if pref is not None and pref != node_id and pref not in others:
        raise ConfigError(f"preferred_leader_id {pref!r} is not a member")
    return bootstrap(node_id, others)


def _check_applied(log: LogStore, applied_index: int, promised: int) -> None:
    """ConfigError unless the stored log holds ``applied_index`` or starts right after it.
    A log that lost entries below its promise may end below ``applied_index`` (the state
    machine applied what the store lost): up to the promise, those are not applied again."""
    if not log.first_index() - 1 <= applied_index <= max(log.last_index(), promised):
        raise ConfigError(
            f"applied_index {applied_index} outside the log's [first - 1, last] = "
            f"[{log.first_index() - 1}, {log.last_index()}] (promised index {promised})"
        )


class RaftNode:
    """One member's Raft state machine. Not thread-safe; drive it from one thread/task."""

    def __init__(
        self,
        node_id: str,
        peer_ids: Sequence[str],
        log: LogStore,
        config: RaftConfig,
        rng: random.Random,
        *,
        applied_index: int = 0,
        conf_state: ConfState | None = None,
        promised: Promised | None = None,
        hard_state: HardState | None = None,
    ) -> None:
        """``peer_ids``: the other members (``node_id`` may be listed). ``applied_index``: how
        far the application already applied (not handed out again). ``conf_state``: the
        configuration in force at ``applied_index`` (None: ``peer_ids``, all voters); the log's
        CONFIG entries above it are replayed (docs/RAFT.md section 9). ``promised``: what the
        promise file said (docs/RAFT.md section 11; None: nothing promised). ``hard_state``:
        the term and vote to start from when the driver recovered them (None: the store's)."""
        base = _check_members(node_id, peer_ids, config, conf_state)
        promised = promised if promised is not None else Promised()
        _check_applied(log, applied_index, promised.index)
        self.id = node_id
        self.cfg = config
        self._log = RaftLog(log)
        self._rng = rng
        self._mut = config.mutations
        self._init_membership(base, applied_index, conf_state is not None)
        hs = hard_state if hard_state is not None else log.load_hard_state()
        self._init_term_and_commit(hs, applied_index)
        self._init_outbox()
        self._init_clocks_and_leader_state()
        self._init_promise(promised)
        self._reset_randomized_timeout()
        logger.info(
            "node=%s term=%d start last_index=%d commit=%d %s",
            node_id,
            self._term,
            log.last_index(),
            self._commit,
            self._members.latest().describe(),
        )

    def _init_promise(self, promised: Promised) -> None:
        """At start: the promise, and the repair state when the log ends below it."""
        self._promised = promised.index
        # Highest index known to match this term's leader's log (its appends said so).
        self._verified = 0
        self.repairs_completed = 0
        log = self._log
        self._repair: Repair | None = start_repair(
            promised,
            log.last_index(),
            log.last_term(),
            self._term,
            forget="forget_promise" in self._mut,
        )
        if self._repair is not None and self._repair.vote_lost:
            logger.warning(
                "node=%s term=%d repairing: promise unknown (log ends at %d), the first "
                "leader's term counts as voted; no votes and no quorums until that leader "
                "brings it past its commit index and an entry of its term",
                self.id,
                self._term,
                log.last_index(),
            )
        elif self._repair is not None:
            logger.warning(
                "node=%s term=%d repairing: log ends at %d below the promised index %d; "
                "no votes and no quorums until a leader brings it there",
                self.id,
                self._term,
                log.last_index(),
                self._repair.target,
            )

    def _init_term_and_commit(self, hs: HardState, applied_index: int) -> None:
        """At start: a follower of no one in the stored term, committed and applied up to
        ``applied_index``."""
        self._term = hs.term
        self._voted_for = hs.voted_for
        self._persisted_hs = hs
        self._role = Role.FOLLOWER
        self._leader_id: str | None = None
        # The leader of the current term once known (this node, or the one it followed). Unlike
        # _leader_id it is never cleared within a term, so that an append from any other
        # "leader" of the same term is recognised as impossible however this node's role changed.
        self._term_leader: str | None = None
        # A log that lost entries the application applied (repair) ends below applied_index:
        # the commit index is relearned from there, and nothing up to the floor is handed.
        self._commit = min(applied_index, self._log.last_index())
        self._apply_floor = applied_index
        self._handed = applied_index  # last committed index handed out in a Ready
        self._applied = applied_index  # last index the driver confirmed applied (advance)
        # Applied entries were replaced (content repair): the next Ready asks the driver to
        # roll the applied state back to here.
        self._rewind_to: int | None = None
        # This term's leader showed that this member's committed copy differs at or before
        # this index (0: no such doubt): it does not campaign until an append of a leader
        # verified its log past it (a damaged copy must not win and hand itself on).
        self._suspect_upto = 0

    def _init_outbox(self) -> None:
        """At start: nothing owed to the driver or the peers yet (what the next Ready carries)."""
        self._msgs: list[Message] = []
        # Leader: appends and commit notices owed to followers, sent at the next ready(), so
        # that every proposal and commit between two ready() calls shares one message per
        # follower (each peer message costs ~0.1-0.3 ms of CPU on both sides).
        self._bcast_owed = False
        self._commit_notice_owed = False
        # Notices held at a ready() until release_notices() or tick() (an append may carry them).
        self._notices_held = False
        # Follower: the application has readers waiting for the next apply (set_readers_waiting);
        # every answer to the leader says so.
        self._readers_waiting = False
        self._outstanding: Ready | None = None
        self._last_soft = SoftState(Role.FOLLOWER, self._term, None)
        self._soft_reported: SoftState | None = None
        self._snapshot_requests: list[SnapshotRequest] = []  # for the next Ready

    def _init_clocks_and_leader_state(self) -> None:
        """At start: tick clocks at zero, no campaign, no follower progress, no proposal in
        flight, and the counters the driver reports (metrics, status) at zero."""
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._leader_ticks = 0  # ticks since this node became leader (check-quorum clock)
        self._randomized_timeout = self.cfg.election_timeout_ticks
        self._votes: dict[str, bool] = {}
        self._progress: dict[str, Progress] = {}
        self._transferee: str | None = None
        self._transfer_elapsed = 0
        self._pending: deque[tuple[int, int]] = deque()  # (last index, bytes) per proposal
        self._pending_bytes = 0
        self._dropped: dict[str, int] = {}
        # Campaigns since start (metrics): pre-votes, real elections (a term of its own), and
        # elections this node won.
        self.pre_votes_started = 0
        self.elections_started = 0
        self.elections_won = 0
        self._snapshots_sent = 0  # transfers the driver reported done (status)
        self.chain_mismatches = 0  # see Status.chain_mismatches
        self.committed_repairs = 0

    # ------------------------------------------------------------------ read-only state

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    @property
    def commit_index(self) -> int:
        """The highest committed index this node's stored log holds: what a reader may read
        from the store as committed. (A node may know a higher commit index for entries still
        in its unstable tail, or, on a follower, still stale in its store; those are not
        readable yet.)"""
        return min(self._commit, self._log.stable_last())

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    @property
    def last_term(self) -> int:
        return self._log.last_term()

    @property
    def stable_index(self) -> int:
        """Last index the driver confirmed persisted (``advance``); the stored log agrees with
        this node's log up to it."""
        return self._log.stable_last()

    @property
    def voted_for(self) -> str | None:
        return self._voted_for

    @property
    def repairing(self) -> bool:
        """The log ends below what this node promised: no votes, no quorums (section 11)."""
        return self._repair is not None

    @property
    def repair_target(self) -> int:
        """The index the repair must reach (0: not repairing)."""
        return 0 if self._repair is None else self._repair.target

    @property
    def promised_index(self) -> int:
        """The highest index this node vouched for (confirmed durable by ``advance``)."""
        return self._promised

    @property
    def transfer_target(self) -> str | None:
        return self._transferee

    @property
    def dropped(self) -> dict[str, int]:
        """Messages dropped since start, by reason (``messages.DROP_*``); a copy."""
        return dict(self._dropped)

    def status(self) -> Status:
        last = self._log.last_index()
        peers = tuple(
            PeerStatus(
                peer_id=p,
                match_index=pr.match,
                next_index=pr.next,
                state=pr.state.value,
                inflight_appends=len(pr.inflight),
                lag_entries=last - pr.match,
                recent_active=self._recently_heard(pr),
                supported_feature_level=pr.supported_feature_level,
                withheld=self._withheld(pr),
                inflight_bytes=pr.inflight_bytes,
            )
            for p, pr in self._progress.items()
        )
        return Status(
            node_id=self.id,
            role=self._role,
            term=self._term,
            leader_id=self._leader_id,
            voted_for=self._voted_for,
            commit_index=self.commit_index,
            applied_index=self._applied,
            last_index=last,
            flushed_index=self._log.stable_last(),
            transfer_target=self._transferee,
            peers=peers,
            dropped=dict(self._dropped),
            voters=tuple(sorted(self._voters)),
            learners=tuple(sorted(self._members.latest().learners)),
            repairing=self._repair is not None,
            promised_index=self._promised,
            repairs_completed=self.repairs_completed,
            chain_mismatches=self.chain_mismatches,
            committed_repairs=self.committed_repairs,
            feature_level=self.feature_level,
            supported_feature_level=self.cfg.supported_feature_level,
        )

    # ------------------------------------------------------------------ driver interface

    def tick(self) -> None:
        """Advance the logical clock by one tick. Held commit notices are released too (after
        the tick's heartbeats, which may carry the commit instead), so a driver that never
        calls release_notices() still converges within a tick."""
        if self._role is Role.LEADER:
            self._tick_leader()
        else:
            self._election_elapsed += 1
            # A learner, a joining or a removed node never campaigns; its clock keeps running
            # so that its leader lease lapses (a voter it does not know it is must vote).
            if (
                self._election_elapsed >= self._randomized_timeout
                and self.id in self._voters
                and self._repair is None
                and not self._suspect_upto
            ):
                self._campaign(pre_vote=self.cfg.pre_vote, transfer=False)
        self.release_notices()

    def propose(self, bodies: Sequence[bytes], entry_type: int = EntryType.NORMAL) -> Proposal:
        """Append ``bodies`` as consecutive entries (leader only). Raises NotLeaderError,
        TransferInProgressError, BackPressureError or ProposalDroppedError; nothing is
        appended when it raises."""
        self._check_can_propose()
        if not bodies:
            raise ProposalDroppedError("empty proposal")
        if len(bodies) > MAX_ENTRIES_PER_PROPOSAL:
            raise ProposalDroppedError(
                f"{len(bodies)} entries exceed MAX_ENTRIES_PER_PROPOSAL={MAX_ENTRIES_PER_PROPOSAL}"
            )
        if not 0 <= int(entry_type) <= 255 or entry_type in (EntryType.NOOP, EntryType.CONFIG):
            raise ProposalDroppedError(f"entry type {entry_type} cannot be proposed")
        size = sum(len(b) for b in bodies)
        limit = self.cfg.max_pending_proposal_bytes
        if size > limit:
            raise ProposalTooLargeError(
                f"{size} bytes exceed max_pending_proposal_bytes={limit}: can never be accepted"
            )
        if self._pending_bytes + size > limit:
            raise BackPressureError(
                f"{self._pending_bytes} uncommitted bytes pending, +{size} exceeds "
                f"max_pending_proposal_bytes={limit}"
            )
        first = self._log.last_index() + 1
        entries = [
            Entry(term=self._term, index=first + i, body=bytes(b), type=int(entry_type))
            for i, b in enumerate(bodies)
        ]
        self._append_local(entries)
        last = entries[-1].index
        self._pending.append((last, size))
        self._pending_bytes += size
        self._bcast_owed = True
        return Proposal(term=self._term, first_index=first, last_index=last)

    def transfer_leadership(self, target_id: str) -> None:
        """Hand leadership to ``target_id``: stop proposals, catch it up, send TimeoutNow.
        Aborted after an election timeout. A no-op when the target is this node."""
        if self._role is not Role.LEADER:
            raise NotLeaderError(f"node {self.id} is not the leader", leader_id=self._leader_id)
        if target_id == self.id:
            return
        if target_id not in self._progress or target_id not in self._voters:
            raise UnknownPeerError(f"{target_id[:64]!r} (length {len(target_id)}) is not a member")
        if self._transferee is not None:
            if self._transferee == target_id:
                return
            raise TransferInProgressError(f"already transferring to {self._transferee}")
        logger.info("node=%s term=%d transfer_start target=%s", self.id, self._term, target_id)
        self._transferee = target_id
        self._transfer_elapsed = 0
        pr = self._progress[target_id]
        last = self._log.last_index()
        if pr.match == last:
            self._send(TimeoutNow(self.id, target_id, self._term))
            return
        if pr.state is ProgressState.REPLICATE and pr.next > last:
            pr.become_probe(pr.match + 1)  # everything was sent; resend what is unacknowledged
        self._send_append(target_id)

    def report_snapshot(self, peer_id: str, ok: bool, index: int = 0) -> None:
        """The driver's transfer to ``peer_id`` (a Ready's ``snapshot_requests``) of a
        snapshot at ``index`` ended: ``ok`` when the follower received it whole and was handed
        its InstallSnapshot. Ignored when this node no longer leads or the follower moved
        on. Then it probes from the snapshot on (as etcd does): its answer says where it
        really is. A failure lets its next answer ask for a snapshot again."""
        if self._role is not Role.LEADER:
            return
        pr = self._progress.get(peer_id)
        if pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if pr.snapshot_done(ok and 0 < index <= self._log.last_index(), index):
            self._snapshots_sent += 1
            self._send_append(peer_id)

    @property
    def pending_snapshot(self) -> SnapshotMeta | None:
        """A snapshot this follower accepted and its driver has not installed yet."""
        return self._log.pending_snapshot()

    def replace_store(self, store: LogStore) -> None:
        """The driver installed a Ready's snapshot by opening a new store (it holds the
        snapshot's log): read that one from now on. Only between that Ready and its
        advance()."""
        assert self._outstanding is not None and self._outstanding.snapshot is not None
        assert store.last_index() == self._outstanding.snapshot.index
        self._log.store = store

    @property
    def snapshots_sent(self) -> int:
        """Snapshot transfers the driver reported done since this node started."""
        return self._snapshots_sent

    def step(self, m: Message | InstallSnapshot) -> None:
        """Feed one message received from a peer. Never raises for a message a hostile peer
        could build: what an honest member could not have sent is dropped and counted
        (:attr:`dropped`), before it changes anything."""
        reason = self._hostile_reason(m)
        if reason is not None:
            self._drop(reason, m)
            return
        if m.term > self._term:
            if not self._step_higher_term(m):
                return
        elif m.term < self._term:
            self._answer_stale(m)
            return
        if isinstance(m, AppendRequest):
            self._handle_append(m)
        elif isinstance(m, AppendResponse):
            self._handle_append_response(m)
        elif isinstance(m, VoteRequest):
            self._handle_vote_request(m)
        elif isinstance(m, VoteResponse):
            self._handle_vote_response(m)
        elif isinstance(m, InstallSnapshot):
            self._handle_install(m)
        else:
            self._handle_timeout_now(m)
        self._maybe_finish_repair()
        self._check_invariants()

    def _hostile_reason(self, m: Message | InstallSnapshot) -> str | None:
        """The DROP_* reason when no honest member could have sent ``m``, else None."""
        if self._not_member(m):
            return DROP_NOT_MEMBER
        chain = 0
        if isinstance(m, AppendResponse):
            chain = m.match_chain
        elif isinstance(m, VoteRequest):
            chain = m.last_log_chain
        elif isinstance(m, VoteResponse):
            chain = m.log_chain
            if not 0 <= m.log_index <= MAX_INDEX:
                return DROP_MALFORMED
        if not 0 <= chain <= CHAIN_MAX:
            return DROP_MALFORMED
        if isinstance(m, AppendResponse) and not (
            0 <= m.supported_feature_level <= MAX_FEATURE_LEVEL
        ):
            return DROP_MALFORMED
        term = m.term
        if term > self._term and (term > MAX_TERM or term - self._term > MAX_TERM_JUMP):
            return DROP_TERM_OUT_OF_RANGE
        if isinstance(m, (AppendRequest, InstallSnapshot)):
            if isinstance(m, InstallSnapshot):
                if snap.malformed(m):
                    return DROP_MALFORMED
                conf = m.meta.config
                if isinstance(conf, ConfState) and conf.features > self.cfg.supported_feature_level:
                    return DROP_FEATURE_LEVEL
            elif (
                not 0 <= m.prev_log_index <= MAX_INDEX
                or not 0 <= m.prev_log_chain <= CHAIN_MAX
                or m.leader_commit < 0
                or (m.entries and m.entries[0].index != m.prev_log_index + 1)
            ):
                return DROP_MALFORMED
            else:
                config_problem = self._config_entry_problem(m)
                if config_problem is not None:
                    return config_problem
            if term == self._term and self._term_leader not in (None, m.from_id):
                # Election safety: one leader per term. This node already knows who leads
                # this term (perhaps itself), so this sender is lying or broken.
                return DROP_SECOND_LEADER
        elif (
            isinstance(m, TimeoutNow)
            and term >= self._term
            and (
                term != self._term
                or self._role is not Role.FOLLOWER
                or self._leader_id != m.from_id
            )
        ):
            # Only this term's leader sends TimeoutNow, and only to a follower that acked its
            # whole log in this term (so the follower's term is already the leader's).
            return DROP_UNEXPECTED_TIMEOUT_NOW
        return None

    def _step_higher_term(self, m: Message | InstallSnapshot) -> bool:
        """A message of a later term: adopt it (or refuse a disruptive vote request). False
        when the message is fully handled."""
        if isinstance(m, VoteRequest):
            if not m.leadership_transfer and (
                self._in_lease() or (m.pre_vote and self._heard_leader_recently())
            ):
                # A member that heard from a live leader ignores disruptions: always for
                # pre-votes (Raft thesis 9.6), for votes too with check-quorum (etcd).
                self._reject_vote(m, REJECT_LEADER_LEASE)
                return False
            if not m.pre_vote:
                self._become_follower(m.term, None)
        elif isinstance(m, VoteResponse) and m.pre_vote and m.granted:
            pass  # a granted pre-vote carries the future term; no term change
        else:
            leader = (
                m.from_id if isinstance(m, (AppendRequest, TimeoutNow, InstallSnapshot)) else None
            )
            self._become_follower(m.term, leader)
        return True

    def _answer_stale(self, m: Message | InstallSnapshot) -> None:
        """A message of an earlier term: tell a stale leader or candidate the newer term."""
        if isinstance(m, AppendRequest):
            self._reject_append(m, 0, 0)  # the term is the news; no back-off hint
        elif isinstance(m, VoteRequest):
            self._reject_vote(m, REJECT_STALE_TERM)

    def _reject_vote(self, m: VoteRequest, reason: str) -> None:
        self._send(
            VoteResponse(
                self.id,
                m.from_id,
                self._term,
                granted=False,
                pre_vote=m.pre_vote,
                reject_reason=reason,
            )
        )

    def has_ready(self) -> bool:
        """True when ready() would return a non-empty Ready."""
        return (
            bool(self._msgs)
            or self._bcast_owed
            or self._commit_notice_owed
            or self._log.has_work()
            or self._hard_state_to_save() != self._persisted_hs
            or self._handed < min(self._commit, self._log.last_index())
            or self._soft_state() != self._soft_reported
            or bool(self._snapshot_requests)
            or self._rewind_to is not None
        )

    def ready(self) -> Ready:
        """Collect what the driver must do now. Call advance() before the next ready()."""
        assert self._outstanding is None, "ready() called twice without advance()"
        self._pay_owed_messages()
        snapshot, truncate_from, entries = self._log.take()
        hs = self._hard_state_to_save()
        committed: list[Entry] = []
        upto = min(self._commit, self._log.last_index())
        start = self._handed + 1
        if start <= upto:
            committed = self._log.read_range(
                start, MAX_READY_COMMITTED_BYTES, max_count=upto - start + 1
            )
            assert committed and committed[0].index == start and committed[-1].index <= upto
            self._handed = committed[-1].index
        soft = self._soft_state()
        early = tuple(m for m in self._msgs if isinstance(m, (AppendRequest, TimeoutNow)))
        promise = self._promise_to_make()
        rd = Ready(
            hard_state=hs if hs != self._persisted_hs else None,
            truncate_from=truncate_from,
            entries=entries,
            early_messages=early,
            messages=tuple(self._msgs) if not early else self._late_messages(),
            committed=tuple(committed),
            soft_state=soft if soft != self._soft_reported else None,
            notices_held=self._notices_held,
            snapshot=snapshot,
            snapshot_requests=tuple(self._snapshot_requests),
            promise=promise if promise > self._promised else None,
            rewind_to=self._rewind_to,
        )
        self._rewind_to = None
        self._snapshot_requests = []
        self._msgs = []
        self._soft_reported = soft
        self._outstanding = rd
        return rd

    def _promise_to_make(self) -> int:
        """What this Ready vouches for: the follower's acks it sends, and on a leader its
        whole log (the job writes all of it; the leader counts it once stable)."""
        top = self._log.last_index() if self._role is Role.LEADER else 0
        for m in self._msgs:
            if isinstance(m, AppendResponse) and m.success and m.match_index > top:
                top = m.match_index
        return top

    def _late_messages(self) -> tuple[Message, ...]:
        return tuple(m for m in self._msgs if not isinstance(m, (AppendRequest, TimeoutNow)))

    def advance(self, rd: Ready) -> None:
        """The driver did everything ``rd`` asked: its hard state, truncation and entries are
        stable (durable as the deployment defines it)."""
        assert rd is self._outstanding, "advance() with a Ready that is not outstanding"
        self._outstanding = None
        if rd.hard_state is not None:
            self._persisted_hs = rd.hard_state
        if rd.promise is not None:
            self._promised = max(self._promised, rd.promise)
        if rd.truncate_from is not None or rd.entries or rd.snapshot is not None:
            self._log.stable()
        if rd.snapshot is not None:
            self._applied = rd.snapshot.index  # the install replaced the applied state
        if rd.rewind_to is not None:
            self._applied = rd.rewind_to  # the driver rolled its applied state back
        if rd.committed:
            assert rd.committed[0].index == self._applied + 1, "committed entries skipped"
            self._applied = rd.committed[-1].index
            self._members.compact(self._applied)
        if self._role is Role.LEADER:
            self._maybe_commit()
            self._step_down_if_removed()
        self._maybe_finish_repair()
        self._check_invariants()

    # ------------------------------------------------------------------ membership (issue 21)
    # The rules live in dledger.core.membership; these hooks keep the node's view of the
    # group (peers, voters, progress) in step with the last CONFIG entry of its log.

    @property
    def conf_state(self) -> ConfState:
        """The configuration in force: the last one in this member's log (maybe uncommitted)."""
        return self._members.latest()

    def conf_state_at(self, index: int) -> ConfState:
        """The configuration in force at ``index`` (at or above the applied index): what a
        snapshot taken at ``index`` carries."""
        return self._members.at(index)

    def _adopt_snapshot_conf(self, config: Hashable | None) -> None:
        """An accepted snapshot replaced the log and the CONFIG entries in it: its
        configuration (when it carries one) is the group's from here on."""
        if isinstance(config, ConfState):
            self.restore_conf_state(config)

    def restore_conf_state(self, conf: ConfState) -> None:
        """A snapshot at ``conf.index`` or above replaced the log: adopt its configuration."""
        self._members.restore(conf)
        self._on_conf_change()

    def propose_conf_change(
        self,
        change: ConfChange,
        addrs_in_use: Mapping[str, str] | None = None,
        member_addrs: Mapping[str, tuple[str, str]] | None = None,
    ) -> Proposal:
        """Append a CONFIG entry making one change (leader only). Raises NotLeaderError,
        TransferInProgressError (also when removing this leader: it hands leadership to the
        most caught-up voter first; retry there), ConfChangePendingError (retry later) or
        ConfChangeError (never valid as asked); nothing is appended when it raises.
        ``addrs_in_use`` maps the members' addresses to their ids (the driver knows the
        bootstrap members'; ``membership.addresses_in_use``): a new member may not take one;
        ``member_addrs`` (id -> (peer, client)) fills in the members' addresses the
        configuration does not carry yet (``ConfState.apply``)."""
        self._check_can_propose()
        self._check_no_pending_change()
        conf = self._members.latest()
        check_change(conf, change, self._active_members(), addrs_in_use)
        if change.kind is ChangeKind.PROMOTE:
            self._check_caught_up(change.node_id)
        if change.kind is ChangeKind.REMOVE and change.node_id == self.id:
            self._hand_over_before_removal(conf)
        new = conf.apply(change, self._log.last_index() + 1, member_addrs)
        body = new.encode()
        entry = Entry(self._term, new.index, body, EntryType.CONFIG)
        logger.info(
            "node=%s term=%d propose_conf_change %s %s index=%d -> %s",
            self.id,
            self._term,
            change.kind.value,
            change.node_id,
            new.index,
            new.describe(),
        )
        self._append_local([entry])
        self._pending.append((new.index, len(body)))
        self._pending_bytes += len(body)
        self._bcast_owed = True
        return Proposal(term=self._term, first_index=new.index, last_index=new.index)

    def propose_feature_level(self, level: int) -> Proposal:
        """Raise the group's feature level to ``level`` (leader only): a CONFIG entry with the
        same members and ``features = level``. Raises NotLeaderError, TransferInProgressError,
        ConfChangePendingError (a change or this term's NOOP not committed yet: retry) or
        FeatureLevelError (``level`` not above the group's, above this node's support, or a
        member of the latest configuration, voter or learner, has not reported supporting
        it in this term: the error names it); nothing is appended when it raises."""
        self._check_can_propose()
        self._check_no_pending_change()
        conf = self._members.latest()
        if level <= conf.features:
            raise FeatureLevelError(
                f"the group's feature level is {conf.features}: it is only raised, never "
                f"lowered or set again (asked for {level})"
            )
        if level > self.cfg.supported_feature_level:
            raise FeatureLevelError(
                f"leader {self.id} supports feature levels up to "
                f"{self.cfg.supported_feature_level}, not {level}"
            )
        if "raise_without_reports" not in self._mut:
            self._check_support_reports(conf, level)
        new = conf.raised(level, self._log.last_index() + 1)
        body = new.encode()
        logger.info(
            "node=%s term=%d propose_feature_level %d -> %d index=%d",
            self.id,
            self._term,
            conf.features,
            level,
            new.index,
        )
        self._append_local([Entry(self._term, new.index, body, EntryType.CONFIG)])
        self._pending.append((new.index, len(body)))
        self._pending_bytes += len(body)
        self._bcast_owed = True
        return Proposal(term=self._term, first_index=new.index, last_index=new.index)

    def _check_support_reports(self, conf: ConfState, level: int) -> None:
        """Every member of ``conf`` but this leader answered in this term, within the last
        election timeout, with support for ``level``: one that is down or old could otherwise
        come back below the group's level."""
        for nid in sorted(conf.members - {self.id}):
            pr = self._progress.get(nid)
            got = pr.supported_feature_level if pr is not None else 0
            if pr is None or got == 0 or not self._recently_heard(pr):
                raise FeatureLevelError(
                    f"member {nid} has not answered leader {self.id} recently (term "
                    f"{self._term}), so its support for feature level {level} is unknown: "
                    "start it (or remove it from the group) and retry"
                )
            if got < level:
                raise FeatureLevelError(
                    f"member {nid} supports feature levels up to {got}, not {level}: "
                    "upgrade it and retry"
                )

    def _check_no_pending_change(self) -> None:
        """A configuration change (or raise) waits for the one before it and for this
        leader's first entry of its term to commit (Raft thesis 4.1 and its known bug)."""
        pending = self._members.pending_index(self._commit)
        if pending and "conf_change_while_pending" not in self._mut:
            raise ConfChangePendingError(
                f"the membership change at index {pending} is not committed yet"
            )
        if self._commit < self._term_start and "conf_change_before_term_commit" not in self._mut:
            raise ConfChangePendingError(
                f"leader {self.id} has not committed an entry of term {self._term} yet"
            )

    def _withheld(self, pr: Progress) -> bool:
        """Whether the leader holds entries (and snapshots) back from this follower: the
        group's level (its latest configuration's, the raise itself included) is above what
        the follower last reported supporting in this term (0 before its first answer).
        Heartbeats still go, so it stays a follower, and its answers update the report."""
        level = self._members.latest().features
        return level > BASELINE_LEVEL and pr.supported_feature_level < level

    @property
    def feature_level(self) -> int:
        """The group's feature level in this member's log (its latest configuration's, maybe
        not committed yet)."""
        return self._members.latest().features

    def _check_can_propose(self) -> None:
        if self._role is not Role.LEADER:
            raise NotLeaderError(f"node {self.id} is not the leader", leader_id=self._leader_id)
        if self._transferee is not None:
            raise TransferInProgressError(f"leadership is being transferred to {self._transferee}")

    def _active_members(self) -> frozenset[str]:
        heard = (p for p, pr in self._progress.items() if self._recently_heard(pr))
        return frozenset([self.id, *heard])

    def _check_caught_up(self, learner: str) -> None:
        pr = self._progress.get(learner)
        lag = self._log.last_index() - (pr.match if pr is not None else 0)
        if pr is None or not self._recently_heard(pr) or lag > PROMOTE_MAX_LAG_ENTRIES:
            raise ConfChangePendingError(
                f"learner {learner} is {lag} entries behind (at most {PROMOTE_MAX_LAG_ENTRIES}"
                " to be promoted) or not answering; retry once it caught up"
            )

    def _hand_over_before_removal(self, conf: ConfState) -> None:
        """This leader is asked to remove itself: start a transfer to the most caught-up
        active voter and refuse the change (the new leader takes it)."""
        candidates = [
            (pr.match, p)
            for p, pr in self._progress.items()
            if p in conf.voters and self._recently_heard(pr)
        ]
        if not candidates:
            raise ConfChangeError(f"no other voter is up to take over from leader {self.id}")
        target = max(candidates)[1]
        self.transfer_leadership(target)
        raise TransferInProgressError(
            f"removing the leader {self.id}: leadership is being handed to {target} first; "
            "retry the removal on the new leader"
        )

    def _init_membership(self, base: ConfState, applied_index: int, given: bool) -> None:
        """Start from ``base`` (given by the driver: in force at ``applied_index``; else the
        bootstrap one) and replay the CONFIG entries of the log above it."""
        self._members = Membership(base)
        self._term_start = 0  # index of this leader's NOOP: a change waits for its commit
        log = self._log
        scan_from = max(applied_index, base.index) + 1 if given else 1
        self._replay_config_entries(max(scan_from, log.first_index()), log.last_index())
        conf = self._members.latest()
        if conf.features > self.cfg.supported_feature_level:
            raise FeatureLevelError(
                f"the group's feature level is {conf.features} (CONFIG entry {conf.index}); "
                f"this release supports up to {self.cfg.supported_feature_level}: run the "
                "release that raised it"
            )
        self.peers: tuple[str, ...] = tuple(sorted(conf.members - {self.id}))
        self._voters: frozenset[str] = conf.voters

    def _replay_config_entries(self, start: int, last: int) -> None:
        """At start: adopt the configurations of the CONFIG entries in [start, last]."""
        while start <= last:
            batch = self._log.read_range(start, MAX_READY_COMMITTED_BYTES, last - start + 1)
            for e in batch:
                if e.type == EntryType.CONFIG:
                    try:
                        conf = decode(e.body, e.index)
                    except ValueError as exc:
                        raise ConfigError(f"CONFIG entry {e.index} of the log: {exc}") from exc
                    if conf.features < self._members.latest().features:
                        raise ConfigError(
                            f"CONFIG entry {e.index} of the log lowers the feature level from "
                            f"{self._members.latest().features} to {conf.features}"
                        )
                    self._members.append(conf)
            start = batch[-1].index + 1

    def _log_appended(self, entries: Sequence[Entry], cut: bool) -> None:
        """Entries went into the log (after a cut at their first index when ``cut``): the
        configuration follows the last CONFIG entry the log holds."""
        changed = cut and self._members.truncate(entries[0].index)
        for e in entries:
            if e.type == EntryType.CONFIG:
                # Bodies from peers were checked in _hostile_reason; a leader encodes its own.
                self._members.append(decode(e.body, e.index))
                changed = True
        if changed:
            self._on_conf_change()

    def _on_conf_change(self) -> None:
        conf = self._members.latest()
        self.peers = tuple(sorted(conf.members - {self.id}))
        self._voters = conf.voters
        if self._role is not Role.LEADER:
            return
        nxt = self._log.last_index() + 1
        for p in self.peers:
            if p not in self._progress:
                pr = self._progress[p] = Progress(nxt)
                if self._withheld(pr):
                    self._send_heartbeat(p)  # its support first (see _become_leader)
        self._prune_progress()
        if self._transferee is not None and self._transferee not in conf.voters:
            self._transferee = None

    def _prune_progress(self) -> None:
        """Stop replicating to removed members once their removal is committed: until then
        they get the entry that removes them, so that they know and stay quiet."""
        keep = self._members.latest().members | self._members.at(self._commit).members
        for p in [p for p in self._progress if p not in keep]:
            del self._progress[p]

    def _step_down_if_removed(self) -> None:
        """A leader whose committed configuration no longer has it as a voter steps down (the
        hand-over normally comes first; this covers a change it could not hand over for)."""
        conf = self._members.latest()
        if self.id not in conf.voters and conf.index <= self._commit:
            logger.warning(
                "node=%s term=%d not a voter of the committed %s: stepping down",
                self.id,
                self._term,
                conf.describe(),
            )
            self._become_follower(self._term, None)

    def _config_entry_problem(self, m: AppendRequest) -> str | None:
        """The drop reason for an append whose CONFIG entries no honest leader sends (a body
        that does not decode, a feature level below the one before it) or that this member
        must not persist (a level above its support); None when they are fine. The level
        before an entry is taken from the committed configuration (never cut) and the
        append's own earlier CONFIG entries, not from this log's uncommitted suffix, which
        the append may replace."""
        floor = max(self._commit, self._members.base_index)
        level = self._members.at(floor).features
        for e in m.entries:
            if e.type != EntryType.CONFIG:
                continue
            try:
                conf = decode(e.body, e.index)
            except ValueError:
                return DROP_MALFORMED
            if e.index > floor:
                if conf.features < level:
                    return DROP_MALFORMED  # a feature level is never lowered
                level = conf.features
            if conf.features > self.cfg.supported_feature_level:
                return DROP_FEATURE_LEVEL
        return None

    # ------------------------------------------------------------------ internals: misc

    def _not_member(self, m: Message | InstallSnapshot) -> bool:
        """Addressed to another node or from this one; anything from a removed node (a
        removed node cannot disrupt the group: not with vote requests, nor with the higher
        term of an answer to the appends that tell it it was removed); an answer from a
        non-member the leader does not replicate to. A request from an id this node does not
        know yet is taken: a member whose log lags behind the configuration that added a
        voter must still hear that voter as a leader and may vote for it (a new node, which
        knows no configuration yet, votes too: a group that added a voter needs its vote)."""
        conf = self._members.latest()
        if m.to_id != self.id or m.from_id == self.id:
            return True
        if isinstance(m, VoteRequest) and "removed_member_votes" in self._mut:
            return False
        if m.from_id in conf.removed:
            return True
        if isinstance(m, (AppendResponse, VoteResponse)):
            return m.from_id not in conf.members and m.from_id not in self._progress
        return False

    def _drop(self, reason: str, m: Message | InstallSnapshot | None) -> None:
        """Count a dropped message; log the 1st, 2nd, 4th, 8th ... of each reason, so that a
        flood of hostile messages costs a logarithmic number of log lines."""
        n = self._dropped[reason] = self._dropped.get(reason, 0) + 1
        if n & (n - 1) == 0:
            what = "" if m is None else f" {type(m).__name__} from={m.from_id} term={m.term}"
            logger.warning(
                "node=%s term=%d drop reason=%s count=%d%s", self.id, self._term, reason, n, what
            )

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _soft_state(self) -> SoftState:
        s = self._last_soft
        if s.role is not self._role or s.term != self._term or s.leader_id != self._leader_id:
            s = SoftState(self._role, self._term, self._leader_id)
            self._last_soft = s
        return s

    def _hard_state_to_save(self) -> HardState:
        voted = self._voted_for
        if "reply_before_persisting_vote" in self._mut and voted not in (None, self.id):
            # MUTATION: the vote for another node is answered but never made durable.
            voted = self._persisted_hs.voted_for if self._persisted_hs.term == self._term else None
        hs = self._persisted_hs
        if hs.term == self._term and hs.voted_for == voted:
            return hs
        return HardState(self._term, voted)

    def _in_lease(self) -> bool:
        return self.cfg.check_quorum and self._heard_leader_recently()

    def _heard_leader_recently(self) -> bool:
        return (
            self._leader_id is not None and self._election_elapsed < self.cfg.election_timeout_ticks
        )

    def _reset_randomized_timeout(self) -> None:
        t = self.cfg.election_timeout_ticks
        self._randomized_timeout = self._rng.randrange(t, 2 * t)

    def _append_local(self, entries: Sequence[Entry]) -> None:
        cut = entries[0].index <= self._log.last_index()
        self._log.append(entries)
        self._log_appended(entries, cut)

    def _check_invariants(self) -> None:
        last = self._log.last_index()
        assert self._handed <= max(self._commit, self._apply_floor), "handed/commit order"
        # A content repair cuts applied entries: applied stays above handed until the driver
        # rolled back (the Ready that carries rewind_to).
        rewinding = self._rewind_to is not None or (
            self._outstanding is not None and self._outstanding.rewind_to is not None
        )
        assert self._applied <= self._handed or rewinding, "applied/handed order"
        assert self._commit <= last, "commit index beyond the last index"
        if self._role is Role.LEADER:
            assert self._voted_for == self.id and self._leader_id == self.id
            assert self._log.last_term() == self._term, "leader's last entry not of its term"
        if self._role is Role.CANDIDATE:
            assert self._voted_for == self.id

    # ------------------------------------------------------------------ role changes

    def _become_follower(self, term: int, leader_id: str | None) -> None:
        assert term >= self._term
        if term > self._term:
            self._term = term
            self._voted_for = None
            self._term_leader = None
            self._verified = 0
        if leader_id is not None:
            self._term_leader = leader_id
        if self._role is not Role.FOLLOWER or leader_id != self._leader_id:
            logger.info("node=%s term=%d become_follower leader=%s", self.id, self._term, leader_id)
        self._role = Role.FOLLOWER
        self._leader_id = leader_id
        self._election_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {}
        self._progress = {}
        self._transferee = None
        self._pending.clear()
        self._pending_bytes = 0
        self._notices_held = False
        self._snapshot_requests = []  # a follower sends no snapshot

    def _campaign(self, *, pre_vote: bool, transfer: bool) -> None:
        if self._term >= MAX_TERM:
            # Never produce a term above MAX_TERM (peers would drop it, or worse, overflow).
            # Unreachable by honest elections (MAX_TERM_JUMP bounds what a peer can push).
            self._election_elapsed = 0
            self._drop(CAMPAIGN_REFUSED_MAX_TERM, None)
            return
        self._election_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {self.id: True}
        self._leader_id = None
        self._progress = {}
        self._transferee = None
        if pre_vote:
            self._role = Role.PRE_CANDIDATE
            req_term = self._term + 1
            self.pre_votes_started += 1
        else:
            self.elections_started += 1
            self._role = Role.CANDIDATE
            self._term += 1
            self._voted_for = self.id
            self._term_leader = None
            self._verified = 0
            req_term = self._term
        logger.info(
            "node=%s term=%d campaign pre_vote=%s transfer=%s",
            self.id,
            req_term,
            pre_vote,
            transfer,
        )
        if vote_result(self._voters, self._votes) is VoteResult.WON:
            self._win_vote()
            return
        last_index = self._log.last_index()
        last_term = self._log.last_term()
        last_chain = self._log.chain_at(last_index)
        for p in sorted(self._voters - {self.id}):
            self._send(
                VoteRequest(
                    self.id,
                    p,
                    req_term,
                    last_log_index=last_index,
                    last_log_term=last_term,
                    pre_vote=pre_vote,
                    leadership_transfer=transfer,
                    last_log_chain=last_chain,
                )
            )

    def _win_vote(self) -> None:
        if self._role is Role.PRE_CANDIDATE:
            self._campaign(pre_vote=False, transfer=False)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        assert self._role is Role.CANDIDATE
        self.elections_won += 1
        self._role = Role.LEADER
        self._leader_id = self.id
        self._term_leader = self.id
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._leader_ticks = 0
        self._votes = {}
        nxt = self._log.last_index() + 1
        self._progress = {p: Progress(nxt) for p in self.peers}
        self._transferee = None
        self._pending.clear()
        self._pending_bytes = 0
        self._term_start = nxt
        logger.info("node=%s term=%d become_leader last_index=%d", self.id, self._term, nxt - 1)
        # Raft figure 8: entries of earlier terms commit only under one of the current term.
        self._append_local([Entry(self._term, nxt, b"", EntryType.NOOP)])
        self._broadcast_append()
        for p, pr in self._progress.items():
            if self._withheld(pr):
                # At a raised level no entry goes before a member reported its support: ask
                # now rather than at the first tick.
                self._send_heartbeat(p)
        if len(self._voters) == 1:
            self._maybe_commit()

    # ------------------------------------------------------------------ leader side

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        timeout = self.cfg.election_timeout_ticks
        self._leader_ticks += 1
        if self._election_elapsed >= timeout:
            self._election_elapsed = 0  # the leader's own lease never lapses while it leads
        if self.cfg.check_quorum:
            # Step down once no majority has answered within the last election timeout.
            active = self._active_members()
            if not has_quorum(self._voters, active) and "leader_never_steps_down" not in self._mut:
                logger.warning(
                    "node=%s term=%d check_quorum_failed active=%d",
                    self.id,
                    self._term,
                    len(active & self._voters),
                )
                self._become_follower(self._term, None)
                return
        if self._transferee is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= timeout:
                logger.warning(
                    "node=%s term=%d transfer_aborted target=%s",
                    self.id,
                    self._term,
                    self._transferee,
                )
                self._transferee = None
        # An append lost in the replicate state leaves a gap that no answer will reveal
        # if nothing else is sent: after a stall, fall back to probing from the match. A
        # tick counts towards the stall only while the follower answers (heard within a
        # heartbeat interval): one that answers nothing is busy (writing or applying what
        # it received) or gone, and probing it only sent the window again behind what was
        # still on its way (a follower being caught up fell to probe every few hundred
        # milliseconds and got each window twice: issue 36's memory while it catches up).
        stall_limit = max(1, timeout // 2)
        heard_ticks = self.cfg.heartbeat_interval_ticks
        for p, pr in self._progress.items():
            if (
                pr.state is ProgressState.REPLICATE
                and pr.match < pr.next - 1
                and self._leader_ticks - pr.last_heard_tick <= heard_ticks
            ):
                pr.stalled_ticks += 1
                if pr.stalled_ticks >= stall_limit:
                    pr.become_probe(pr.match + 1)
                    self._send_append(p)
        # A heartbeat only to a follower that no answered append reached for a heartbeat
        # interval: under load the appends are the heartbeats (each answer proves liveness for
        # check-quorum; each append resets the follower's election timer and lease). A no-reply
        # commit notice does not count: it brings no answer.
        interval = self.cfg.heartbeat_interval_ticks
        for p, pr in self._progress.items():
            if self._leader_ticks - pr.last_sent_tick >= interval:
                self._send_heartbeat(p)
        if self._heartbeat_elapsed >= interval:
            self._heartbeat_elapsed = 0
            self._maybe_transfer_to_preferred()

    def _recently_heard(self, pr: Progress) -> bool:
        return self._leader_ticks - pr.last_heard_tick < self.cfg.election_timeout_ticks

    def _maybe_transfer_to_preferred(self) -> None:
        pref = self.cfg.preferred_leader_id
        if pref is None or pref == self.id or self._transferee is not None:
            return
        pr = self._progress.get(pref)
        if (
            pr is not None
            and pref in self._voters
            and not pr.repairing
            and self._recently_heard(pr)
            and pr.match == self._log.last_index()
        ):
            self.transfer_leadership(pref)

    def _send_heartbeat(self, peer: str, *, no_reply: bool = False) -> None:
        pr = self._progress[peer]
        # prev = match (or 0): known to match, so a heartbeat never triggers a rejection.
        prev = snap.heartbeat_prev(self._log.first_index(), pr.match)
        self._send(self._append_request(peer, prev, (), no_reply=no_reply))
        pr.commit_sent = max(pr.commit_sent, min(self._commit, pr.match))
        if not no_reply:
            pr.last_sent_tick = self._leader_ticks

    def _append_request(
        self, peer: str, prev: int, entries: tuple[Entry, ...], *, no_reply: bool = False
    ) -> AppendRequest:
        """An append to ``peer`` of ``entries`` after entry ``prev`` (none: a heartbeat), in
        this term, with the commit index and ``prev``'s term and chain."""
        return AppendRequest(
            self.id,
            peer,
            self._term,
            prev_log_index=prev,
            prev_log_term=self._log.term_at(prev),
            entries=entries,
            leader_commit=self._commit,
            no_reply=no_reply,
            prev_log_chain=self._log.chain_at(prev),
        )

    def _send_append(self, peer: str) -> bool:
        """Send the next batch to ``peer`` if its state allows; True when something was sent."""
        pr = self._progress.get(peer)
        if pr is None:
            return False  # removed meanwhile (its removal committed)
        last = self._log.last_index()
        if pr.next > last and pr.state is ProgressState.REPLICATE:
            # Sent up to the tip (the second turn of every broadcast's loop, and each answer
            # at one in flight): nothing to send, and nothing below could change that (a
            # next past the log's last entry never needs a snapshot).
            return False
        if pr.state is ProgressState.SNAPSHOT or self._withheld(pr):
            return False
        if snap.needs_snapshot(self._log.first_index(), pr.next):
            self._request_snapshot(peer, pr)
            return False
        if pr.state is ProgressState.PROBE:
            if pr.probe_sent:
                return False
        elif self._window_full(pr) or pr.next > last:
            return False
        prev = pr.next - 1
        assert 0 <= prev <= last, f"next {pr.next} out of range (last {last})"
        entries: tuple[Entry, ...] = ()
        size_bytes = 0
        if pr.next <= last:
            room_bytes = self.cfg.max_inflight_bytes - pr.inflight_bytes
            entries = tuple(
                self._log.read_range(
                    pr.next,
                    min(self.cfg.max_append_batch_bytes, room_bytes),
                    self.cfg.max_append_batch_entries,
                )
            )
            size_bytes = sum(len(e.body) for e in entries)
            if pr.inflight and size_bytes > room_bytes:
                pr.no_room = True  # its first entry alone overflows: it goes once it fits
                return False
        self._send(self._append_request(peer, prev, entries))
        sent_upto = prev + len(entries)
        pr.commit_sent = max(pr.commit_sent, min(self._commit, sent_upto))
        pr.sent(sent_upto, self._leader_ticks, size_bytes)
        return True

    def _oldest_append_lost(self, pr: Progress, m: AppendResponse) -> bool:
        """A success answer that acks nothing new (a heartbeat's) while the window keeps the
        next append back: whether the oldest append in flight was lost, so that freeing its
        room lets replication go on before the stall check. Only when the follower's log
        ends before that append's last entry: a follower that holds it is still writing it
        (a catch-up: its answer comes once the write is done), and freeing its room then
        sent one more append per heartbeat beyond the byte window, without bound while the
        follower lagged (issue 36: 32 MiB in the leader's socket buffer towards a follower
        being caught up, 17 MiB in that follower's unwritten tail, against a window of 8).
        An append lost while the follower holds stale entries past it is found by the
        stall check instead (half an election timeout)."""
        return (
            bool(pr.inflight)
            and pr.blocked(self.cfg.max_inflight_appends, self.cfg.max_inflight_bytes)
            and m.last_log_index < pr.inflight[0]
        )

    def _window_full(self, pr: Progress) -> bool:
        """Whether ``pr``'s pipelining window (appends and bytes in flight) is full."""
        return pr.inflight_full(self.cfg.max_inflight_appends, self.cfg.max_inflight_bytes)

    def _broadcast_append(self) -> None:
        for p in list(self._progress):
            while self._send_append(p) and self._progress[p].state is ProgressState.REPLICATE:
                pass

    def _request_snapshot(self, peer: str, pr: Progress) -> None:
        """``peer`` is behind the log's first index: the next Ready asks the driver for a
        snapshot transfer (at most one in flight per follower)."""
        if pr.become_snapshot():
            self._snapshot_requests.append(SnapshotRequest(peer, self._term))

    def _on_ack_in_snapshot(self, peer: str, pr: Progress) -> None:
        """An answer from a follower in the SNAPSHOT state (its match is up to date): back to
        probing once it can continue from what the log holds, else ask for a snapshot again
        when none is in flight."""
        if pr.match + 1 >= self._log.first_index():
            pr.leave_snapshot()
            self._send_append(peer)
        elif not pr.snapshot_inflight:
            self._request_snapshot(peer, pr)

    def _handle_append_response(self, m: AppendResponse) -> None:
        if self._role is not Role.LEADER:
            return
        last = self._log.last_index()
        if (m.rejected_index > last and not m.success) or (
            m.match_index > last and m.success and "accept_ack_beyond_last" not in self._mut
        ):
            # This leader never sent anything beyond its last index in this term (its log only
            # grows while it leads): no honest follower acks or rejects such an index. Counting
            # the ack would commit without a real majority; it does not even prove liveness.
            self._drop(DROP_ACK_BEYOND_LAST, m)
            return
        pr = self._progress[m.from_id]
        pr.last_heard_tick = self._leader_ticks
        pr.supported_feature_level = max(m.supported_feature_level, BASELINE_LEVEL)
        pr.readers_waiting = m.readers_waiting
        repaired = pr.repairing and not m.repairing  # its match counts from now on
        pr.repairing = m.repairing
        if self._content_conflict(m):
            self._probe_back(m, pr)
            return
        if pr.state is ProgressState.SNAPSHOT:
            if m.success and m.match_index > pr.match:
                pr.match = m.match_index
                self._maybe_commit()
            self._on_ack_in_snapshot(m.from_id, pr)
            return
        if not m.success:
            self._handle_reject(m, pr)
            return
        advanced = pr.acked(m.match_index)
        if pr.state is ProgressState.PROBE:
            if m.match_index >= pr.next - 1:
                pr.become_replicate()
            else:
                pr.probe_sent = False
        else:
            pr.free_up_to(pr.match)
            if not advanced and self._oldest_append_lost(pr, m):
                pr.free_oldest()
        if advanced or repaired:
            self._maybe_commit()
        if advanced:
            if min(self._commit, pr.match) > pr.commit_sent and (
                pr.readers_waiting or not self._notices_held
            ):
                # A follower whose answer came after the commit (the slower of a majority)
                # learns it now too, not at the next heartbeat. While a hold is pending its
                # release covers this follower as well (release_notices asks every follower):
                # no Ready for it (at one send in flight, one Ready per message less), unless
                # readers wait for its apply.
                self._commit_notice_owed = True
            if self._transferee == m.from_id and pr.match == self._log.last_index():
                logger.info(
                    "node=%s term=%d send_timeout_now to=%s", self.id, self._term, m.from_id
                )
                self._send(TimeoutNow(self.id, m.from_id, self._term))
        while self._send_append(m.from_id) and pr.state is ProgressState.REPLICATE:
            pass

    def _handle_reject(self, m: AppendResponse, pr: Progress) -> None:
        """A follower refused an append whose prev it lacks or holds with another term."""
        if m.last_log_index < pr.match and m.last_log_index < m.rejected_index:
            # It lacks an index it acked: it cut its own copy since (a content repair, section
            # 11, its ack delivered after the cut; or damage its store cut at open, section
            # 12). Count only what it holds now, and send the rest again.
            self._forget_lost_match(m.from_id, pr, m.last_log_index)
            return
        if m.rejected_index <= pr.match:
            return  # stale: that prefix is already known to match
        if pr.state is ProgressState.PROBE and m.rejected_index != pr.next - 1:
            return  # stale: not the answer to the probe in flight
        nxt = m.conflict_index
        if m.conflict_term > 0:
            idx = self._last_index_of_term(
                m.conflict_term, min(m.rejected_index, self._log.last_index())
            )
            if idx > 0:
                nxt = idx + 1
        nxt = max(pr.match + 1, min(nxt, m.rejected_index))
        # Below what the log still holds (retention deleted it, or a forged hint): only
        # a snapshot catches this follower up; the probe never reads a deleted entry.
        pr.become_probe(nxt)
        self._send_append(m.from_id)

    def _content_conflict(self, m: AppendResponse) -> bool:
        """Whether the follower's answer shows a chain other than this leader's at an index
        both hold with the same term (its ack would count a prefix that differs)."""
        if m.match_chain == CHAIN_UNKNOWN or "skip_chain_check" in self._mut:
            return False
        log = self._log
        index = m.match_index if m.success else m.rejected_index
        if not log.first_index() - 1 <= index <= log.last_index():
            return False
        if not m.success and m.conflict_term != log.term_at(index):
            return False  # a term conflict: the usual back-off
        mine = log.chain_at(index)
        if agree(mine, m.match_chain):
            return False
        self._note_chain_mismatch(m.from_id, index, m.match_chain, mine, "follower answer")
        return True

    def _probe_back(self, m: AppendResponse, pr: Progress) -> None:
        """The follower's log differs by content at or before ``index``: probe back from
        there, twice as far each time (the append that matches then cuts the follower's log
        at the first entry that differs). The follower's ack no longer counts above it."""
        index = m.match_index if m.success else m.rejected_index
        step = pr.back_step
        pr.back_step = min(step * 2, MAX_INDEX)
        nxt = max(1, index - step + 1)
        stuck = pr.state is ProgressState.PROBE and pr.next == nxt
        pr.match = min(pr.match, nxt - 1)
        pr.become_probe(nxt)
        if not stuck:
            # (Stuck: a follower that answers the same probe with the same mismatch does not
            # follow the protocol; it is probed again with the next proposal, not at once.)
            self._send_append(m.from_id)

    def _last_index_of_term(self, term: int, upto: int) -> int:
        """Largest index <= upto whose term is ``term``; 0 when there is none."""
        i = upto
        first = self._log.first_index()
        while i >= first and self._log.term_at(i) > term:
            i -= 1
        if i >= first and self._log.term_at(i) == term:
            return i
        return 0

    def _forget_lost_match(self, peer: str, pr: Progress, last_log_index: int) -> None:
        """``peer`` rejects an append at or above its match with its log ending below it: it lost
        entries (its store cut damage, docs/STORAGE.md "Damage and repair"). Its match comes
        down to what it holds, so that the probe walks back and the entries are sent again.
        Lowering a match never lowers the commit index: only liveness rests on it."""
        logger.warning(
            "node=%s term=%d peer=%s lost entries: its log ends at %d below its match %d; "
            "sending them again",
            self.id,
            self._term,
            peer,
            last_log_index,
            pr.match,
        )
        pr.lower_match(last_log_index)
        self._send_append(peer)

    def _maybe_commit(self) -> None:
        assert self._role is Role.LEADER
        qi = committed_index([self._match_of(v) for v in self._voters])
        if qi <= self._commit:
            return
        if self._log.term_at(qi) != self._term and "commit_old_term_by_count" not in self._mut:
            return  # Raft figure 8: never commit an earlier term's entry by counting replicas
        self._commit = qi
        while self._pending and self._pending[0][0] <= qi:
            self._pending_bytes -= self._pending.popleft()[1]
        # Tell idle followers the new commit index at the next ready() rather than at the
        # next heartbeat; one that gets an append by then learns it from the append.
        self._commit_notice_owed = True
        if len(self._progress) > len(self.peers):
            self._prune_progress()

    def _match_of(self, voter: str) -> int:
        """What ``voter`` counts towards a commit: its match (a repairing one: nothing)."""
        if voter == self.id:
            return self._log.stable_last()
        pr = self._progress[voter]
        return 0 if pr.repairing else pr.match

    def _pay_owed_messages(self) -> None:
        """Appends of proposals since the last ready(), then commit notices to followers that
        no append told."""
        bcast, notice = self._bcast_owed, self._commit_notice_owed
        self._bcast_owed = self._commit_notice_owed = False
        if self._role is not Role.LEADER:
            return
        if bcast:
            self._broadcast_append()
        if notice or self._notices_held:
            commit = self._commit
            for p, pr in self._progress.items():
                if pr.readers_waiting and pr.notice_due(commit):
                    # Readers wait for its apply: not held (one message per commit that no
                    # append carried, while they wait; its answer would tell nothing new).
                    self._send_heartbeat(p, no_reply=True)
            # Held while some follower still needs one; an append sent since (in flight, or
            # carrying the commit) ends the hold, and the next one lingers in full.
            self._notices_held = any(pr.notice_due(commit) for pr in self._progress.values())

    def set_readers_waiting(self, waiting: bool) -> None:
        """The application has readers waiting for this node's next apply (long polls held on
        a follower) or no longer. A follower's answers to its leader say so, and the leader
        then sends it each commit notice at once instead of holding it (a follower otherwise
        learns a commit no append follows up to COMMIT_NOTICE_LINGER_MS late). Only the timing
        of notices changes: nothing of what is committed or applied."""
        self._readers_waiting = waiting

    def release_notices(self) -> None:
        """The linger of held commit notices is over (a Ready said ``notices_held``): a
        notice goes to each follower that still needs one; those an append told meanwhile
        are dropped. Idempotent: nothing happens when no notice is held."""
        if not self._notices_held:
            return
        self._notices_held = False
        if self._role is not Role.LEADER:
            return
        for p, pr in self._progress.items():
            if pr.notice_due(self._commit):
                # Its answer would tell nothing new: match is what prev says already.
                self._send_heartbeat(p, no_reply=True)

    # ------------------------------------------------------------------ follower side

    def _handle_append(self, m: AppendRequest) -> None:
        # step() dropped appends from a second leader of this term (this one included).
        assert self._role is not Role.LEADER, f"two leaders in term {self._term}"
        self._become_follower_of(m.from_id)
        log = self._log
        last = log.last_index()
        prev = m.prev_log_index
        entries = m.entries
        prev_term, prev_chain = m.prev_log_term, m.prev_log_chain
        floor = log.first_index() - 1
        if prev < floor:
            # Below what this log still holds (retention or a snapshot took it: applied, so
            # committed): skip what the append repeats of it; the rest is checked from the
            # floor on, against this log's own term and chain there.
            skip = min(len(entries), floor - prev)
            for e in entries[:skip]:  # the leader's chain at the new prev
                prev_chain = next_chain(prev_chain, e.index, e.term, e.type, e.body)
            prev_term = entries[skip - 1].term if skip else prev_term
            entries = entries[skip:]
            prev = prev + skip
            if prev < floor:
                # All of it below the floor: compacted entries were applied, so committed, so
                # the leader's. The floor is the match this member can vouch for (its commit
                # may lie below it while it repairs: the application applied more than the
                # log kept, section 11), and the leader probes on from there.
                self._reply_append_ok(m.from_id, floor)
                return
        if prev > last:
            self._reject_append(m, last + 1, 0)
            return
        local_term = log.term_at(prev)
        if local_term != prev_term:
            first = prev
            floor = max(self._commit + 1, log.first_index())
            while first - 1 >= floor and log.term_at(first - 1) == local_term:
                first -= 1
            self._reject_append(m, first, local_term)
            return
        local_chain = log.chain_at(prev)
        if not agree(local_chain, prev_chain) and "skip_chain_check" not in self._mut:
            # Same term, other content at or before prev: the leader probes further back.
            self._note_chain_mismatch(m.from_id, prev, prev_chain, local_chain, "append prev")
            # (Same index and term, other chain: some entry up to prev is not the leader's.)
            self._suspect_upto = max(self._suspect_upto, prev)
            self._reject_append(m, prev, local_term)
            return
        to_append = self._new_entries(m, entries, last, prev)
        if to_append is None:
            return
        if to_append:
            self._append_local(to_append)
        last_new = prev + len(entries)
        if self._suspect_upto and last_new >= self._suspect_upto:
            self._suspect_upto = 0  # the leader's chain now covers the doubted prefix
        if self._repair is not None:
            self._repair.learn_leader(self._term, m.leader_commit)
        if m.leader_commit > self._commit:
            self._commit = max(self._commit, min(m.leader_commit, last_new))
        if not (m.no_reply and not entries):
            self._reply_append_ok(m.from_id, last_new)

    def _handle_install(self, m: InstallSnapshot) -> None:
        """A snapshot transferred by this term's leader (step() checked sender and term)."""
        self._become_follower_of(m.from_id)
        meta = m.meta
        action = snap.install_action(
            self._log,
            meta,
            self._commit,
            self._applied,
            out_of_order="snapshot_out_of_order" in self._mut,
        )
        if action is snap.InstallAction.ANSWER:
            # Applied state already covers it (or more): installing it would roll back.
            self._reply_append_ok(m.from_id, self._commit)
            return
        if action is snap.InstallAction.COMMIT:
            # The entries are here: commit up to them, apply them as usual.
            self._commit = meta.index
            self._reply_append_ok(m.from_id, meta.index)
            return
        logger.info(
            "node=%s term=%d accept_snapshot from=%s index=%d snapshot_term=%d",
            self.id,
            self._term,
            m.from_id,
            meta.index,
            meta.term,
        )
        self._log.restore(meta)
        self._adopt_snapshot_conf(meta.config)
        # Lowers applied only under the mutation snapshot_out_of_order (a stale snapshot
        # replaces newer applied state); a snapshot beyond it leaves applied as it is.
        self._applied = min(self._applied, meta.index)
        self._commit = meta.index
        self._handed = meta.index
        self._reply_append_ok(m.from_id, meta.index)

    def _term_or_none(self, index: int) -> int | None:
        """The term at ``index``; None below the log's first index - 1 (compacted entries
        are committed and applied: known to match, there is nothing left to compare)."""
        if index < self._log.first_index() - 1:
            return None
        return self._log.term_at(index)

    def _become_follower_of(self, leader: str) -> None:
        """A message from this term's leader (an append or a snapshot): follow it."""
        if self._role is not Role.FOLLOWER or self._leader_id != leader:
            self._become_follower(self._term, leader)
        self._election_elapsed = 0
        if self._repair is not None and self._repair.vote_lost and self._voted_for is None:
            # The vote of this term may have been lost with the hard state: count this
            # leader's term as voted (for it), so this node never votes in it again.
            self._voted_for = leader

    def _reject_append(self, m: AppendRequest, conflict_index: int, conflict_term: int) -> None:
        log = self._log
        at = m.prev_log_index
        chain = CHAIN_UNKNOWN
        if conflict_term > 0 and log.first_index() - 1 <= at <= log.last_index():
            chain = log.chain_at(at)
        self._send(
            AppendResponse(
                self.id,
                m.from_id,
                self._term,
                success=False,
                conflict_index=conflict_index,
                conflict_term=conflict_term,
                last_log_index=log.last_index(),
                rejected_index=at,
                repairing=self._repair is not None,
                match_chain=chain,
                supported_feature_level=self.cfg.supported_feature_level,
                readers_waiting=self._readers_waiting,
            )
        )

    def _new_entries(
        self, m: AppendRequest, entries: Sequence[Entry], last: int, prev: int
    ) -> Sequence[Entry] | None:
        """The suffix of ``entries`` (which follow ``prev``, whose chain matched) this log
        lacks, from the first entry that differs (by term or by content: its chain) or past
        its end; appending it cuts the log there. A difference at a committed index means
        this node's copy is the damaged one (section 13 of docs/RAFT.md): it is reported and
        cut like any other."""
        log = self._log
        chain = log.chain_at(prev)
        skip_chain = "skip_chain_check" in self._mut
        for i, e in enumerate(entries):
            if e.index > last:
                return entries[i:]
            chain = next_chain(chain, e.index, e.term, e.type, e.body)
            local = log.chain_at(e.index)
            if log.term_at(e.index) == e.term and (skip_chain or agree(chain, local)):
                continue
            if "no_truncate_conflict" in self._mut:
                # MUTATION: keep the conflicting suffix, append only past it.
                return [x for x in entries[i:] if x.index > last]
            if e.index <= self._commit:
                self._repair_committed(m.from_id, e.index, chain, local)
            else:
                logger.info("node=%s term=%d truncate_suffix from=%d", self.id, self._term, e.index)
            return entries[i:]  # the append cuts the log at its first index
        return ()

    def _repair_committed(self, leader: str, index: int, theirs: int, mine: int) -> None:
        """This term's leader holds other content at committed ``index``: the leader holds
        what a majority acknowledged (leader completeness), so this copy is damaged or
        forged. Cut it there (the caller's append does), take the leader's entries, and roll
        applied state back past it."""
        self._note_chain_mismatch(leader, index, theirs, mine, "committed entry")
        self.committed_repairs += 1
        logger.error(
            "node=%s term=%d repair_committed index=%d commit=%d applied=%d leader=%s: "
            "cutting this member's copy from index %d and taking the leader's",
            self.id,
            self._term,
            index,
            self._commit,
            self._applied,
            leader,
            index,
        )
        self._commit = index - 1
        if self._handed >= index:
            self._handed = index - 1
            rewind = self._rewind_to
            self._rewind_to = index - 1 if rewind is None else min(rewind, index - 1)

    def _note_chain_mismatch(
        self, peer: str, index: int, theirs: int, mine: int, what: str
    ) -> None:
        """Count a content mismatch with ``peer`` at ``index``; an ERROR line for the 1st,
        2nd, 4th ... (a hostile peer cannot flood the log)."""
        self.chain_mismatches += 1
        n = self.chain_mismatches
        if n & (n - 1) == 0:
            logger.error(
                "node=%s term=%d chain_mismatch %s index=%d commit=%d peer=%s peer_chain=%s "
                "own_chain=%s count=%d",
                self.id,
                self._term,
                what,
                index,
                self._commit,
                peer,
                chain_fmt(theirs),
                chain_fmt(mine),
                n,
            )

    def _reply_append_ok(self, to: str, match: int) -> None:
        """A success answer: ``match`` was checked against this term's leader's log."""
        self._verified = max(self._verified, match)
        self._send(
            AppendResponse(
                self.id,
                to,
                self._term,
                success=True,
                match_index=match,
                last_log_index=self._log.last_index(),
                repairing=self._repair is not None,
                match_chain=self._log.chain_at(match),
                supported_feature_level=self.cfg.supported_feature_level,
                readers_waiting=self._readers_waiting,
            )
        )

    def _maybe_finish_repair(self) -> None:
        """Leave the repair state once the durable log, checked against this term's leader,
        holds the promise or an entry of a later term than the repair started in."""
        r = self._repair
        if r is None or self._role is not Role.FOLLOWER or self._leader_id is None:
            return
        upto = min(self._verified, self._log.stable_last())
        term_there = self._term_or_none(upto)
        if term_there is None or not r.done(upto, term_there, self._term):
            return
        self._repair = None
        self.repairs_completed += 1
        logger.info(
            "node=%s term=%d repair_done log verified up to %d (index %d term %d promised); "
            "voting again",
            self.id,
            self._term,
            upto,
            r.target,
            r.term,
        )

    def _handle_vote_request(self, m: VoteRequest) -> None:
        if self._repair is not None:
            # Its log lacks entries it acknowledged: its up-to-date check would be wrong.
            self._reject_vote(m, REJECT_REPAIRING)
            return
        # etcd's rule: same vote again, or a fresh vote with no leader known, or a pre-vote
        # for a later term.
        can_vote = (
            self._voted_for == m.from_id
            or (self._voted_for is None and self._leader_id is None)
            or (m.pre_vote and m.term > self._term)
        )
        log_ok = (m.last_log_term, m.last_log_index) >= (
            self._log.last_term(),
            self._log.last_index(),
        ) or "vote_without_log_check" in self._mut
        if log_ok and self._vote_chain_conflict(m):
            self._reject_vote(m, REJECT_CHAIN_MISMATCH)
            return
        if can_vote and log_ok:
            if not m.pre_vote:
                self._voted_for = m.from_id
                self._election_elapsed = 0
            logger.info(
                "node=%s term=%d grant_vote to=%s pre_vote=%s",
                self.id,
                m.term,
                m.from_id,
                m.pre_vote,
            )
            at = min(m.last_log_index, self._log.last_index())
            if at < self._log.first_index() - 1:
                at = 0  # below this log (a snapshot): the empty prefix, known everywhere
            self._send(
                VoteResponse(
                    self.id,
                    m.from_id,
                    m.term,
                    granted=True,
                    pre_vote=m.pre_vote,
                    log_index=at,
                    log_term=self._log.term_at(at),
                    log_chain=self._log.chain_at(at),
                )
            )
        else:
            self._reject_vote(m, REJECT_ALREADY_VOTED if not can_vote else REJECT_STALE_LOG)

    def _vote_chain_conflict(self, m: VoteRequest) -> bool:
        """Whether this log holds the candidate's last entry with its term but another chain
        there (one of the two logs is damaged or forged: no vote across that)."""
        log = self._log
        i = m.last_log_index
        if "skip_chain_check" in self._mut or not log.first_index() - 1 <= i <= log.last_index():
            return False
        if log.term_at(i) != m.last_log_term:
            return False
        mine = log.chain_at(i)
        if agree(mine, m.last_log_chain):
            return False
        self._note_chain_mismatch(m.from_id, i, m.last_log_chain, mine, "vote request")
        return True

    def _voter_chain_conflict(self, m: VoteResponse) -> bool:
        """Whether a granting voter holds the entry at ``m.log_index`` with this log's term
        but another chain (one of the two logs is damaged or forged): the vote does not
        count, so that a damaged candidate never wins with the votes of shorter logs."""
        log = self._log
        i = m.log_index
        if "skip_chain_check" in self._mut or not log.first_index() - 1 <= i <= log.last_index():
            return False
        if log.term_at(i) != m.log_term:
            return False
        mine = log.chain_at(i)
        if agree(mine, m.log_chain):
            return False
        self._note_chain_mismatch(m.from_id, i, m.log_chain, mine, "vote answer")
        return True

    def _handle_vote_response(self, m: VoteResponse) -> None:
        if self._role is Role.PRE_CANDIDATE:
            if not m.pre_vote or (m.granted and m.term != self._term + 1):
                return
        elif self._role is Role.CANDIDATE:
            if m.pre_vote:
                return
        else:
            return
        self._votes.setdefault(m.from_id, m.granted and not self._voter_chain_conflict(m))
        result = vote_result(self._voters, self._votes)
        if result is VoteResult.WON:
            self._win_vote()
        elif result is VoteResult.LOST:
            self._become_follower(self._term, None)

    def _handle_timeout_now(self, m: TimeoutNow) -> None:
        if self._role is Role.LEADER or self.id not in self._voters or self._repair is not None:
            return
        logger.info("node=%s term=%d timeout_now from=%s", self.id, self._term, m.from_id)
        self._campaign(pre_vote=False, transfer=True)
