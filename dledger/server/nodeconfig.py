"""What configures one DLedger member (:class:`NodeConfig`, checked when built) and what an
application plugs into it (:class:`StateMachine`; :class:`LogOnlyStateMachine` for a plain
log). The running member is :class:`dledger.server.node.DLedgerNode`, which re-exports these
names."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from dledger.core import ConfigError, RaftConfig, Role
from dledger.log import Entry, EntryType
from dledger.server.chaincheck import (
    DEFAULT_CHAIN_CHECK_INTERVAL_MS,
    MAX_CHAIN_CHECK_INTERVAL_MS,
    MIN_CHAIN_CHECK_INTERVAL_MS,
)
from dledger.server.membership import (
    MAX_SETTING_NAME_CHARS,
    MAX_SETTING_VALUE_CHARS,
    MAX_SHARED_SETTINGS,
)
from dledger.server.scrub import (
    DEFAULT_SCRUB_BYTES_PER_S,
    MAX_SCRUB_BYTES_PER_S,
    MAX_SCRUB_PASS_INTERVAL_S,
    MIN_SCRUB_BYTES_PER_S,
    MIN_SCRUB_PASS_INTERVAL_S,
    SCRUB_MIN_PASS_INTERVAL_S,
)
from dledger.server.snapshots import (
    DEFAULT_SNAPSHOT_BYTES_PER_S,
    MAX_SNAPSHOT_BYTES_PER_S,
    MIN_SNAPSHOT_BYTES_PER_S,
)
from dledger.storage import StoreConfig
from dledger.storage.retention import (
    DEFAULT_DELETE_WHEN,
    DEFAULT_EARLY_USED_PERCENT,
    DEFAULT_FILE_RESERVED_TIME_HOURS,
    DEFAULT_MAX_LAG_RETENTION_HOURS,
    check_early_used_percent,
)
from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.tls import TlsFiles

__all__ = [
    "DEFAULT_CLIENT_ENTRY_TYPES",
    "RETENTION_CHECK_INTERVAL_S",
    "LogOnlyStateMachine",
    "NodeConfig",
    "ServiceRegistrar",
    "StateMachine",
]

# How often a node checks whether retention may delete old segments (deletion itself happens
# only at the deleteWhen hours).
RETENTION_CHECK_INTERVAL_S = 60.0
# Entry types the log client service (DLedgerClient.Append) accepts by default: only plain
# entries. Types 0..15 are dledger's own and 16..255 the application's internal records, which
# the application proposes itself (DLedgerNode.propose) and must never take from outside.
DEFAULT_CLIENT_ENTRY_TYPES = frozenset({int(EntryType.NORMAL)})


class StateMachine(Protocol):
    """What the application (the broker) plugs into a node.

    Optionally it also has ``on_prefix_deleted(first_index: int) -> None``: called (in the
    event loop, between applies) after retention deleted the log's entries below
    ``first_index``, so the application can drop what it derived from them; and
    ``rewind(index: int) -> RewindOutcome | None``: roll the applied state back to ``index``
    (a Ready's ``rewind_to``: this member's copy of applied entries differed by content from
    its leader's, docs/RAFT.md section 13), or say how the state is to be rebuilt when it
    cannot (``dledger.rewind``; the node then restarts itself to do it,
    ``dledger.server.rewinds``). Without ``rewind`` such a repair ends the process (fail
    fast: the state machine holds what the damaged copy made); and ``check_formats() ->
    None``: called at start before the node touches its store or the application's files,
    raises an error whose ``code`` is FORMAT_TOO_NEW when one of the application's files was
    written by a newer release (the node then refuses to start, nothing changed); and
    ``durable_index() -> int``: the applied index of the state the application has on disk
    (what a restart opens, applying the log after it), when that can be behind what it
    applied in memory: retention never deletes entries above it (without it, retention
    keeps the entries above the applied index only), with ``save_state() -> None`` to
    start writing that state at the applied index (called between applies, by retention,
    when the state on disk is behind: an idle application would otherwise never catch up);
    and
    ``on_feature_level(level: int, index: int) -> None``: the group's feature level (docs/RAFT.md
    "Feature level"), called once at start with the level of the log (``index``: its CONFIG
    entry, 0 for a group that never raised one) and again, between applies, when a committed
    CONFIG entry at ``index`` raises it. The application gates what it proposes and the
    formats of its own files on it (``node.feature_level()``), never what it applies."""

    def applied_index(self) -> int:
        """Index up to which the application's own durable state already includes entries."""
        ...

    def apply(self, entries: Sequence[Entry]) -> None:
        """Committed entries, in log order, each exactly once per process lifetime."""
        ...

    def on_role_change(self, role: Role, term: int, leader_id: str | None) -> None: ...


