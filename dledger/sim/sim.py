"""A deterministic, single-threaded simulation of one Raft group under faults.

Everything random comes from PRNGs seeded by the run's seed, and time is simulated, so a seed
replays bit for bit. The driver of each simulated member follows the core's Ready/advance
contract exactly (see ``dledger.core``): it sends a Ready's early messages at once, persists
its hard state, truncation and entries in one job that takes simulated time, and only then
sends its other messages, applies and advances; when a Ready holds commit notices it calls
``release_notices()`` COMMIT_NOTICE_LINGER_MS of simulated time later (the call is cancelled
when a later Ready holds none); about half the incarnations of a member say readers wait for
their applies, so their leaders send them notices without the linger. A crash before the job
completes loses the Ready (its unsaved hard state and entries, with the core's unstable tail,
and its unsent messages).

Snapshots (in the seeds with ``compaction``): every member now and then deletes a prefix of
its log up to what it applied (the state machine's snapshot), so a member that was down or
cut off finds its leader's log starting past its own. The leader's driver answers a Ready's
``snapshot_requests`` with a simulated transfer of its applied state (which takes 5-35 ms,
fails when the link is cut or the message lost, and is sometimes delivered twice, late), and
the follower's driver installs a Ready's ``snapshot`` in its persist job, before the entries.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import heapq
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from dledger.core import (
    COMMIT_NOTICE_LINGER_MS,
    MAX_TERM,
    MUTATIONS,
    AppendRequest,
    AppendResponse,
    BackPressureError,
    ChangeKind,
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
    Message,
    NotLeaderError,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    TimeoutNow,
    TransferInProgressError,
    VoteRequest,
    VoteResponse,
)
from dledger.core.config import DEFAULT_MAX_INFLIGHT_BYTES
from dledger.core.membership import decode as decode_conf
from dledger.core.membership import joining
from dledger.core.snapshot import InstallSnapshot, SnapshotMeta, SnapshotRequest
from dledger.log import DLedgerError, Entry, EntryType, FeatureLevelError, persist
from dledger.sim.faults import (
    LEADER,
    FaultEvent,
    blocked_links,
    generate_features,
    generate_forgeries,
    generate_membership,
    generate_schedule,
    generate_storage,
    node_ids,
)
from dledger.sim.memlog import AppendHook, MemLog
from mqerrors import codes as E
from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL

logger = logging.getLogger(__name__)

TICK_MS = 10  # one Raft tick of simulated time
ELECTION_TIMEOUT_TICKS = 10  # so elections time out after 100..200 ms of simulated time
# After the faults end, a leader must be elected and a new proposal committed within this.
LIVENESS_BOUND_MS = 4_000
# A follower whose committed entries were damaged holds the committed content again (as far
# as it held it when damaged) this long after the damage (its leader's next append finds it).
REPAIR_BOUND_MS = 2_000
# Share of seeds in which, the moment the run is live (healed, a proposal committed), one
# applied, committed entry of a follower silently holds other content (MemLog.damage): its
# leader must find it and repair it within REPAIR_BOUND_MS. Only then (and only in runs
# without membership changes): a damaged member plus another fault of the schedule can leave
# no majority of intact copies, beyond any repair.
DAMAGE_SEED_PCT = 30
# Hard stop for one run (simulated), whatever happens.
MAX_SIM_TIME_MS = 20_000

# Bounds the leader's uncommitted backlog (bodies are ~5 bytes: about 100 entries), so that
# after the heal the backlog commits well within LIVENESS_BOUND_MS.
SIM_PENDING_PROPOSAL_BYTES = 512
MIN_ENTRIES_PER_RTT = 4

# Nodes a run may add (each new member gets a new id: ids are never reused), and the fewest
# voters a removal may leave: the schedules (a deaf leader at the heal, say) assume a group
# that survives one lost voter.
MAX_NEW_NODES = 3
MIN_VOTERS_AFTER_REMOVAL = 3
# A removal of the leader is refused while it hands over; the operator retries this much later.
REMOVE_RETRY_MS = 50

_TICK, _DELIVER, _PERSIST, _FAULT, _CLIENT, _HEAL, _RELEASE, _SNAPSHOT = range(8)
# With compaction, each member compacts its log with this chance per tick (about every
# 300 ms), keeping up to COMPACT_KEEP_MAX applied entries.
COMPACT_CHANCE_PER_TICK = 0.03
COMPACT_KEEP_MAX = 16
# A simulated snapshot transfer takes this long (ms) before the follower has it whole.
SNAPSHOT_TRANSFER_MS = (5, 35)

# Test-only faults of the simulated driver (the core's own are dledger.core.MUTATIONS); each
# breaks the Ready contract on purpose so that the tests prove the checks notice.
DRIVER_MUTATIONS = frozenset(
    {
        # Send every message of a Ready before its persist job ran: an ack or a vote promises
        # entries or a vote that a crash in between loses.
        "send_before_persist",
    }
)


class Violation(DLedgerError):
    """A Raft invariant failed. ``kind`` is a short stable name."""

    code = E.RAFT_VIOLATION

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True, slots=True)
class SimParams:
    """Everything about a run that the seed decides, except the fault schedule."""

    nodes: int
    pre_vote: bool
    check_quorum: bool
    heartbeat_interval_ticks: int
    max_append_batch_entries: int
    max_inflight_appends: int
    max_inflight_bytes: int
    preferred_leader_id: str | None
    net_delay_max_ms: int
    dup_pct: int
    fault_phase_ms: int
    deaf_leader_at_heal: bool
    client_interval_max_ms: int
    compaction: bool

    @staticmethod
    def from_seed(seed: int, nodes: int) -> SimParams:
        rng = random.Random(f"params-{seed}")
        check_quorum = rng.random() < 0.8
        pre_vote = rng.random() < 0.5
        batch = rng.choice((1, 2, 4, 64))
        # At least MIN_ENTRIES_PER_RTT entries per round trip, or the clients outrun the
        # replication and "liveness" would fail for want of throughput, not of correctness.
        inflight = max(rng.choice((1, 2, 8, 64)), -(-MIN_ENTRIES_PER_RTT // batch))
        return SimParams(
            nodes=nodes,
            pre_vote=pre_vote,
            check_quorum=check_quorum,
            heartbeat_interval_ticks=rng.choice((1, 2, 3)),
            max_append_batch_entries=batch,
            max_inflight_appends=inflight,
            preferred_leader_id=(f"n{rng.randrange(nodes)}" if rng.random() < 0.15 else None),
            net_delay_max_ms=rng.choice((3, 10, 25)),
            dup_pct=rng.choice((0, 0, 2, 10)),
            fault_phase_ms=rng.randint(600, 1_500),
            # A deaf node (sends, never receives) is harmless only with both: check-quorum
            # deposes it as leader, pre-vote keeps it from raising everyone's term forever.
            deaf_leader_at_heal=check_quorum and pre_vote and rng.random() < 0.4,
            client_interval_max_ms=rng.choice((20, 50)),
            compaction=rng.random() < 0.6,
            # Drawn last, so every other parameter of a seed stays what it was before it.
            # 32 bytes still carries MIN_ENTRIES_PER_RTT bodies (at most ~7 bytes each) per
            # round trip; membership entries are bigger and go alone (the window's exception).
            max_inflight_bytes=rng.choice((32, 256, 4096, DEFAULT_MAX_INFLIGHT_BYTES)),
        )

    def raft_config(self, mutations: frozenset[str]) -> RaftConfig:
        return RaftConfig(
            election_timeout_ticks=ELECTION_TIMEOUT_TICKS,
            heartbeat_interval_ticks=self.heartbeat_interval_ticks,
            max_inflight_appends=self.max_inflight_appends,
            max_inflight_bytes=self.max_inflight_bytes,
            max_append_batch_entries=self.max_append_batch_entries,
            max_append_batch_bytes=4096,
            max_pending_proposal_bytes=SIM_PENDING_PROPOSAL_BYTES,
            check_quorum=self.check_quorum,
            pre_vote=self.pre_vote,
            preferred_leader_id=self.preferred_leader_id,
            mutations=mutations,
        )


@dataclass
class SimResult:
    seed: int
    nodes: int
    violation: Violation | None
    steps: int
    sim_time_ms: int
    trace_hash: str
    faults: list[FaultEvent]
    trace: list[str] = field(default_factory=list)
    acked: int = 0
    snapshot_installs: int = 0  # snapshots a follower's driver installed
    storage_faults: int = 0  # storage faults injected (rollbacks, lost hard states)
    repairs: int = 0  # repairs the members completed (docs/RAFT.md section 11)
    raises: int = 0  # feature level raises the leaders accepted (docs/RAFT.md section 14)


class _Node:
    __slots__ = (
        "accepted",
        "applied",
        "boot_conf",
        "core",
        "damaged",
        "id",
        "incarnation",
        "log",
        "max_applied",
        "pending",
        "release_pending",
        "release_seq",
        "seen_leader_term",
        "sm_floor",
        "staged",
        "support",
        "up",
    )

    def __init__(self, node_id: str, log: MemLog) -> None:
        self.id = node_id
        self.log = log
        self.core: RaftNode | None = None
        self.up = False
        self.incarnation = 0
        self.pending: Ready | None = None  # Ready being persisted
        self.release_pending = False  # a release_notices() call is scheduled
        self.release_seq = 0  # which scheduled call is the pending one (the others: cancelled)
        self.applied = 0  # applied index of this incarnation
        self.max_applied = 0  # highest index ever applied (durable by contract)
        self.accepted: dict[int, tuple[int, bytes, int]] = {}  # index -> (term, body, at_ms)
        self.seen_leader_term = -1
        # The application's applied index survives a storage fault of the log (the broker's
        # state lives beside the store): the next start resumes from it, not from the log.
        self.sm_floor = 0
        # None: an original member (bootstrap configuration); a joined node's own.
        self.boot_conf: ConfState | None = None
        # Snapshots received whole and not installed yet: (index, term) -> prefix hashes.
        self.staged: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        # A damage event changed a committed entry of this log and it was not repaired yet.
        # Damaged (DAMAGE_SEED_PCT) and not repaired yet: the last index its log held then,
        # which it must hold again, by content; 0: not damaged.
        self.damaged = 0
        # The highest feature level its release supports (a ``feature old`` fault: the
        # previous release's, until ``feature upgrade``).
        self.support = FEATURE_LEVEL


class Simulation:
    """One run: ``Simulation(seed, nodes).run()``. ``faults`` overrides the seed's schedule."""

    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        *,
        mutations: frozenset[str] = frozenset(),
        faults: Sequence[FaultEvent] | None = None,
        trace: bool = False,
    ) -> None:
        self.seed = seed
        self.params = SimParams.from_seed(seed, nodes)
        unknown = mutations - MUTATIONS - DRIVER_MUTATIONS
        if unknown:
            raise ValueError(f"unknown mutations {sorted(unknown)}")
        self.config = self.params.raft_config(mutations & MUTATIONS)
        self._send_before_persist = "send_before_persist" in mutations
        self.ids = node_ids(nodes)
        self.boot_ids = self.ids  # the bootstrap configuration; self.ids grows with joins
        self.faults = list(faults if faults is not None else self._schedule())
        # A forgetful node and a deaf leader at the heal are two faults in a 3-node group:
        # no election could succeed (the forgetful one must not vote). Not both in one run.
        self._deaf_at_heal = self.params.deaf_leader_at_heal and not any(
            f.kind == "storage" for f in self.faults
        )
        self._storage_rng = random.Random(f"storage-run-{seed}")
        self.storage_faults = 0
        self._lagging: frozenset[str] = frozenset()  # cut off by a forgetful_lag fault
        self._lag_blocked: set[tuple[str, str]] = set()  # their links, until it strikes
        self.repairs = 0  # of cores since crashed; the live ones' are added at the end
        self._forge_rng = random.Random(f"forge-run-{seed}")
        self._member_rng = random.Random(f"member-run-{seed}")
        self._damage_rng = random.Random(f"damage-run-{seed}")
        # Not with membership changes: the damaged member's removal before its repair would
        # take the copies it lost out of every count (the checker's, not Raft's, problem).
        self._damage_at_live = random.Random(f"damage-{seed}").randrange(
            100
        ) < DAMAGE_SEED_PCT and not any(f.kind.startswith("member") for f in self.faults)
        self._live_at: int | None = None
        self._final_voters: frozenset[str] = frozenset(self.ids)
        self._net_rng = random.Random(f"net-{seed}")
        self._client_rng = random.Random(f"client-{seed}")
        self._compact_rng = random.Random(f"compact-{seed}")
        self.snapshot_installs = 0
        self._trace_on = trace
        self.trace: list[str] = []
        self._hash = hashlib.blake2b(digest_size=16)
        self.now = 0
        self.steps = 0
        self._queue: list[tuple[int, int, int, object]] = []
        self._seq = 0
        self._blocked: set[tuple[str, str]] = set()
        self._loss_pct = 0
        self._healed_at: int | None = None
        self._armed_isolate_leader = False
        self._armed_crash_voter = False
        self._armed_member: FaultEvent | None = None  # asked of the next leader
        self._live = False
        self._init_checker()
        self.nodes = {nid: _Node(nid, MemLog(self._make_hook(nid))) for nid in self.ids}

    def _init_checker(self) -> None:
        """The checker's state: the committed history, leaders, votes, commits, acks."""
        self._history: list[tuple[int, int, bytes]] = [(0, 0, b"")]  # committed, index 0 dummy
        self._history_hash: list[int] = [0]  # prefix hashes of the committed history
        self._prefix: dict[tuple[int, int], int] = {}  # (index, term) -> prefix hash
        self._leaders: dict[int, str] = {}  # term -> leader id
        self._votes: dict[tuple[str, int], str] = {}  # (voter, term) -> candidate
        self._commit_marks: dict[int, tuple[int, int]] = {}  # term -> (index, prefix hash)
        # Each advance of the group's highest commit index, with the voters of the leader
        # that made it: the configuration that committed an entry is the first one here at
        # or above its index. Not the committing leader's configuration when the entry is
        # applied: a change appended between the commit and the apply is not what counted.
        self._commit_at: list[int] = []
        self._commit_voters: list[frozenset[str]] = []
        self._acked: dict[int, tuple[int, bytes]] = {}
        self._next_body = 0
        # (leader, term) -> member -> the supported feature level of its last append answer
        # delivered to that leader in that term (the raise_without_reports check).
        self._reports: dict[tuple[str, int], dict[str, int]] = {}
        self.raises = 0  # feature level raises the leaders accepted

    def _schedule(self) -> list[FaultEvent]:
        """The seed's fault schedule: each kind from its own PRNG, so adding one kind leaves
        the others of a seed as they were."""
        seed, ids, phase = self.seed, self.ids, self.params.fault_phase_ms
        member = generate_membership(random.Random(f"member-{seed}"), ids, phase)
        faults = (
            generate_schedule(random.Random(f"faults-{seed}"), ids, phase)
            + generate_forgeries(random.Random(f"forge-{seed}"), ids, phase)
            + member
            + generate_storage(random.Random(f"storage-{seed}"), ids, phase)
        )
        if not member:  # (a joined node's release is this one: not modelled together)
            faults += generate_features(random.Random(f"features-{seed}"), ids, phase)
        faults.sort(key=lambda e: e.at_ms)  # stable: the schedule's order is kept
        return faults

    # ------------------------------------------------------------------ plumbing

    def _make_hook(self, nid: str) -> AppendHook:
        prefix = self._prefix

        def on_append(e: Entry, h: int) -> None:
            key = (e.index, e.term)
            seen = prefix.get(key)
            if seen is None:
                prefix[key] = h
            elif seen != h:
                raise Violation(
                    "log_matching",
                    f"{nid} holds entry index={e.index} term={e.term} with a different prefix",
                )

        return on_append

    def _push(self, at: int, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, kind, payload))

    def _note(self, line: str) -> None:
        self._hash.update(line.encode())
        if self._trace_on:
            self.trace.append(f"{self.now:>6}ms {line}")

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        violation: Violation | None = None
        try:
            self._run()
        except Violation as v:
            violation = v
        except AssertionError as e:
            violation = Violation("core_assertion", str(e) or repr(e))
        except DLedgerError as e:
            # A core must never raise out of step/tick (e.g. an index it does not hold).
            violation = Violation("core_exception", f"{type(e).__name__}: {e}")
        if violation is not None:
            self._note(f"VIOLATION {violation}")
        return SimResult(
            seed=self.seed,
            nodes=len(self.ids),
            violation=violation,
            steps=self.steps,
            sim_time_ms=self.now,
            trace_hash=self._hash.hexdigest(),
            faults=self.faults,
            trace=self.trace,
            acked=len(self._acked),
            snapshot_installs=self.snapshot_installs,
            storage_faults=self.storage_faults,
            repairs=self.repairs
            + sum(n.core.repairs_completed for n in self.nodes.values() if n.core is not None),
            raises=self.raises,
        )

    def _run(self) -> None:
        for nid in self.ids:
            self._start(self.nodes[nid])
        self._push(TICK_MS, _TICK, None)
        self._push(self._client_rng.randint(1, 20), _CLIENT, None)
        for f in self.faults:
            self._push(f.at_ms, _FAULT, f)
        self._push(self.params.fault_phase_ms, _HEAL, None)
        queue = self._queue
        while queue:
            at, _, kind, payload = heapq.heappop(queue)
            self.now = at
            self.steps += 1
            if at > MAX_SIM_TIME_MS:
                raise Violation("liveness", "simulation exceeded MAX_SIM_TIME_MS")
            if kind == _TICK:
                self._on_tick()
            elif kind == _DELIVER:
                self._on_deliver(payload)  # type: ignore[arg-type]
            elif kind == _PERSIST:
                self._on_persist(payload)  # type: ignore[arg-type]
            elif kind == _FAULT:
                self._on_fault(payload)  # type: ignore[arg-type]
            elif kind == _CLIENT:
                self._on_client()
            elif kind == _RELEASE:
                self._on_release(payload)  # type: ignore[arg-type]
            elif kind == _SNAPSHOT:
                self._on_snapshot(payload)  # type: ignore[arg-type]
            else:
                self._on_heal()
            if self._live:
                if self._live_at is None:
                    self._live_at = self.now
                    if self._damage_at_live:
                        self._damage()
                if not self._damage_pending():
                    break
                if self.now > self._live_at + REPAIR_BOUND_MS:
                    raise Violation(
                        "damage_not_repaired",
                        f"a damaged committed prefix was not repaired {REPAIR_BOUND_MS}ms "
                        "after the run was live",
                    )
            if self._healed_at is not None and at > self._healed_at + LIVENESS_BOUND_MS:
                raise Violation(
                    "liveness",
                    f"no proposal committed within {LIVENESS_BOUND_MS}ms after the faults healed",
                )
        self._final_checks()

    # ------------------------------------------------------------------ node lifecycle

    def _start(self, node: _Node) -> None:
        node.incarnation += 1
        node.up = True
        node.pending = None
        node.release_pending = False
        # The state machine restarts from its snapshot, where the log was compacted; or, after
        # a storage fault took entries it applied, from where it was.
        node.applied = max(node.log.first_index() - 1, node.sm_floor)
        node.sm_floor = 0
        node.accepted = {}
        node.staged = {}
        node.seen_leader_term = -1
        promised, hard_state = node.log.start_state(node.applied)
        config = self.config
        if node.support != config.supported_feature_level:
            config = dataclasses.replace(config, supported_feature_level=node.support)
        try:
            node.core = RaftNode(
                node.id,
                self.boot_ids,
                node.log,
                config,
                random.Random(f"core-{self.seed}-{node.id}-{node.incarnation}"),
                conf_state=node.boot_conf,
                applied_index=node.applied,
                promised=promised,
                hard_state=hard_state,
            )
        except FeatureLevelError:
            # The previous release refuses a log of a raised group: the operator upgrades it.
            self._note(f"start {node.id} refused: its log is above level {node.support}")
            node.support = FEATURE_LEVEL
            node.incarnation -= 1
            self._start(node)
            return
        # Readers wait on about half the incarnations (a broker follower holding long polls):
        # their leaders send them commit notices without the linger (docs/RAFT.md section 4).
        readers = random.Random(f"readers-{self.seed}-{node.id}-{node.incarnation}")
        node.core.set_readers_waiting(readers.random() < 0.5)
        self._note(f"start {node.id} inc={node.incarnation} last={node.log.last_index()}")

    def _crash(self, node: _Node) -> None:
        if not node.up:
            return
        if node.damaged:
            # Its restart would replay the damaged log into its state machine: telling that
            # damage from a crash is the repair state's part (issue 31, item 2), not modelled.
            self._note(f"crash {node.id} skipped: damaged")
            return
        node.up = False
        if node.core is not None:
            self.repairs += node.core.repairs_completed
        node.core = None
        node.pending = None
        lost = node.log.crash()
        self._note(f"crash {node.id} lost_unflushed={lost}")
        if node.log.last_index() < node.max_applied:
            raise Violation(
                "durability",
                f"{node.id} lost applied entries in a crash "
                f"(last {node.log.last_index()} < {node.max_applied})",
            )

    # ------------------------------------------------------------------ events

    def _on_tick(self) -> None:
        for nid in self.ids:
            node = self.nodes[nid]
            if node.up:
                assert node.core is not None
                if self.params.compaction and not node.damaged:
                    # (Damage below a member's retention point is repaired by a snapshot
                    # install, the repair state's part, issue 31 item 2: not modelled.)
                    self._maybe_compact(node)
                node.core.tick()
                self._after(node)
        self._push(self.now + TICK_MS, _TICK, None)

    def _maybe_compact(self, node: _Node) -> None:
        """Retention: delete the log up to some applied index (the state machine's snapshot)."""
        rng = self._compact_rng
        if rng.random() >= COMPACT_CHANCE_PER_TICK:
            return
        upto = min(node.applied, node.log.flushed_index()) - rng.randint(0, COMPACT_KEEP_MAX)
        if upto >= node.log.first_index():
            node.log.compact(upto)
            self._note(f"compact {node.id} upto={upto}")

    def _on_deliver(self, m: Message) -> None:
        node = self.nodes[m.to_id]
        if not node.up or self._cut(m.from_id, m.to_id):
            return
        assert node.core is not None
        if self._trace_on:
            self._note(f"recv {_describe(m)}")
        else:
            self._note(f"r{m.from_id}{m.to_id}{type(m).__name__[0]}{m.term}")
        if isinstance(m, AppendResponse):
            reports = self._reports.setdefault((m.to_id, m.term), {})
            reports[m.from_id] = m.supported_feature_level
        removed = m.from_id in node.core.conf_state.removed
        term = node.core.term
        node.core.step(m)
        if removed and node.core.term != term:
            raise Violation(
                "removed_disrupts",
                f"{m.to_id} knows {m.from_id} was removed, yet its {type(m).__name__} moved "
                f"{m.to_id}'s term from {term} to {node.core.term}",
            )
        self._after(node)

    def _on_persist(self, payload: tuple[str, int]) -> None:
        nid, incarnation = payload
        node = self.nodes[nid]
        if not node.up or node.incarnation != incarnation or node.pending is None:
            return
        core = node.core
        assert core is not None
        rd = node.pending
        node.pending = None
        self._check_persisted_levels(node, rd)
        if rd.snapshot is not None:
            self._install(node, rd.snapshot)
        persist(node.log, rd.hard_state, rd.truncate_from, rd.entries, flush=True)
        node.log.save_promise(rd.promise, rd.hard_state, hold=core.repairing)
        if node.log.truncated:
            self._check_truncations(node)  # before this Ready's committed entries apply
        if not self._send_before_persist and self._send_all(node, rd.messages):
            return  # crashed right after its vote went out
        configs = [e.index for e in rd.committed if e.type == EntryType.CONFIG]
        if configs:
            # As the server saves membership.json before applying past a CONFIG entry: a
            # restart must not rebuild the group from a log whose CONFIG entries a
            # compaction may have taken.
            node.boot_conf = core.conf_state_at(configs[-1])
        if rd.rewind_to is not None:
            # The simulated state machine is the applied prefix: rolling back is forgetting.
            self._note(f"rewind {node.id} to={rd.rewind_to} applied={node.applied}")
            node.applied = min(node.applied, rd.rewind_to)
        for e in rd.committed:
            self._apply(node, e)
        core.advance(rd)
        self._after(node)

    def _install(self, node: _Node, meta: SnapshotMeta) -> None:
        """The driver installs a snapshot its core accepted: log and applied state replaced."""
        hashes, chains = node.staged.pop((meta.index, meta.term))
        self._note(f"install {node.id} index={meta.index} term={meta.term}")
        if meta.index <= node.applied:
            raise Violation(
                "apply_order",
                f"{node.id} installed a snapshot of index {meta.index} after applying "
                f"{node.applied}",
            )
        if hashes[meta.index] != self._history_hash[meta.index]:
            raise Violation(
                "state_machine_safety",
                f"{node.id} installed a snapshot of index {meta.index} that differs from "
                "the committed prefix",
            )
        if chains[meta.index] != meta.chain:
            raise Violation("snapshot_chain", f"{node.id} got a snapshot of another chain")
        node.log.install(meta, hashes, chains)
        if isinstance(meta.config, ConfState):
            # The core adopted the snapshot's configuration (its CONFIG entries are gone):
            # kept for a restart, as the server's driver saves membership.json.
            node.boot_conf = meta.config
        self.snapshot_installs += 1
        if node.log.truncated:
            self._check_truncations(node)
        node.applied = meta.index
        node.max_applied = max(node.max_applied, meta.index)

    def _send_snapshots(self, node: _Node, requests: Sequence[SnapshotRequest]) -> None:
        """The leader's driver starts a transfer of its applied state per request."""
        rand = self._net_rng.random
        lo, hi = SNAPSHOT_TRANSFER_MS
        index = node.applied
        assert node.core is not None
        conf = node.core.conf_state_at(index)
        meta = SnapshotMeta(index, node.log.term_at(index), conf, node.log.chain_at(index))
        hashes = (node.log.prefix_hashes(index), node.log.prefix_chains(index))
        for req in requests:
            m = InstallSnapshot(
                node.id, req.to_id, req.term, meta.index, meta.term, conf, meta.chain
            )
            self._note(f"snapshot {node.id}->{req.to_id} index={index}")
            at = self.now + lo + int(rand() * (hi - lo))
            self._push(at, _SNAPSHOT, (m, hashes, node.incarnation, True))
            if self.params.dup_pct and rand() * 100 < self.params.dup_pct:
                # A late copy (a transfer retried by a slow stream): it must be ignored.
                late = at + 20 + int(rand() * 200)
                self._push(late, _SNAPSHOT, (m, hashes, node.incarnation, False))

    def _on_snapshot(
        self, payload: tuple[InstallSnapshot, tuple[list[int], list[int]], int, bool]
    ) -> None:
        """A transfer ends: the follower gets the InstallSnapshot if the data went through;
        the leader (the same incarnation) hears how it went."""
        m, hashes, incarnation, report = payload
        follower, leader = self.nodes[m.to_id], self.nodes[m.from_id]
        ok = (
            follower.up
            and not self._cut(m.from_id, m.to_id)
            and not (self._loss_pct and self._net_rng.random() * 100 < self._loss_pct)
        )
        self._note(f"snapshot_done {m.from_id}->{m.to_id} index={m.snapshot_index} ok={ok}")
        if ok:
            assert follower.core is not None
            follower.staged[(m.snapshot_index, m.snapshot_term)] = hashes
            follower.core.step(m)
            self._after(follower)
        if report and leader.up and leader.incarnation == incarnation:
            assert leader.core is not None
            leader.core.report_snapshot(m.to_id, ok, m.snapshot_index)
            self._after(leader)

    def _on_release(self, payload: tuple[str, int, int]) -> None:
        """The linger of a node's held commit notices is over."""
        nid, incarnation, seq = payload
        node = self.nodes[nid]
        if not node.up or node.incarnation != incarnation:
            return
        if not node.release_pending or seq != node.release_seq:
            return  # cancelled: a Ready said no notice is held any more
        assert node.core is not None
        node.release_pending = False
        self._note(f"release {nid}")
        node.core.release_notices()
        self._after(node)

    def _send_all(self, node: _Node, messages: Sequence[Message]) -> bool:
        """Send ``messages``; True when the node then crashed (crash_next_voter armed)."""
        voted = False
        for m in messages:
            if isinstance(m, VoteResponse) and m.granted and not m.pre_vote:
                voted = True
                key = (m.from_id, m.term)
                other = self._votes.setdefault(key, m.to_id)
                if other != m.to_id:
                    raise Violation(
                        "vote_once", f"{m.from_id} voted for {other} and {m.to_id} in term {m.term}"
                    )
            self._send(m)
        if voted and self._armed_crash_voter and not node.damaged:
            # The voter dies the moment its vote is out: whatever it had not persisted by
            # then is gone.
            self._armed_crash_voter = False
            self._crash(node)
            restart_at = self.now + 1 + int(self._net_rng.random() * 5)
            self._push(restart_at, _FAULT, FaultEvent(restart_at, "restart", target=node.id))
            return True
        return False

    def _cut(self, a: str, b: str) -> bool:
        """Whether the link a -> b drops everything: a partition, or the minority a forgetful
        fault keeps cut off whatever other partitions come and go."""
        pair = (a, b)
        return pair in self._blocked or pair in self._lag_blocked

    def _send(self, m: Message) -> None:
        rand = self._net_rng.random
        if self._cut(m.from_id, m.to_id):
            return
        if self._loss_pct and rand() * 100 < self._loss_pct:
            return
        max_delay = self.params.net_delay_max_ms
        delay = 1 + int(rand() * max_delay)
        if rand() < 0.02:
            delay += 20 + int(rand() * 130)  # a straggler: heavy reordering
        self._push(self.now + delay, _DELIVER, m)
        if self.params.dup_pct and rand() * 100 < self.params.dup_pct:
            self._push(self.now + 1 + int(rand() * 3 * max_delay), _DELIVER, m)

    def _after(self, node: _Node) -> None:
        """Checks after a node's core ran, then start persisting its next Ready."""
        core = node.core
        assert core is not None
        log = node.log
        if log.truncated:
            self._check_truncations(node)
        if core.role is Role.LEADER:
            term = core.term
            if node.seen_leader_term != term:
                node.seen_leader_term = term
                self._on_new_leader(node, term)
            # The leader's commit may run ahead of its own disk (a majority of followers
            # persisted it first): commit_index counts only what its stored log holds.
            commit = core.commit_index
            mark = self._commit_marks.get(term)
            if commit > 0 and (mark is None or mark[0] < commit):
                h = log.prefix_hash(commit)
                self._commit_marks[term] = (commit, h)
                if not self._commit_at or commit > self._commit_at[-1]:
                    self._commit_at.append(commit)
                    self._commit_voters.append(core.conf_state.voters)
                self._check_electable_hold(
                    commit,
                    h,
                    core.conf_state.voters,
                    f"{node.id} committed {commit} in term {term}",
                )
        if node.pending is None and core.has_ready():
            rd = node.pending = core.ready()
            if rd.notices_held and not node.release_pending:
                node.release_pending = True
                node.release_seq += 1
                at = self.now + COMMIT_NOTICE_LINGER_MS
                self._push(at, _RELEASE, (node.id, node.incarnation, node.release_seq))
            elif not rd.notices_held:
                node.release_pending = False  # cancels the scheduled call
            if rd.snapshot_requests:
                self._send_snapshots(node, rd.snapshot_requests)
            for m in rd.early_messages:
                self._send(m)
            if self._send_before_persist and self._send_all(node, rd.messages):
                return  # MUTATION: the acks and votes went out before the persist
            self._push(
                self.now + int(self._net_rng.random() * 4), _PERSIST, (node.id, node.incarnation)
            )

    def _check_truncations(self, node: _Node) -> None:
        """A member never removes a committed entry from its log (it may remove entries that
        differ from the committed ones at the same index)."""
        for index, removed in node.log.truncated:
            hist_hash = self._history_hash
            if node.damaged and index < len(hist_hash) and removed[0] != hist_hash[index]:
                continue  # a damaged copy of committed entries, cut to be repaired
            if index <= node.max_applied:
                raise Violation(
                    "committed_lost",
                    f"{node.id} truncated index {index} <= its applied {node.max_applied}",
                )
            hist_hash = self._history_hash
            if index < len(hist_hash) and removed and removed[0] == hist_hash[index]:
                raise Violation("committed_lost", f"{node.id} truncated committed index {index}")
            for t, (c, h) in self._commit_marks.items():
                if index <= c < index + len(removed) and removed[c - index] == h:
                    raise Violation(
                        "committed_lost",
                        f"{node.id} truncated from {index}, removing index {c} committed "
                        f"in term {t}",
                    )
        node.log.truncated.clear()

    def _check_electable_hold(self, index: int, h: int, voters: frozenset[str], why: str) -> None:
        """Any voter (of the committing leader's configuration) whose log is at least as up
        to date as a majority of the voters' could win an election right now, so it must
        already hold every committed entry (leader completeness for every reachable leader,
        not only the ones that happen). One change at a time: every majority of the next
        configuration overlaps one of this."""
        quorum = len(voters) // 2 + 1
        # A repairing voter neither campaigns nor votes (docs/RAFT.md section 11).
        keys = {
            nid: (n.log.last_term(), n.log.last_index())
            for nid, n in self.nodes.items()
            if nid in voters and not self._repairing(n)
        }
        for nid, node in self.nodes.items():
            if not node.up or nid not in keys or node.damaged:
                continue  # (a damaged member is checked by _damage_pending instead)
            log = node.log
            if index <= log.last_index() and log.prefix_hash(index) == h:
                continue
            mine = keys[nid]
            if sum(1 for k in keys.values() if k <= mine) >= quorum:
                raise Violation(
                    "leader_completeness",
                    f"{nid} could be elected (log {mine[1]}/{mine[0]}) but lacks committed index "
                    f"{index} ({why})",
                )

    @staticmethod
    def _repairing(node: _Node) -> bool:
        """Whether ``node`` is in the repair state (a node that is down: whether it would
        start in it, its log ending below its promise)."""
        if node.core is not None:
            return node.core.repairing
        return node.log.promise_damaged or node.log.last_index() < node.log.promised

    def _on_new_leader(self, node: _Node, term: int) -> None:
        other = self._leaders.get(term)
        if other is not None and other != node.id:
            raise Violation("election_safety", f"two leaders in term {term}: {other} and {node.id}")
        self._leaders[term] = node.id
        self._note(f"leader {node.id} term={term} last={node.log.last_index()}")
        if self._armed_isolate_leader:
            self._armed_isolate_leader = False
            self._blocked = blocked_links("isolate", ((node.id,),), self.ids)
            self._note(f"isolate new leader {node.id}")
        if self._armed_member is not None:
            f, self._armed_member = self._armed_member, None
            self._on_member(f)
        log = node.log
        for t, (index, h) in self._commit_marks.items():
            if t < term and (index > log.last_index() or log.prefix_hash(index) != h):
                raise Violation(
                    "leader_completeness",
                    f"leader {node.id} of term {term} lacks index {index} committed in term {t}",
                )

    def _apply(self, node: _Node, e: Entry) -> None:
        if e.index != node.applied + 1:
            raise Violation("apply_order", f"{node.id} applied {e.index} after {node.applied}")
        node.applied = e.index
        node.max_applied = max(node.max_applied, e.index)
        hist = self._history
        if e.index < len(hist):
            if hist[e.index] != (e.term, e.type, e.body):
                raise Violation(
                    "state_machine_safety",
                    f"{node.id} applied index={e.index} term={e.term} but term="
                    f"{hist[e.index][0]} was committed there",
                )
        else:
            assert e.index == len(hist)
            hist.append((e.term, e.type, e.body))
            hh = self._history_hash
            hh.append(hash((hh[-1], e.term, e.type, e.body)))  # the same chain as MemLog's
        acc = node.accepted.pop(e.index, None)
        if acc is not None and acc[0] == e.term:
            self._acked[e.index] = (e.term, acc[1])
            if self._healed_at is not None and acc[2] >= self._healed_at:
                self._live = True
                assert node.core is not None
                # The configuration that committed it: every acknowledged entry below it is
                # durable on a majority of its voters (log matching).
                self._final_voters = self._voters_that_committed(e.index)
                self._note(f"live index={e.index}")

    def _voters_that_committed(self, index: int) -> frozenset[str]:
        """The voters of the leader whose commit first reached ``index``."""
        at = bisect.bisect_left(self._commit_at, index)
        assert at < len(self._commit_at), f"{index} applied, never seen committed"
        return self._commit_voters[at]

    def _leader(self) -> _Node | None:
        best: _Node | None = None
        best_term = -1
        for nid in self.ids:
            core = self.nodes[nid].core
            if core is not None and core.role is Role.LEADER and core.term > best_term:
                best, best_term = self.nodes[nid], core.term
        return best

    def _on_client(self) -> None:
        rng = self._client_rng
        self._push(self.now + rng.randint(1, self.params.client_interval_max_ms), _CLIENT, None)
        target = self._leader()
        if target is None or rng.random() < 0.1:
            target = self.nodes[rng.choice(self.ids)]
        if not target.up:
            return
        core = target.core
        assert core is not None
        bodies = []
        for _ in range(rng.randint(1, 3)):
            self._next_body += 1
            bodies.append(b"p%d" % self._next_body)
        try:
            prop = core.propose(bodies)
        except (NotLeaderError, TransferInProgressError, BackPressureError, ProposalDroppedError):
            return
        for i, b in enumerate(bodies):
            target.accepted[prop.first_index + i] = (prop.term, b, self.now)
        self._note(f"propose {target.id} term={prop.term} {prop.first_index}..{prop.last_index}")
        self._after(target)

    def _resolve(self, target: str) -> str | None:
        if target == LEADER:
            leader = self._leader()
            return leader.id if leader is not None else None
        return target

    def _on_fault(self, f: FaultEvent) -> None:
        self._note(f"fault {f.describe()}")
        if f.kind == "partition":
            groups = tuple(
                tuple(r for r in (self._resolve(x) for x in g) if r is not None) for g in f.groups
            )
            if any(not g for g in groups):
                return
            self._blocked = blocked_links(f.shape, groups, self.ids)
        elif f.kind == "heal":
            self._blocked = set()
        elif f.kind == "loss":
            self._loss_pct = f.loss_pct
        elif f.kind == "isolate_next_leader":
            self._armed_isolate_leader = True
        elif f.kind == "crash_next_voter":
            self._armed_crash_voter = True
        elif f.kind == "crash":
            nid = self._resolve(f.target)
            if nid is not None:
                self._crash(self.nodes[nid])
        elif f.kind == "restart":
            for nid in self.ids if f.target == "all" else (f.target,):
                if not self.nodes[nid].up:
                    self._start(self.nodes[nid])
        elif f.kind == "forge":
            self._forge(f.shape, self._resolve(f.target))
        elif f.kind == "member":
            self._on_member(f)
        elif f.kind == "storage":
            self._on_storage(f)
        elif f.kind == "member_next_leader":
            self._armed_member = FaultEvent(f.at_ms, "member", f.shape, target=f.target)
        elif f.kind == "feature":
            self._on_feature(f)

    # ------------------------------------------------------------------ feature level

    def _on_feature(self, f: FaultEvent) -> None:
        """A node restarted on the previous release or on this one, or the operator asking
        the leader of the moment for a raise (faults.generate_features)."""
        if f.shape == "raise":
            self._raise()
            return
        node = self.nodes[f.target]
        if node.damaged:
            return  # (a damaged node is not crashed: see _crash)
        was_up = node.up
        self._crash(node)
        node.support = BASELINE_LEVEL if f.shape == "old" else FEATURE_LEVEL
        if was_up:
            self._start(node)

    def _raise(self) -> None:
        leader = self._leader()
        if leader is None or leader.core is None:
            return
        core = leader.core
        try:
            proposal = core.propose_feature_level(FEATURE_LEVEL)
        except (
            FeatureLevelError,
            ConfChangePendingError,
            NotLeaderError,
            TransferInProgressError,
        ) as exc:
            self._note(f"raise refused by {leader.id}: {exc.code}")
            return
        self.raises += 1
        self._note(f"raise to {FEATURE_LEVEL} by {leader.id} index={proposal.last_index}")
        reports = self._reports.get((leader.id, core.term), {})
        for nid in sorted(core.conf_state.members - {leader.id}):
            got = reports.get(nid)
            if got is None or max(got, BASELINE_LEVEL) < FEATURE_LEVEL:
                raise Violation(
                    "raise_without_reports",
                    f"{leader.id} raised the feature level to {FEATURE_LEVEL} in term "
                    f"{core.term}, but {nid} "
                    + ("never answered it in that term" if got is None else f"reported {got}"),
                )
        self._after(leader)

    def _check_persisted_levels(self, node: _Node, rd: Ready) -> None:
        """No node persists a configuration above the feature level its release supports."""
        levels = [
            (e.index, decode_conf(e.body, e.index).features)
            for e in rd.entries
            if e.type == EntryType.CONFIG
        ]
        snap_conf = rd.snapshot.config if rd.snapshot is not None else None
        if isinstance(snap_conf, ConfState):
            levels.append((snap_conf.index, snap_conf.features))
        for index, level in levels:
            if level > node.support:
                raise Violation(
                    "config_above_support",
                    f"{node.id} (supports level {node.support}) persists the configuration "
                    f"of index {index} at feature level {level}",
                )

    # ------------------------------------------------------------------ storage faults

    def _on_storage(self, f: FaultEvent) -> None:
        """A disk that forgets (faults.STORAGE_SHAPES); the node restarts 1-30 ms later."""
        rng = self._storage_rng
        if f.shape == "forgetful_lag":
            self._forgetful_lag()
            return
        if f.shape == "forgetful":
            target = self._forgetful()
            if target is None:
                return
        else:
            target = self.nodes.get(f.target)
            if target is None or not target.up:
                return
            self._crash(target)
            if f.shape == "lose_meta":
                target.log.lose_meta()
            else:
                self._rollback(target, target.log.last_index() - rng.randint(1, 40))
            if f.shape == "damage_promise":
                target.log.damage_promise()
        self.storage_faults += 1
        at = self.now + rng.randint(1, 30)
        self._push(at, _FAULT, FaultEvent(at, "restart", target=target.id))

    def _forgetful_lag(self) -> None:
        """Cut a minority of followers off: entries commit without them."""
        leader = self._leader()
        others = sorted(n for n in self.ids if leader is None or n != leader.id)
        lag = tuple(self._storage_rng.sample(others, min(len(others), (len(self.ids) - 1) // 2)))
        rest = tuple(n for n in self.ids if n not in lag)
        self._lag_blocked = blocked_links("halves", (lag, rest), self.ids)
        self._lagging = frozenset(lag)
        self._note(f"forgetful: cut off {','.join(lag)}")

    def _forgetful(self) -> _Node | None:
        """The follower that holds the most forgets back to what the cut-off ones hold, the
        leader (or, with none, the member that holds the most) crashes, the links heal:
        without promises, the forgetful node and the others elect a leader that lacks
        committed entries."""
        lagging = self._lagging
        live = sorted(
            (n for n in self.nodes.values() if n.up and n.id not in lagging),
            key=lambda n: (n.core is not None and n.core.role is Role.LEADER, n.log.last_index()),
            reverse=True,
        )
        if len(live) < 2 or not lagging:
            return None
        holder, target = live[0], live[1]
        floor = min(self.nodes[x].log.last_index() for x in lagging)
        self._crash(holder)
        self._crash(target)
        self._rollback(target, floor - self._storage_rng.randint(0, 3))
        self._blocked = set()
        self._lag_blocked = set()
        at = self.now + self._storage_rng.randint(50, 400)
        self._push(at, _FAULT, FaultEvent(at, "restart", target=holder.id))
        return target

    def _rollback(self, node: _Node, index: int) -> None:
        """``node`` (crashed) wakes up on a log put back to an older prefix of itself; its
        promise and its application's state survive (they live beside the store)."""
        log = node.log
        index = max(log.first_index() - 1, index)
        node.sm_floor = min(node.applied, max(index, log.promised))
        lost = log.rollback(index)
        # What the node itself applied and no longer holds is the fault's doing; the checks
        # of its own durability start again from what it still holds.
        node.max_applied = min(node.max_applied, index)
        self._note(f"rollback {node.id} to={index} lost={lost} promised={log.promised}")

    # ------------------------------------------------------------------ membership

    def _on_member(self, f: FaultEvent) -> None:
        """The operator asks the leader of the moment for one change (faults.MEMBER_ACTIONS);
        a refusal is what the core must say when the change is invalid or premature."""
        leader = self._leader()
        if leader is None or not leader.up:
            return
        core = leader.core
        assert core is not None
        change = self._member_change(f, core.conf_state, leader.id)
        if change is None:
            return
        try:
            core.propose_conf_change(change)
        except TransferInProgressError:
            if f.target == LEADER:  # the leader hands over first: retry on the next one
                at = self.now + REMOVE_RETRY_MS
                self._push(at, _FAULT, FaultEvent(at, "member", "remove", target=leader.id))
            self._note(f"member {change.kind.value} {change.node_id}: hand-over first")
            return
        except (ConfChangeError, ConfChangePendingError, NotLeaderError) as exc:
            self._note(f"member {change.kind.value} {change.node_id} refused: {exc.code}")
            return
        if change.node_id not in self.nodes:
            self._join(change.node_id)
        self._note(f"member {change.kind.value} {change.node_id} by {leader.id}")
        self._after(leader)

    def _member_change(self, f: FaultEvent, conf: ConfState, leader: str) -> ConfChange | None:
        rng = self._member_rng
        if f.shape in ("add_learner", "add_voter"):
            if len(self.ids) - len(self.boot_ids) >= MAX_NEW_NODES:
                return None
            kind = ChangeKind.ADD_LEARNER if f.shape == "add_learner" else ChangeKind.ADD_VOTER
            return ConfChange(kind, f"n{len(self.ids)}")
        if f.shape == "promote":
            learners = sorted(conf.learners)
            return ConfChange(ChangeKind.PROMOTE, learners[0]) if learners else None
        target = leader if f.target == LEADER else f.target
        if not target:
            others = sorted(conf.voters - {leader})
            target = rng.choice(others) if others else ""
        if target in conf.voters and len(conf.voters) <= MIN_VOTERS_AFTER_REMOVAL:
            return None
        return ConfChange(ChangeKind.REMOVE, target) if target in conf.members else None

    def _join(self, nid: str) -> None:
        """A new node with an empty log, started to be added (it knows only itself)."""
        node = _Node(nid, MemLog(self._make_hook(nid)))
        node.boot_conf = joining(nid)
        self.nodes[nid] = node
        self.ids = (*self.ids, nid)
        self._start(node)

    def _forge(self, kind: str, target: str | None) -> None:
        """Deliver one message a hostile peer built to ``target`` (see faults.FORGERIES)."""
        if target is None or not self.nodes[target].up:
            return
        node = self.nodes[target]
        core = node.core
        assert core is not None
        rng = self._forge_rng
        others = [x for x in self.ids if x != target]
        last = core.last_index  # the core's log: its unstable tail included
        m: Message
        if kind == "ack_beyond_last":
            if core.role is not Role.LEADER:
                return
            match = last + 1 + rng.randrange(4)
            m = AppendResponse(
                rng.choice(others), target, core.term, True, match_index=match, last_log_index=match
            )
        elif kind == "max_term":
            m = AppendRequest(rng.choice(others), target, MAX_TERM, 0, 0, (), 0)
        elif kind == "non_member":
            if core.role is not Role.LEADER:
                return
            m = AppendResponse("intruder", target, core.term, True, match_index=last)
        elif kind == "timeout_now":
            liars = [x for x in others if x != core.leader_id]
            m = TimeoutNow(rng.choice(liars), target, core.term)
        else:
            # Only against a follower that knows this term's leader: adopting a forged leader
            # of a term without one is something no unauthenticated Raft can refuse.
            liars = [x for x in others if x != core.leader_id]
            if core.role is not Role.FOLLOWER or core.leader_id is None or not liars:
                return
            forged = Entry(core.term, last + 1, b"forged-%d" % self.now)
            prev_term = core.last_term
            m = AppendRequest(
                rng.choice(liars), target, core.term, last, prev_term, (forged,), last + 1
            )
        self._note(f"forge {kind} {_describe(m)}")
        core.step(m)
        self._after(node)

    def _damage(self) -> None:
        """Silently change one applied, committed entry of a follower (MemLog.damage)."""
        leader = self._leader()
        rng = self._damage_rng
        if self.params.deaf_leader_at_heal:
            return  # the leader hears no answer: no repair, and a second fault
        if leader is None or leader.core is None:
            return
        members = leader.core.conf_state.members  # a removed node gets no append to repair it
        followers = [
            n
            for nid, n in sorted(self.nodes.items())
            if n.up and n is not leader and nid in members
        ]
        if not followers:
            return
        node = rng.choice(followers)
        log = node.log
        assert node.core is not None
        if node.pending is not None or node.core.last_index != log.last_index():
            # Entries on their way to the log follow the old content: damage under a write
            # in flight is a torn write, the damage helper's case (issue 31 item 2).
            return
        hi = min(node.applied, log.flushed_index(), len(self._history) - 1)
        if hi < log.first_index():
            return
        index = rng.randint(log.first_index(), hi)
        if log.read(index).type != EntryType.NORMAL:
            return  # a NOOP or CONFIG entry: its body means something to the core
        log.damage(index, b"damaged-%d" % self.now)
        node.damaged = log.last_index()
        self._note(f"damage {node.id} index={index}")

    def _damage_pending(self) -> bool:
        """Whether a damaged member still holds other content than the committed history
        (clears the mark of those repaired)."""
        pending = False
        leader = self._leader()
        members = leader.core.conf_state.members if leader and leader.core else None
        for node in self.nodes.values():
            if node.damaged and members is not None and node.id not in members:
                node.damaged = 0  # removed since: no leader replicates to it any more
                self._note(f"damaged {node.id} removed from the group")
            if node.damaged:
                upto = min(node.damaged, len(self._history) - 1)
                if (
                    self._committed_prefix_differs(node)
                    or node.log.flushed_index() < upto
                    or node.log.prefix_hash(upto) != self._history_hash[upto]
                ):
                    pending = True
                else:
                    node.damaged = 0
                    self._note(f"repaired {node.id}")
        return pending

    def _committed_prefix_differs(self, node: _Node) -> bool:
        """Whether ``node``'s log up to its commit index differs from the committed history
        (by content: the prefix hash covers every entry's term, type and body)."""
        if node.core is None or node.core.pending_snapshot is not None:
            return False  # (a snapshot accepted, not installed yet: the log is not read)
        c = min(node.core.commit_index, len(self._history) - 1)
        if c < node.log.first_index() - 1 or c > node.log.last_index():
            return False
        return node.log.prefix_hash(c) != self._history_hash[c]

    def _on_heal(self) -> None:
        self._healed_at = self.now
        self._blocked = set()
        self._lag_blocked = set()
        self._loss_pct = 0
        self._armed_isolate_leader = False  # triggered faults end with the fault phase too
        self._armed_crash_voter = False
        self._armed_member = None
        for nid in self.ids:
            if not self.nodes[nid].up:
                self._start(self.nodes[nid])
        if self._deaf_at_heal:
            leader = self._leader()
            if leader is not None:
                self._blocked = blocked_links("deaf", ((leader.id,),), self.ids)
                self._note(f"heal (leader {leader.id} stays deaf)")
                return
        self._note("heal")

    def _final_checks(self) -> None:
        if not self._live:
            raise Violation("liveness", "run ended before a proposal committed after healing")
        leader = self._leader()
        members = leader.core.conf_state.members if leader and leader.core else set(self.nodes)
        for node in self.nodes.values():
            # (A member removed from the group gets no append to repair a damaged copy.)
            if node.up and node.id in members and self._committed_prefix_differs(node):
                raise Violation(
                    "committed_prefix_differs",
                    f"{node.id}'s committed log differs by content from the committed history",
                )
        voters = self._final_voters
        quorum = len(voters) // 2 + 1
        for index, (term, body) in self._acked.items():
            holders = 0
            for n in self.nodes.values():
                if n.id not in voters:
                    continue
                if index < n.log.first_index():
                    # In the member's snapshot (compacted or installed): durable.
                    holders += n.log.prefix_hash(index) == self._history_hash[index]
                elif n.log.flushed_index() >= index:
                    e = n.log.read(index)
                    holders += e.term == term and e.body == body
            if holders < quorum:
                raise Violation(
                    "acked_lost",
                    f"acknowledged index {index} is durable on {holders} nodes only",
                )


def _describe(m: Message | InstallSnapshot) -> str:
    head = f"{type(m).__name__} {m.from_id}->{m.to_id} term={m.term}"
    if isinstance(m, InstallSnapshot):
        return f"{head} index={m.snapshot_index}/{m.snapshot_term}"
    if isinstance(m, AppendRequest):
        return (
            f"{head} prev={m.prev_log_index}/{m.prev_log_term} n={len(m.entries)} "
            f"commit={m.leader_commit}"
        )
    if isinstance(m, AppendResponse):
        if m.success:
            return f"{head} ok match={m.match_index}"
        return f"{head} reject at={m.rejected_index} conflict={m.conflict_index}/{m.conflict_term}"
    if isinstance(m, VoteRequest):
        return (
            f"{head} last={m.last_log_index}/{m.last_log_term} pre={int(m.pre_vote)} "
            f"transfer={int(m.leadership_transfer)}"
        )
    if isinstance(m, VoteResponse):
        return f"{head} granted={int(m.granted)} pre={int(m.pre_vote)} {m.reject_reason}"
    assert isinstance(m, TimeoutNow)
    return head


def run_seed(
    seed: int,
    nodes: int = 3,
    *,
    mutations: frozenset[str] = frozenset(),
    faults: Sequence[FaultEvent] | None = None,
    trace: bool = False,
) -> SimResult:
    return Simulation(seed, nodes, mutations=mutations, faults=faults, trace=trace).run()
