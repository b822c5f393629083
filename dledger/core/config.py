"""Configuration of one Raft member, and the core's named limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from dledger.core.errors import ConfigError
from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL

# Largest group the core accepts: Raft groups beyond 7 voters only add commit latency, and we
# deploy groups of 3, 5 or 7 (tolerating 1, 2 or 3 failed nodes).
MAX_GROUP_SIZE = 7

# Upper bound on entries in one propose() call, so one call cannot build an unbounded batch.
MAX_ENTRIES_PER_PROPOSAL = 10_000

# Upper bound on the bytes of committed entries handed out in one Ready, so a member that
# restarts with a long committed log applies it in bounded chunks rather than one huge list.
MAX_READY_COMMITTED_BYTES = 16 << 20

# Upper bound on the in-flight window per follower (config values above it are rejected): the
# leader keeps one int per in-flight append.
MAX_INFLIGHT_APPENDS_LIMIT = 4096

# Upper bound on the in-flight bytes per follower (config values above it are rejected): the
# leader's, the transport's and the follower's buffers hold up to this much per follower at
# once, and 1 GiB per follower is already more than a node of a 3-7 node group should spend.
MAX_INFLIGHT_BYTES_LIMIT = 1 << 30

# Default bytes of entry bodies in flight per follower (etcd's MaxInflightBytes). Without it
# 64 appends of 1 MiB (64 MiB per follower) sat in gRPC buffers, upb arenas and Python bytes
# on both sides whenever a lagging follower was caught up: the RssAnon peaks of issue 36.
# 8 MiB is far above the bandwidth-delay product of loopback or a LAN (1 Gbit/s x 1 ms is
# 125 KB), so it costs no throughput there (docs/PERFORMANCE.md "A deep backlog").
DEFAULT_MAX_INFLIGHT_BYTES = 8 << 20

# How long a held commit notice waits (in the driver's clock: the core has none) for the next
# append to carry its commit index instead. At one send in flight the client's next send
# follows the ack by a client round trip; when it comes later than the linger, the notice
# goes out and costs the leader a stream write and the follower a read and a Ready (each
# ~0.1-0.3 ms of CPU). With 2 ms, 0.8 notices per message (both followers together) went
# out on a loaded machine (sends 5 ms apart); with 10 ms ~0.06 (docs/PERFORMANCE.md "Commit
# notices at one in flight").
# It is also the longest a follower's apply lags the leader's commit when no append follows
# (the end of a burst; tick() releases them too), unless its answers say readers wait for its
# applies (long polls held there: AppendResponse.readers_waiting): its notices are not held.
COMMIT_NOTICE_LINGER_MS = 10

# Terms and indexes travel as uint64 but are Python ints in the core and i64 in some stores and
# tools: every term and index a peer sends must be <= MAX_TERM / MAX_INDEX (2^63 - 1), and this
# node never produces a term above MAX_TERM (it refuses to campaign at the bound instead).
MAX_TERM = (1 << 63) - 1
MAX_INDEX = (1 << 63) - 1

# Largest step by which a peer's message may raise this node's term. An honest group raises
# its term by one per election round (a few per second at worst, even without pre-vote), so
# 2^32 rounds is more than a century of non-stop failed elections; a forged message with a
# term near MAX_TERM would otherwise be adopted and leave the group unable to ever campaign.
MAX_TERM_JUMP = 1 << 32

# Test-only fault injections. Each one deliberately breaks one Raft rule so that the tests and
# the simulator can prove they notice. Never set them outside tests.
MUTATIONS = frozenset(
    {
        "vote_without_log_check",  # grant (pre-)votes without the up-to-date log check
        "commit_old_term_by_count",  # commit an entry of an earlier term by counting replicas
        "reply_before_persisting_vote",  # a vote for another node is never made durable
        "no_truncate_conflict",  # a follower keeps a conflicting suffix instead of truncating
        "leader_never_steps_down",  # check-quorum never deposes the leader
        "accept_ack_beyond_last",  # the leader counts an ack of an index it does not hold
        "conf_change_while_pending",  # a second membership change before the first commits
        "conf_change_before_term_commit",  # a change before the leader committed in its term
        "removed_member_votes",  # vote requests from non-voters (removed nodes) are answered
        "snapshot_out_of_order",  # a follower installs a snapshot not beyond its commit index
        "forget_promise",  # a log that ends below its promise is not repaired: it votes
        "skip_chain_check",  # logs are matched by (index, term) alone, as before dledger.chain
        "raise_without_reports",  # a feature level raise without every member's support report
    }
)


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Tunables of one member. Times are in ticks; the driver decides how long a tick is."""

    # A follower that hears nothing from a leader for a randomized [T, 2T) ticks campaigns.
    election_timeout_ticks: int = 10
    # The leader sends a heartbeat (empty append) to each follower that no append asking for
    # an answer reached for this long (under load the appends are the heartbeats).
    heartbeat_interval_ticks: int = 1
    # Appends in flight per follower in the replicate state (pipelining window).
    max_inflight_appends: int = 64
    # ... and at most about this many bytes of entry bodies in flight per follower: an append
    # goes only when its bodies fit in what is left, except when nothing is in flight (one
    # append, even of an entry bigger than this, always goes, alone).
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    # Bodies in one AppendRequest: about this many bytes (always at least one entry) ...
    max_append_batch_bytes: int = 1 << 20
    # ... and at most this many entries.
    max_append_batch_entries: int = 1024
    # Back-pressure: propose() refuses when uncommitted proposed bytes would exceed this.
    max_pending_proposal_bytes: int = 64 << 20
    # A leader that heard from no majority for an election timeout steps down; followers
    # that heard from a leader within the election timeout ignore (pre-)vote requests.
    check_quorum: bool = True
    # Candidates first ask for pre-votes without raising their term (Raft thesis 9.6).
    pre_vote: bool = True
    # When set, a leader that is not this member hands leadership to it once it is caught up.
    preferred_leader_id: str | None = None
    # The highest group feature level this member's release supports (docs/RAFT.md "Feature
    # level"): it reports it in every append answer and never raises the group above it.
    supported_feature_level: int = FEATURE_LEVEL
    # TEST ONLY: names from MUTATIONS that break Raft on purpose. Empty in production.
    mutations: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.election_timeout_ticks < 2:
            raise ConfigError(
                f"election_timeout_ticks must be >= 2, got {self.election_timeout_ticks}"
            )
        if not 1 <= self.heartbeat_interval_ticks < self.election_timeout_ticks:
            raise ConfigError(
                "heartbeat_interval_ticks must be in [1, election_timeout_ticks), got "
                f"{self.heartbeat_interval_ticks}"
            )
        if not 1 <= self.max_inflight_appends <= MAX_INFLIGHT_APPENDS_LIMIT:
            raise ConfigError(
                f"max_inflight_appends must be in [1, {MAX_INFLIGHT_APPENDS_LIMIT}], got "
                f"{self.max_inflight_appends}"
            )
        if not 1 <= self.max_inflight_bytes <= MAX_INFLIGHT_BYTES_LIMIT:
            raise ConfigError(
                f"max_inflight_bytes must be in [1, {MAX_INFLIGHT_BYTES_LIMIT}], got "
                f"{self.max_inflight_bytes}"
            )
        if self.max_append_batch_bytes < 1:
            raise ConfigError(
                f"max_append_batch_bytes must be >= 1, got {self.max_append_batch_bytes}"
            )
        if self.max_append_batch_entries < 1:
            raise ConfigError(
                f"max_append_batch_entries must be >= 1, got {self.max_append_batch_entries}"
            )
        if self.max_pending_proposal_bytes < 1:
            raise ConfigError(
                f"max_pending_proposal_bytes must be >= 1, got {self.max_pending_proposal_bytes}"
            )
        if not BASELINE_LEVEL <= self.supported_feature_level <= FEATURE_LEVEL:
            raise ConfigError(
                f"supported_feature_level must be in [{BASELINE_LEVEL}, {FEATURE_LEVEL}] "
                f"(this release's levels), got {self.supported_feature_level}"
            )
        unknown = set(self.mutations) - MUTATIONS
        if unknown:
            raise ConfigError(f"unknown mutations {sorted(unknown)}; known: {sorted(MUTATIONS)}")