# Adds servicers to a server and returns the full names of the services it added.
ServiceRegistrar = Callable[[grpc.aio.Server], Sequence[str]]


class LogOnlyStateMachine:
    """The state machine of a plain DLedger group: the replicated log is the whole state."""

    def __init__(self) -> None:
        self.last_applied = 0

    def applied_index(self) -> int:
        return 0

    def apply(self, entries: Sequence[Entry]) -> None:
        self.last_applied = entries[-1].index

    def rewind(self, index: int) -> None:
        """Entries above ``index`` were replaced (a content repair): the log is the state."""
        self.last_applied = min(self.last_applied, index)

    def on_role_change(self, role: Role, term: int, leader_id: str | None) -> None:
        pass


@dataclass(frozen=True, slots=True)
class NodeConfig:
    group: str
    self_id: str
    peers: Mapping[str, str]  # node id -> peer RPC address host:port (this node included)
    client_host: str
    client_port: int
    store_dir: str
    store: StoreConfig = field(default_factory=StoreConfig)
    tick_ms: int = 50
    heartbeat_interval_ms: int = 100
    election_timeout_ms: int = 500
    append_timeout_ms: int = 3000
    preferred_leader_id: str | None = None
    # Client address peers and clients are told to use ("" = client_addr, the bound one); a
    # test harness sets it to a proxy in front of the client port.
    advertised_client_addr: str = ""
    # Host the client and peer ports bind ("" = client_host): 0.0.0.0 or :: for every
    # interface, or one interface's address, while client_host and this node's entry in
    # peers stay the addresses others dial (the broker's bindAddress and brokerIP1).
    bind_host: str = ""
    # Client addresses of the other members (node id -> host:port), from configuration: what
    # NOT_LEADER redirects and Metadata name as the leader's address. Never learnt from peers
    # (a peer stream's metadata is not authenticated). A member missing here is named by id
    # only (addr= empty) and clients find it through the other nodes.
    peer_client_addrs: Mapping[str, str] = field(default_factory=dict)
    # Entry types DLedgerClient.Append accepts (see DEFAULT_CLIENT_ENTRY_TYPES).
    client_entry_types: frozenset[int] = DEFAULT_CLIENT_ENTRY_TYPES
    # TEST ONLY (jepsen_like's "checker has teeth" run): acknowledge an Append as soon as the
    # leader appended it locally, before a majority holds it. Breaks promise 1; never in prod.
    unsafe_ack_before_replication: bool = False
    # Retention (RocketMQ's fileReservedTime / deleteWhen, dledger.storage.retention): old
    # segments are deleted at these hours once this old, and not while a member still needs
    # them unless they are older than max_lag_retention_hours (maxLagRetentionHours): that
    # member is then caught up by a snapshot.
    file_reserved_time_hours: int = DEFAULT_FILE_RESERVED_TIME_HOURS
    delete_when: str = DEFAULT_DELETE_WHEN
    max_lag_retention_hours: int = DEFAULT_MAX_LAG_RETENTION_HOURS
    retention_check_interval_s: float = RETENTION_CHECK_INTERVAL_S
    # Early retention (broker.conf diskMaxUsedSpaceRatio, RocketMQ's meaning): while the store's
    # file system is at least this % used, retention deletes expired segments at once, not
    # only at delete_when's hours; every other rule of retention still holds. 0: off.
    # Retunable while the node runs (DLedgerNode.retune).
    retention_early_used_percent: int = DEFAULT_EARLY_USED_PERCENT
    # TLS (broker.conf tlsEnable and tlsServer*Path). None: every port plaintext. Otherwise the
    # client port speaks TLS (no client certificate asked), the peer port mutual TLS (only a
    # certificate signed by tls.ca_path naming a member of this group is served, and the
    # sender's id is the certificate's), and this node's outgoing peer streams present
    # tls.cert_path, its member certificate.
    tls: TlsFiles | None = None
    # With tls: an extra plaintext client port bound to 127.0.0.1 (0: none), for local tools.
    plaintext_client_port: int = 0
    # The peer socket (dledger.server.peersock; broker keys dLegerPeerSocketPort and
    # dLegerPeerSocketEnable): the Raft message stream on a TCP port of its own, bound on
    # bind_host like the peer port, mutual TLS with tls. 0: not offered (peers use the gRPC
    # stream to this node). With peer_socket_enable False this node neither offers it nor
    # uses its peers' sockets.
    peer_socket_port: int = 0
    peer_socket_enable: bool = True
    # Join an existing group through this member's peer address (broker key
    # dLegerJoinAddr): a node started with an empty store asks the group to add it as a
    # learner, and takes its configuration from the log (docs/CLUSTER.md). "": no joining.
    join_addr: str = ""
    # snapshotTransferBytesPerSec: the pace of this node's snapshot transfers, all followers
    # together (dledger.server.snapshots.Pacer), so that catching a member up does not
    # starve the leader's clients.
    snapshot_bytes_per_s: int = DEFAULT_SNAPSHOT_BYTES_PER_S
    # scrubBytesPerSec: the pace of the background scrubber that re-reads and checks the
    # whole log (dledger.server.scrub); 0 turns it off (benchmarks only).
    scrub_bytes_per_s: int = DEFAULT_SCRUB_BYTES_PER_S
    # scrubMinPassIntervalSeconds: a new scrub pass starts at most this often.
    scrub_min_pass_interval_s: int = SCRUB_MIN_PASS_INTERVAL_S
    # chainCheckIntervalMs: how often the leader compares its chain with each peer's at a
    # common committed index (dledger.server.chaincheck, docs/RAFT.md section 13); 0: off.
    chain_check_interval_ms: int = DEFAULT_CHAIN_CHECK_INTERVAL_MS
    # Settings every member must share, name -> value as the operator sets them (the broker:
    # its dedup window, which every member's apply uses). A Join from a node whose settings
    # differ is refused (INCOMPATIBLE_STORE): it could never catch up. The log's segment size
    # is always one of them, named segment_size_setting (the broker: mappedFileSizeCommitLog):
    # a snapshot carries the segments as they are and replicas share data positions.
    shared_settings: Mapping[str, str] = field(default_factory=dict)
    segment_size_setting: str = "segment_size_bytes"
    # Where this member's promise file lives (broker key dLegerPromisePath; docs/RAFT.md
    # section 11): "" = beside the store directory, ``{store_dir}.promise``. Apart from the
    # store so that a store rolled back or replaced under this id is noticed; on another
    # volume it also survives the loss of the store's volume.
    promise_path: str = ""
    # The highest group feature level this node supports (docs/RAFT.md "Feature level"): it
    # reports it to its leader, refuses to start on a log or store above it, and stops when
    # its leader sends a CONFIG entry above it. The broker passes min(dledger's, its own).
    supported_feature_level: int = FEATURE_LEVEL

    def __post_init__(self) -> None:
        if self.self_id not in self.peers:
            raise ConfigError(f"self_id {self.self_id!r} must be one of the peers")
        if not 0 < self.tick_ms <= self.heartbeat_interval_ms:
            raise ConfigError("tick_ms must be > 0 and <= heartbeat_interval_ms")
        if self.election_timeout_ms < 2 * self.heartbeat_interval_ms:
            raise ConfigError("election_timeout_ms must be >= 2 * heartbeat_interval_ms")
        unknown = set(self.peer_client_addrs) - set(self.peers)
        if unknown:
            raise ConfigError(f"peer_client_addrs names ids that are not peers: {sorted(unknown)}")
        if not all(
            0 <= t <= 255 and t not in (EntryType.NOOP, EntryType.CONFIG)
            for t in self.client_entry_types
        ):
            raise ConfigError(
                "client_entry_types: NOOP, CONFIG and values outside 0..255 cannot be appended"
            )
        if not MIN_SNAPSHOT_BYTES_PER_S <= self.snapshot_bytes_per_s <= MAX_SNAPSHOT_BYTES_PER_S:
            raise ConfigError(
                f"snapshot_bytes_per_s {self.snapshot_bytes_per_s} is outside "
                f"[{MIN_SNAPSHOT_BYTES_PER_S}, {MAX_SNAPSHOT_BYTES_PER_S}]"
            )
        check_early_used_percent(self.retention_early_used_percent)
        if self.scrub_bytes_per_s and not (
            MIN_SCRUB_BYTES_PER_S <= self.scrub_bytes_per_s <= MAX_SCRUB_BYTES_PER_S
        ):
            raise ConfigError(
                f"scrub_bytes_per_s {self.scrub_bytes_per_s} is outside "
                f"[{MIN_SCRUB_BYTES_PER_S}, {MAX_SCRUB_BYTES_PER_S}] (0: off)"
            )
        if not (
            MIN_SCRUB_PASS_INTERVAL_S <= self.scrub_min_pass_interval_s <= MAX_SCRUB_PASS_INTERVAL_S
        ):
            raise ConfigError(
                f"scrub_min_pass_interval_s {self.scrub_min_pass_interval_s} is outside "
                f"[{MIN_SCRUB_PASS_INTERVAL_S}, {MAX_SCRUB_PASS_INTERVAL_S}]"
            )
        if self.chain_check_interval_ms and not (
            MIN_CHAIN_CHECK_INTERVAL_MS
            <= self.chain_check_interval_ms
            <= MAX_CHAIN_CHECK_INTERVAL_MS
        ):
            raise ConfigError(
                f"chain_check_interval_ms {self.chain_check_interval_ms} is outside "
                f"[{MIN_CHAIN_CHECK_INTERVAL_MS}, {MAX_CHAIN_CHECK_INTERVAL_MS}] (0: off)"
            )
        if not BASELINE_LEVEL <= self.supported_feature_level <= FEATURE_LEVEL:
            raise ConfigError(
                f"supported_feature_level {self.supported_feature_level} is outside "
                f"[{BASELINE_LEVEL}, {FEATURE_LEVEL}] (this release's levels)"
            )
        self._check_tls()
        self._check_shared_settings()
        if self.promise_path and Path(self.promise_path).resolve().is_relative_to(
            Path(self.store_dir).resolve()
        ):
            raise ConfigError(
                f"promise_path {self.promise_path} is inside the store directory "
                f"{self.store_dir}: it must survive the store being rolled back or replaced"
            )

    def _check_shared_settings(self) -> None:
        named = self.all_shared_settings()
        if len(named) != len(self.shared_settings) + 1 or len(named) > MAX_SHARED_SETTINGS:
            raise ConfigError(
                f"shared_settings: at most {MAX_SHARED_SETTINGS - 1}, and not "
                f"{self.segment_size_setting!r} (the node adds it)"
            )
        if any(
            not 0 < len(k) <= MAX_SETTING_NAME_CHARS or len(v) > MAX_SETTING_VALUE_CHARS
            for k, v in named.items()
        ):
            raise ConfigError(
                f"shared_settings: names of 1 to {MAX_SETTING_NAME_CHARS} characters, values "
                f"of at most {MAX_SETTING_VALUE_CHARS}"
            )

    def all_shared_settings(self) -> dict[str, str]:
        """What a Join sends and the member asked compares: the segment size and the rest."""
        segment = {self.segment_size_setting: str(self.store.segment_size_bytes)}
        return {**self.shared_settings, **segment}

    def _check_tls(self) -> None:
        tls = self.tls
        if tls is not None and (tls.cert_path is None or tls.ca_path is None):
            raise ConfigError("tls needs a certificate, its key and the CA of the members")
        if not 0 <= self.plaintext_client_port <= 65535:
            raise ConfigError(f"plaintext_client_port {self.plaintext_client_port} is not a port")
        if self.plaintext_client_port and tls is None:
            raise ConfigError("plaintext_client_port needs tls (the client port is plaintext)")
        if self.plaintext_client_port == self.client_port:
            raise ConfigError("plaintext_client_port must differ from client_port")
        self._check_socket_port()

    def _check_socket_port(self) -> None:
        port = self.peer_socket_port
        if not 0 <= port <= 65535:
            raise ConfigError(f"peer_socket_port {port} is not a port")
        tail = self.peers[self.self_id].rpartition(":")[2]
        peer_port = int(tail) if tail.isdigit() else 0
        if port and port in (self.client_port, self.plaintext_client_port, peer_port):
            raise ConfigError(f"peer_socket_port {port} must differ from the client and peer ports")

    @property
    def client_security(self) -> ClientSecurity:
        """How this node reaches the group's ports: with its member certificate under TLS."""
        return PLAINTEXT if self.tls is None else ClientSecurity(tls=self.tls)

    @property
    def client_addr(self) -> str:
        return f"{self.client_host}:{self.client_port}"

    def bind_addr(self, port: int) -> str:
        """Where a port of this node binds: ``bind_host`` (or client_host) and ``port``."""
        host = self.bind_host or self.client_host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def public_client_addr(self) -> str:
        return self.advertised_client_addr or self.client_addr

    def raft_config(self) -> RaftConfig:
        return RaftConfig(
            election_timeout_ticks=max(2, self.election_timeout_ms // self.tick_ms),
            heartbeat_interval_ticks=max(1, self.heartbeat_interval_ms // self.tick_ms),
            preferred_leader_id=self.preferred_leader_id,
            supported_feature_level=self.supported_feature_level,
        )
