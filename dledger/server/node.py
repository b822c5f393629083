"""One DLedger member as an asyncio process: drives the Raft core with real time, disk and gRPC.

The node follows the core's driver contract (``dledger.core`` docstring) in a single task, the
*ready loop*: send the early messages, persist the Ready's hard state, truncation and entries
in one job in a thread (the loop keeps taking messages and proposals meanwhile, into the core's
unstable tail, and the next job writes all of them: group commit), then send the other
messages, apply committed entries, ``advance``. Nothing on the event loop waits for the disk.
Commit notices a Ready holds are released by one ``loop.call_later`` timer of
COMMIT_NOTICE_LINGER_MS (at most one pending, cancelled when a Ready says none is held).
Peer RPC and client RPC listen on separate ports so that either can be cut off on its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import itertools
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NoReturn, Protocol

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger import failpoints
from dledger.appsnapshot import AppSnapshot
from dledger.chain import agree
from dledger.chain import fmt as chain_fmt
from dledger.core import (
    COMMIT_NOTICE_LINGER_MS,
    MAX_ENTRIES_PER_PROPOSAL,
    ChangeKind,
    ConfChange,
    ConfigError,
    ConfState,
    InstallSnapshot,
    Proposal,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    SnapshotMeta,
)
from dledger.core.membership import MEMBER_ID_RE, joining
from dledger.log import (
    CorruptLogError,
    DLedgerError,
    Entry,
    EntryType,
    HardState,
    IndexOutOfRangeError,
    LogCompactedError,
    persist,
)
from dledger.server import errormap
from dledger.server.chaincheck import (
    DEFAULT_CHAIN_CHECK_INTERVAL_MS,
    MAX_CHAIN_CHECK_INTERVAL_MS,
    MIN_CHAIN_CHECK_INTERVAL_MS,
    chain_check_loop,
    peer_asker,
)
from dledger.server.convert import MAX_NODE_ID_CHARS, from_pb, validate
from dledger.server.errors import ProposalLostError, StartError
from dledger.server.goodcopy import GoodCopyCheck, holdings_asker, holdings_of, to_response
from dledger.server.health import chain_or_none, health_fields
from dledger.server.logroom import LogRoom
from dledger.server.members import Refused, stream_sender
from dledger.server.membership import (
    JOIN_RETRY_MS,
    MAX_SETTING_NAME_CHARS,
    MAX_SETTING_VALUE_CHARS,
    MAX_SHARED_SETTINGS,
    AddressBook,
    IncompatibleStoreError,
    RefusedJoins,
    load_conf,
    save_conf,
)
from dledger.server.metrics import RaftStats
from dledger.server.promises import (
    PromiseError,
    held,
    hold_promise,
    promise_ahead_entries,
    promise_file,
    recover,
    write_promise,
    write_promise_ahead,
)
from dledger.server.scrub import (
    DEFAULT_SCRUB_BYTES_PER_S,
    MAX_SCRUB_BYTES_PER_S,
    MIN_SCRUB_BYTES_PER_S,
    Scrubber,
)
from dledger.server.snapshots import (
    DEFAULT_SNAPSHOT_BYTES_PER_S,
    MAX_SNAPSHOT_BYTES_PER_S,
    MIN_SNAPSHOT_BYTES_PER_S,
    SnapshotReceiver,
    SnapshotRefused,
    SnapshotSender,
    clear_staging,
    finish_install,
    install_app,
    pending_install,
    refused_status,
)
from dledger.server.transport import SERVER_OPTIONS, LinkStats, PeerTransport
from dledger.storage import (
    DiskFullError,
    FlushDiskType,
    SegmentedLogStore,
    StoreConfig,
    codec,
    damage,
)
from dledger.storage.promise import PromiseWriter, read_promise
from dledger.storage.retention import (
    DEFAULT_DELETE_WHEN,
    DEFAULT_FILE_RESERVED_TIME_HOURS,
    DEFAULT_MAX_LAG_RETENTION_HOURS,
)
from dledger.storage.store import META_FILE
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_aio_channel
from mqsecurity.refusals import REFUSALS
from mqsecurity.tls import TlsFiles
from prockit import fatal as fatal_mod
from prockit.fatal import fatal, spawn
from rpckit import decodeguard, status
from rpckit.callguard import CallGuard, GuardInterceptor
from rpckit.serving import add_health_and_reflection, bind, bind_insecure

logger = logging.getLogger(__name__)

# Bytes of entry bodies one Get returns at most (a client pages through larger ranges).
GET_MAX_BYTES = 4 << 20
# Entries one Get returns at most.
GET_MAX_COUNT = 10_000
# How often the applied/commit checkpoint is written while entries are being applied.
CHECKPOINT_INTERVAL_MS = 1000
# How often a node checks whether retention may delete old segments (deletion itself happens
# only at the deleteWhen hours), and how long it waits for the leader's view of the members.
RETENTION_CHECK_INTERVAL_S = 60.0
RETENTION_RPC_TIMEOUT_S = 3.0
# Characters of a client-supplied name (group) or peer metadata echoed in an error detail:
# details stay far below gRPC's metadata limit whatever the request carried.
ECHO_MAX_CHARS = 64
# Entry types the log client service (DLedgerClient.Append) accepts by default: only plain
# entries. Types 0..15 are dledger's own and 16..255 the application's internal records, which
# the application proposes itself (DLedgerNode.propose) and must never take from outside.
DEFAULT_CLIENT_ENTRY_TYPES = frozenset({int(EntryType.NORMAL)})
# Peer messages dropped by the node before the core (keys of DLedgerNode.dropped(), with the
# core's DROP_* reasons): a stream refused at its start, a message claiming another sender than
# its stream, a message malformed in itself, a batch nested in a batch.
DROP_STREAM_REFUSED = "stream_refused"
DROP_SENDER_MISMATCH = "sender_mismatch"
DROP_INVALID = "invalid"
DROP_NESTED_BATCH = "nested_batch"
# A persist job refused because the disk is full (the store writes nothing of the append and
# nothing of the Ready that depends on it is sent; the job is retried every PERSIST_RETRY_MS
# until space returns: docs/STORAGE.md).
DROP_DISK_FULL = "disk_full"
# How long the ready loop waits before it retries a persist job the full disk refused: short
# enough that writes resume quickly once space is freed, long enough not to spin.
PERSIST_RETRY_MS = 100
# A Get that met a damaged entry answers DATA_LOSS before the node restarts to repair: time
# for the answer to leave.
DAMAGE_ANSWER_GRACE_S = 0.2
# Where the extra plaintext client port (NodeConfig.plaintext_client_port) listens: local
# tools only, never the network.
PLAINTEXT_CLIENT_HOST = "127.0.0.1"


def _echo(text: str) -> str:
    """``text`` as it may appear in an error detail or a log line: bounded, repr-quoted."""
    return repr(text if len(text) <= ECHO_MAX_CHARS else text[:ECHO_MAX_CHARS] + "...")


def _disk_space(path: os.PathLike[str] | str) -> tuple[int, int]:
    """``Metadata``'s disk fields: the store's file system, total and free bytes (one
    ``statvfs``, about a microsecond); zeros when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0, 0
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


class StateMachine(Protocol):
    """What the application (the broker) plugs into a node.

    Optionally it also has ``on_prefix_deleted(first_index: int) -> None``: called (in the
    event loop, between applies) after retention deleted the log's entries below
    ``first_index``, so the application can drop what it derived from them; and
    ``rewind(index: int) -> None``: roll the applied state back to ``index`` (a Ready's
    ``rewind_to``: this member's copy of applied entries differed by content from its
    leader's, docs/RAFT.md section 13). Without it such a repair ends the process (fail
    fast: the state machine holds what the damaged copy made)."""

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
    # TLS (broker.conf tlsEnable and tlsServer*Path). None: every port plaintext. Otherwise the
    # client port speaks TLS (no client certificate asked), the peer port mutual TLS (only a
    # certificate signed by tls.ca_path naming a member of this group is served, and the
    # sender's id is the certificate's), and this node's outgoing peer streams present
    # tls.cert_path, its member certificate.
    tls: TlsFiles | None = None
    # With tls: an extra plaintext client port bound to 127.0.0.1 (0: none), for local tools.
    plaintext_client_port: int = 0
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
        if self.scrub_bytes_per_s and not (
            MIN_SCRUB_BYTES_PER_S <= self.scrub_bytes_per_s <= MAX_SCRUB_BYTES_PER_S
        ):
            raise ConfigError(
                f"scrub_bytes_per_s {self.scrub_bytes_per_s} is outside "
                f"[{MIN_SCRUB_BYTES_PER_S}, {MAX_SCRUB_BYTES_PER_S}] (0: off)"
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

    @property
    def client_security(self) -> ClientSecurity:
        """How this node reaches the group's ports: with its member certificate under TLS."""
        return PLAINTEXT if self.tls is None else ClientSecurity(tls=self.tls)

    @property
    def client_addr(self) -> str:
        return f"{self.client_host}:{self.client_port}"

    @property
    def public_client_addr(self) -> str:
        return self.advertised_client_addr or self.client_addr

    def raft_config(self) -> RaftConfig:
        return RaftConfig(
            election_timeout_ticks=max(2, self.election_timeout_ms // self.tick_ms),
            heartbeat_interval_ticks=max(1, self.heartbeat_interval_ms // self.tick_ms),
            preferred_leader_id=self.preferred_leader_id,
        )


@dataclass(order=True, slots=True)
class _Waiter:
    last_index: int
    seq: int
    term: int = field(compare=False)
    first_index: int = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class DLedgerNode:
    """A running member: call :meth:`start`, then :meth:`wait_closed` or :meth:`stop`."""

    def __init__(
        self,
        cfg: NodeConfig,
        state_machine: StateMachine | None = None,
        seed: int | None = None,
        client_services: Sequence[ServiceRegistrar] = (),
        call_guard: CallGuard | None = None,
        raft_stats: RaftStats | None = None,
    ) -> None:
        """``client_services`` add the application's gRPC services to the client port (each
        registrar adds its servicers and returns their full names for health/reflection);
        ``call_guard`` admits or refuses every client-port call (:mod:`rpckit.callguard`);
        ``raft_stats`` is measured into when the process serves metrics (None: nothing is)."""
        self.cfg = cfg
        self._call_guard = call_guard
        self._client_services = tuple(client_services)
        self.sm: StateMachine = LogOnlyStateMachine() if state_machine is None else state_machine
        self._seed = seed if seed is not None else random.randrange(1 << 62)
        self._wake_event = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._waiters: list[_Waiter] = []
        self._waiter_seq = itertools.count()
        self._book = AddressBook(
            cfg.peers, {**cfg.peer_client_addrs, cfg.self_id: cfg.public_client_addr}
        )
        self._conf_seen: ConfState | None = None
        # Called once when this node learns that the group removed it (the broker stops
        # registering with the NameServers).
        self.removed_listeners: list[Callable[[], None]] = []
        self._removed_told = False
        self._refused_joins = RefusedJoins()
        self._dropped: dict[str, int] = {}
        self._flush_pool = concurrent.futures.ThreadPoolExecutor(1, f"flush-{cfg.self_id}")
        # The promise file's writes beside the log's flush (one at a time, like the flush).
        self._promise_pool = concurrent.futures.ThreadPoolExecutor(1, f"promise-{cfg.self_id}")
        self._last_checkpoint_s = 0.0
        self._applied = 0
        self._leader_changed = asyncio.Event()
        # The one pending release_notices() call, while a Ready's commit notices are held.
        self._notice_release: asyncio.TimerHandle | None = None
        self.store: SegmentedLogStore
        self.core: RaftNode
        # The promise file (dledger.server.promises), set at start: its writer, the hard state
        # its copy must carry, and the highest index the core asked to promise.
        self._promises: PromiseWriter
        self._hard_state = HardState()
        self._promise_wanted = 0
        self._peer_server: grpc.aio.Server | None = None
        self._client_server: grpc.aio.Server | None = None
        self._transport: PeerTransport | None = None
        # Given when the process serves metrics (dledger.server.metrics): the append and
        # fsync histograms are fed only then.
        self.raft_stats = raft_stats
        # Snapshots (dledger.server.snapshots): transfers out (leader) and in (follower);
        # the store lock keeps retention off a store an install is replacing.
        self.snapshots_out = SnapshotSender(self)
        self.snapshots_in = SnapshotReceiver(self)
        self._store_lock = asyncio.Lock()
        # Application entries accepted but not stored yet, against the log's room.
        self._log_room = LogRoom(cfg.self_id)
        # Damage in the log (docs/STORAGE.md "Damage and repair"): what found it, how many
        # times, since this process started (the open's own finding included).
        self.corruption_found: dict[str, int] = {}
        # Chain mismatches the periodic chain check found, by peer id (docs/RAFT.md 13).
        self.chain_check_mismatches: dict[str, int] = {}
        self.scrubber: Scrubber | None = None
        self._damage_handled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.cfg
        self._loop = asyncio.get_running_loop()
        # Ports first: a busy port or a bad certificate must stop the node before it touches
        # its store.
        self._bind_ports()
        interrupted = pending_install(cfg.store_dir)
        try:
            if interrupted is not None:
                finish_install(cfg.store_dir)  # a crash stopped a snapshot install: finish it
            else:
                clear_staging(cfg.store_dir)  # a transfer a crash cut short
            self.store = SegmentedLogStore(
                cfg.store_dir, cfg.store, before_damage_cut=self._before_damage_cut
            )
        except Exception as exc:
            raise StartError(f"store {cfg.store_dir}: {exc}") from exc
        self._note_open_damage()
        if interrupted is not None:
            install_app(cfg.store_dir, self.sm, interrupted)
        self._applied = self.sm.applied_index()
        if self._applied < self.store.first_index() - 1:
            # Entries below the log's first index cannot be applied again (retention or a
            # snapshot took them): what they made is the state machine's to have kept.
            logger.warning(
                "node=%s applied index %d is below the log's first index %d",
                cfg.self_id,
                self._applied,
                self.store.first_index(),
            )
            self._applied = self.store.first_index() - 1
        if self.raft_stats is not None:
            self.store.on_sync = self.raft_stats.fsync_s.observe
        conf = self._start_conf()
        self._open_core(conf)
        self._transport = PeerTransport(
            cfg.group,
            cfg.self_id,
            cfg.public_client_addr,
            {},
            cfg.client_security,
            resolve=self._book.peer_addr,
        )
        self._sync_members()
        if cfg.unsafe_ack_before_replication:
            logger.warning(
                "node=%s UNSAFE unsafeAckBeforeReplication=true: appends are acknowledged "
                "BEFORE a majority holds them and CAN BE LOST. TEST ONLY, never in production",
                cfg.self_id,
            )
        assert self._peer_server is not None and self._client_server is not None
        await self._peer_server.start()
        await self._client_server.start()
        self._transport.start()
        self._spawn_tasks(conf)
        logger.info(
            "node=%s group=%s started peer=%s client=%s %s last_index=%d term=%d",
            cfg.self_id,
            cfg.group,
            cfg.peers[cfg.self_id],
            cfg.client_addr,
            f"tls plaintext_client_port={cfg.plaintext_client_port}" if cfg.tls else "plaintext",
            self.store.last_index(),
            self.core.term,
        )

    def _open_core(self, conf: ConfState | None) -> None:
        """The promise file read (and the hard state recovered from it if need be), then
        the Raft core over the open store; StartError when either refuses."""
        cfg = self.cfg
        try:
            promise = promise_file(cfg.store_dir, cfg.promise_path)
            start = recover(cfg.group, cfg.self_id, self.store, promise, self._applied)
            self._promises = start.writer
            self._promise_ahead = promise_ahead_entries(cfg.store_dir, promise)
            if start.promise_damaged:
                self.corruption_found["promise"] = 1
            self._hard_state = start.hard_state
            self._promise_wanted = start.promised.index
            self.core = RaftNode(
                cfg.self_id,
                list(cfg.peers),
                self.store,
                cfg.raft_config(),
                random.Random(self._seed),
                applied_index=self._applied,
                conf_state=conf,
                promised=start.promised,
                hard_state=start.hard_state,
            )
            if start.promise_damaged:
                core = self.core
                hold_promise(start.writer, lambda: core.repairing)
        except (ConfigError, PromiseError) as exc:
            raise StartError(f"node {cfg.self_id}: {exc}") from exc
        except CorruptLogError as exc:
            # The replay of the log's configuration entries met damage the open's check did
            # not cover (an older segment): restart with every segment checked.
            self.on_damage(exc, "start")
            raise StartError(f"node {cfg.self_id}: {exc}") from exc  # on_damage restarted

    def _spawn_tasks(self, conf: ConfState | None) -> None:
        """The node's loops. Fail fast: an exception escaping any of them ends the process
        (prockit.fatal); their cancellation by stop() does not."""
        cfg = self.cfg
        self._tasks = [
            spawn(self._tick_loop(), "tick"),
            spawn(self._ready_loop(), "ready"),
            spawn(self._retention_loop(), "retention"),
        ]
        if cfg.scrub_bytes_per_s:
            self.scrubber = Scrubber(lambda: self.store, self.on_damage, cfg.scrub_bytes_per_s)
            self._tasks.append(spawn(self.scrubber.run(), "scrub"))
        if cfg.chain_check_interval_ms:
            check = chain_check_loop(self, cfg.chain_check_interval_ms, peer_asker(self))
            self._tasks.append(spawn(check, "chain-check"))
        if conf is not None and not conf.voters and cfg.join_addr:
            self._tasks.append(spawn(self._join_loop(), "join"))
        # A repairing member that no member can repair stops (docs/STORAGE.md).
        good_copy = GoodCopyCheck(
            lambda: holdings_of(self),
            lambda: sorted(self.core.conf_state.voters),
            holdings_asker(self),
        )
        self._tasks.append(spawn(good_copy.run(), "good-copy"))

    def _bind_ports(self) -> None:
        """Both servers with their services, bound: plaintext, or TLS (client port) and
        mutual TLS (peer port) with ``cfg.tls``, plus the optional plaintext client port."""
        cfg = self.cfg
        self._peer_server = grpc.aio.server(options=SERVER_OPTIONS)
        decodeguard.add_servicer(
            self._peer_server, pb_grpc.add_DLedgerPeerServicer_to_server, _PeerServicer(self)
        )
        self._client_server = grpc.aio.server(
            options=SERVER_OPTIONS,
            interceptors=[GuardInterceptor(self._call_guard)] if self._call_guard else None,
        )
        decodeguard.add_servicer(
            self._client_server, pb_grpc.add_DLedgerClientServicer_to_server, _ClientServicer(self)
        )
        client_names = ["raftmq.dledger.v1.DLedgerClient"]
        for register in self._client_services:
            client_names.extend(register(self._client_server))
        for server, addr, names, mutual in (
            (self._peer_server, cfg.peers[cfg.self_id], ["raftmq.dledger.v1.DLedgerPeer"], True),
            (self._client_server, cfg.client_addr, client_names, False),
        ):
            add_health_and_reflection(server, names)
            bind(server, addr, cfg.tls, StartError, require_client_cert=mutual)
        if cfg.plaintext_client_port:
            plain = f"{PLAINTEXT_CLIENT_HOST}:{cfg.plaintext_client_port}"
            bind_insecure(self._client_server, plain, StartError)

    @property
    def call_guard(self) -> CallGuard | None:
        """The guard of the client port (other front ends of the process ask it too)."""
        return self._call_guard

    # ------------------------------------------------------------------ the application's view
    # What an application reads of the member (the broker's contract:
    # broker/components/raftnode.py).

    @property
    def self_id(self) -> str:
        return self.cfg.self_id

    @property
    def role(self) -> Role:
        return self.core.role

    @property
    def term(self) -> int:
        return self.core.term

    @property
    def leader_id(self) -> str | None:
        return self.core.leader_id

    @property
    def last_index(self) -> int:
        return self.core.last_index

    @property
    def max_body_bytes(self) -> int:
        return self.cfg.store.max_body_bytes

    @property
    def append_timeout_ms(self) -> int:
        return self.cfg.append_timeout_ms

    async def stop(self) -> None:
        """Stop serving, then close the store cleanly (removes the abort marker)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for server in (self._client_server, self._peer_server):
            if server is not None:
                await server.stop(grace=0.2)
        for task in self._tasks:
            task.cancel()
        if self._notice_release is not None:
            self._notice_release.cancel()
            self._notice_release = None
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._transport is not None:
            await self._transport.stop()
        await self.snapshots_out.stop()
        if self.scrubber is not None:
            self.scrubber.close()
        self._fail_waiters("node stopping")
        self._flush_pool.shutdown(wait=True)
        self._promise_pool.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self.store.write_checkpoint(self.core.commit_index, self._applied)
        with contextlib.suppress(AttributeError):  # a start that failed before it was opened
            self._promises.close()
        self.store.close()
        logger.info("node=%s stopped", self.cfg.self_id)

    async def wait_closed(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ inputs

    def _wake(self) -> None:
        self._wake_event.set()

    def wake(self) -> None:
        """Run the ready loop (after an input to the core from outside it)."""
        self._wake_event.set()

    @property
    def applied(self) -> int:
        """The last index applied by the state machine."""
        return self._applied

    def peer_addr(self, node_id: str) -> str:
        """A member's peer address: from the settings, else from the configuration (a
        member added at run time); "" when unknown."""
        return self._book.peer_addr(node_id)

    def peer_client_addr(self, node_id: str) -> str:
        """A member's client address (where its Metadata answers); "" when unknown."""
        return self._book.client_addr(node_id)

    def peer_metadata(self) -> tuple[tuple[str, str], ...]:
        """What identifies this node on a peer call (as the transport's streams send it)."""
        cfg = self.cfg
        return (
            ("x-raftmq-group", cfg.group),
            ("x-raftmq-from", cfg.self_id),
            ("x-raftmq-client-addr", cfg.public_client_addr),
        )

    def capture_app_snapshot(self) -> AppSnapshot:
        """The state machine's snapshot at the applied index (none of its own: no files)."""
        hook = getattr(self.sm, "capture_snapshot", None)
        app = hook() if callable(hook) else AppSnapshot(self._applied, ())
        if not isinstance(app, AppSnapshot) or app.index != self._applied:
            raise DLedgerError(f"state machine snapshot is not at the applied {self._applied}")
        return app

    def step_local(self, m: InstallSnapshot) -> None:
        """A snapshot received whole: into the core like a peer's message."""
        try:
            self.core.step(m)
        except Exception as exc:
            fatal("raft-step", exc)
        self._wake()

    async def _tick_loop(self) -> None:
        period_s = self.cfg.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += period_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if loop.time() - next_at > 10 * period_s:
                next_at = loop.time()  # paused (SIGSTOP) or starved: do not burst ticks
            self.core.tick()
            self._wake()

    def on_peer_message(self, sender: str, pm: pb.PeerMessage) -> None:
        if pm.WhichOneof("kind") == "batch":
            for inner in pm.batch.messages:
                if inner.WhichOneof("kind") == "batch":
                    self.note_drop(DROP_NESTED_BATCH, f"from={sender}")
                    continue
                self._on_one_peer_message(sender, inner)
            return
        self._on_one_peer_message(sender, pm)

    def _on_one_peer_message(self, sender: str, pm: pb.PeerMessage) -> None:
        m = from_pb(pm)
        if m is None:
            return
        if m.from_id != sender:
            self.note_drop(
                DROP_SENDER_MISMATCH, f"claiming from={_echo(m.from_id)} on stream of {sender}"
            )
            return
        problem = validate(m)
        if problem is not None:
            self.note_drop(DROP_INVALID, f"{type(m).__name__} from={sender}: {problem}")
            return
        try:
            self.core.step(m)
        except Exception as exc:
            # The core drops every message it can tell is hostile; an exception is a broken
            # invariant, after which its state cannot be trusted: never half alive.
            fatal("raft-step", exc)
        self._wake()

    def note_drop(self, reason: str, detail: str) -> None:
        """Count a peer message dropped before the core; log the 1st, 2nd, 4th ... of each
        reason (a flood costs a logarithmic number of lines)."""
        n = self._dropped[reason] = self._dropped.get(reason, 0) + 1
        if n & (n - 1) == 0:
            logger.warning(
                "node=%s drop reason=%s count=%d %s", self.cfg.self_id, reason, n, detail
            )

    def peer_links(self) -> dict[str, LinkStats]:
        """The outbound stream counters per peer (empty before start)."""
        transport = self._transport
        return {} if transport is None else {p: k.stats for p, k in transport.links.items()}

    def dropped(self) -> dict[str, int]:
        """Peer messages dropped since start, by reason: the node's (DROP_* of this module)
        and the core's (dledger.core DROP_*)."""
        out = dict(self._dropped)
        if hasattr(self, "core"):
            out.update(self.core.dropped)
        return out

    # ------------------------------------------------------------------ retention

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.retention_check_interval_s)
            try:
                held = await self.retention_floor()
            except (TimeoutError, grpc.RpcError, OSError) as exc:
                # The members' progress is unknown: only segments beyond the lag bound may go.
                logger.info(
                    "node=%s retention without the members' view: %s", self.cfg.self_id, exc
                )
                held = None
            # Segments every member holds go at fileReservedTime; those a member lacks only
            # after maxLagRetentionHours (it is caught up by a snapshot). Unknown: lag bound.
            held_index = -1 if held is None else held
            floor = self._applied
            # In a thread: deleting flushes and fsyncs (the store is thread safe).
            async with self._store_lock:
                deleted = await asyncio.get_running_loop().run_in_executor(
                    None,
                    functools.partial(
                        self.store.apply_retention,
                        now=datetime.now(),
                        applied_index=floor,
                        file_reserved_time_hours=self.cfg.file_reserved_time_hours,
                        delete_when=self.cfg.delete_when,
                        held_index=held_index,
                        max_lag_hours=self.cfg.max_lag_retention_hours,
                    ),
                )
            if deleted:
                hook = getattr(self.sm, "on_prefix_deleted", None)
                if callable(hook):
                    hook(self.store.first_index())
                logger.info(
                    "node=%s retention deleted=%d segments first_index=%d floor=%d",
                    self.cfg.self_id,
                    deleted,
                    self.store.first_index(),
                    floor,
                )

    async def retention_floor(self) -> int | None:
        """The highest index held here (applied) and by every member of the group as the
        leader knows it: retention deletes beyond it only segments older than
        maxLagRetentionHours (a member lacking them is caught up by a snapshot). None: not
        known now (no leader, or it did not answer)."""
        if self.core.role is Role.LEADER:
            matches = [p.match_index for p in self.core.status().peers]
        else:
            _, addr = self.leader_client_addr()
            if not addr:
                return None
            async with open_aio_channel(addr, self.cfg.client_security) as channel:
                resp = await pb_grpc.DLedgerClientStub(channel).Metadata(
                    pb.MetadataRequest(group=self.cfg.group), timeout=RETENTION_RPC_TIMEOUT_S
                )
            if resp.role != Role.LEADER.name:
                return None
            matches = [p.match_index for p in resp.peers] + [resp.commit_index]
        return min([self._applied, *matches])

    def log_next_allocation_bytes(self) -> int:
        """Bytes the log must still allocate before it can grow past its active files (0
        before the store is open): the disk watermark counts them (docs/STORAGE.md)."""
        store: SegmentedLogStore | None = getattr(self, "store", None)
        return store.next_allocation_bytes() if store is not None else 0

    def leader_client_addr(self) -> tuple[str | None, str]:
        leader = self.core.leader_id
        return leader, self._book.client_addr(leader) if leader else ""

    async def propose(
        self, bodies: Sequence[bytes], entry_type: int, *, headroom_bytes: int = 0
    ) -> tuple[int, int, int]:
        """Append on the leader and wait until committed and applied. Returns (first, last,
        term). Raises the core's errors, :class:`DiskFullError` (the log has no room for the
        entries without its Raft reserve and ``headroom_bytes`` more: docs/STORAGE.md "Disk
        full"), :class:`ProposalLostError` or asyncio.TimeoutError."""
        core = self.core
        if core.role is Role.LEADER:  # otherwise the core answers NOT_LEADER
            self._log_room.check(self.store, bodies, core.term, headroom_bytes)
        proposal = core.propose(bodies, entry_type)
        self._log_room.accepted(bodies, proposal.last_index, proposal.term)
        self._wake()
        if self.cfg.unsafe_ack_before_replication:
            # TEST ONLY (see NodeConfig): answer before any replication or commit.
            return proposal.first_index, proposal.last_index, proposal.term
        await self._wait_applied(proposal)
        return proposal.first_index, proposal.last_index, proposal.term

    async def change_member(self, change: ConfChange) -> Proposal:
        """One membership change on the leader, answered once committed and applied. Raises
        the core's errors (``ConfChangeError``, ``ConfChangePendingError``, ...),
        :class:`ProposalLostError` or asyncio.TimeoutError."""
        self._refused_joins.check_change(change.kind, change.node_id)
        conf = self.core.conf_state
        proposal = self.core.propose_conf_change(
            change, self._book.in_use(conf), self._book.known(conf.members)
        )
        self._wake()
        await self._wait_applied(proposal)
        return proposal

    async def _wait_applied(self, proposal: Proposal) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._waiters,
            _Waiter(
                proposal.last_index,
                next(self._waiter_seq),
                proposal.term,
                proposal.first_index,
                future,
            ),
        )
        await asyncio.wait_for(future, self.cfg.append_timeout_ms / 1000)

    # ------------------------------------------------------------------ membership

    def _start_conf(self) -> ConfState | None:
        """The configuration saved with the store; a node started empty to join a group
        starts as a learner knowing only itself (and saves that, so a restart before it was
        added does not turn it into a voter of the ``dLegerPeers`` group)."""
        conf = load_conf(self.cfg.store_dir, self.cfg.self_id)
        if conf is None and self.cfg.join_addr and self.store.last_index() == 0:
            conf = joining(self.cfg.self_id)
            save_conf(self.cfg.store_dir, conf, is_joining=True)
        return conf

    async def _save_committed_conf(self, committed: Sequence[Entry]) -> None:
        """Before the application applies past a CONFIG entry, save the configuration it
        set: a restart then replays only the CONFIG entries above the applied index."""
        last = max(e.index for e in committed if e.type == EntryType.CONFIG)
        conf = self.core.conf_state_at(last)
        await asyncio.get_running_loop().run_in_executor(
            self._flush_pool, save_conf, self.cfg.store_dir, conf
        )
        logger.info(
            "node=%s membership committed index=%d %s", self.cfg.self_id, last, conf.describe()
        )

    def _sync_members(self) -> None:
        """Peer links follow the configuration: one to every member and to every member the
        leader still replicates to (a removed one, until its removal commits); none else."""
        conf = self.core.conf_state
        self._conf_seen = conf
        self._book.update(conf)
        transport = self._transport
        assert transport is not None
        wanted = set(self.core.peers) | {p.peer_id for p in self.core.status().peers}
        for pid in sorted(wanted):
            addr = self._book.peer_addr(pid)
            if addr:
                transport.ensure(pid, addr)
            else:
                logger.warning("node=%s member=%s has no known address", self.cfg.self_id, pid)
        for pid in [p for p in transport.links if p not in wanted and conf.voters]:
            transport.drop(pid)  # (a node still joining keeps the links it was told of)
        if self.cfg.self_id in conf.removed and not self._removed_told:
            self._removed_told = True
            logger.warning("node=%s removed from group %s", self.cfg.self_id, self.cfg.group)
            for listener in self.removed_listeners:
                listener()

    def accepts_peer(self, node_id: str) -> bool:
        """Whether a peer stream from ``node_id`` is served: not this node, not a removed
        member. A member this node does not know yet is served: a node whose log lags behind
        the configuration that added a voter must still hear it (the core only takes its
        appends and votes; with TLS its certificate proves it is one of the group's)."""
        return (
            node_id != self.cfg.self_id
            and MEMBER_ID_RE.fullmatch(node_id) is not None
            and node_id not in self.core.conf_state.removed
        )

    def members(self) -> list[pb.Member]:
        """The configuration in force, with the leader's view of each member's progress."""
        conf = self.core.conf_state
        progress = {p.peer_id: p for p in self.core.status().peers}
        out = []
        for nid in sorted(conf.members):
            p = progress.get(nid)
            me = nid == self.cfg.self_id
            out.append(
                pb.Member(
                    id=nid,
                    role="VOTER" if nid in conf.voters else "LEARNER",
                    peer_addr=self.cfg.peers[nid] if me else self._book.peer_addr(nid),
                    client_addr=self._book.client_addr(nid),
                    match_index=p.match_index if p is not None else 0,
                    recent_active=p.recent_active if p is not None else me,
                )
            )
        return out

    async def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        """A node asks to join (its identity already checked): on the leader, add it as a
        learner; elsewhere, tell it where the members and the leader are."""
        leader = self.core.leader_id or ""
        if self.core.role is not Role.LEADER:
            return pb.JoinResponse(members=self.members(), leader_id=leader, added=False)
        # The leader decides, before anything changes (a member added by mqadmin too: its
        # Join is where the node's settings are first seen).
        self._refused_joins.check(
            self.cfg.group,
            self.cfg.all_shared_settings(),
            request.shared_settings,
            request.node_id,
        )
        change = ConfChange(
            ChangeKind.ADD_LEARNER, request.node_id, request.peer_addr, request.client_addr
        )
        conf = self.core.conf_state
        if request.node_id not in conf.members:
            await self.change_member(change)  # the caller maps the core's refusals
        return pb.JoinResponse(members=self.members(), leader_id=self.cfg.self_id, added=True)

    async def _join_loop(self) -> None:
        """Ask the group (through the peer port ``join_addr``, then its leader's) to add this
        node as a learner, until it is added; the log then brings the configuration. Under
        TLS this node's member certificate is what authorizes it (the operator issued it)."""
        req = pb.JoinRequest(
            group=self.cfg.group,
            node_id=self.cfg.self_id,
            peer_addr=self.cfg.peers[self.cfg.self_id],
            client_addr=self.cfg.public_client_addr,
            shared_settings=self.cfg.all_shared_settings(),
        )
        metadata = (("x-raftmq-group", self.cfg.group), ("x-raftmq-from", self.cfg.self_id))
        addr = self.cfg.join_addr
        while self.core.conf_state.voters == frozenset():
            try:
                async with open_aio_channel(addr, self.cfg.client_security) as channel:
                    resp = await pb_grpc.DLedgerPeerStub(channel).Join(
                        req, metadata=metadata, timeout=self.cfg.append_timeout_ms / 1000 + 1
                    )
            except grpc.aio.AioRpcError as exc:
                info = status.read_error(exc)
                if info is not None and info.code == IncompatibleStoreError.code:
                    # It can never catch up: end (mqcluster status and add show this line)
                    # rather than wait for ever as a learner of nothing.
                    fatal("join", f"join refused: {exc.details()}")
                if info is not None and not info.retryable:
                    logger.error("node=%s join refused: %s", self.cfg.self_id, exc.details())
                    return
                resp = None
            if resp is not None:
                # Where the members are: this node's settings list only itself, and the log
                # tells only once it reached a CONFIG entry.
                for m in resp.members:
                    if m.id != self.cfg.self_id and m.peer_addr:
                        self._book.learn(m.id, m.peer_addr, m.client_addr)
                if resp.added:
                    logger.info("node=%s joined group %s as a learner", self.cfg.self_id, req.group)
                    return
                addr = self._book.peer_addr(resp.leader_id) or addr
                if resp.leader_id:
                    continue
            await asyncio.sleep(JOIN_RETRY_MS / 1000)

    # ------------------------------------------------------------------ the ready loop

    async def _ready_loop(self) -> None:
        while True:
            await self._wake_event.wait()
            self._wake_event.clear()
            failpoints.hit("ready")
            try:
                while self.core.has_ready():
                    await self._carry_out(self.core.ready())
            except CorruptLogError as exc:
                # A read for replication, a commit or a snapshot met a damaged entry.
                self.on_damage(exc, "replication")

    # ------------------------------------------------------------------ damage

    def _before_damage_cut(self, report: damage.DamageReport) -> None:
        """The store's open found damage and is about to cut its log at
        ``report.first_index`` (it held entries up to ``report.last_index``). Before the cut,
        the promise file is raised to that index: the member then starts repairing (it
        neither votes nor counts towards a commit with the shorter log) until its leader
        has sent it past what it held. A promise file that cannot be read stops the open
        with nothing cut (PromiseError: the operator must look)."""
        self.corruption_found["open"] = self.corruption_found.get("open", 0) + 1
        path = promise_file(self.cfg.store_dir, self.cfg.promise_path)
        current = read_promise(path)
        if current is not None and current.promised_index >= report.last_index:
            return
        hard = current.hard_state if current is not None else _stored_hard_state(self.cfg)
        writer = PromiseWriter(path, self.cfg.group, self.cfg.self_id, current)
        try:
            writer.write(report.last_index, hard)
        finally:
            writer.close()
        logger.warning(
            "node=%s promise raised to %d before the damage cut (was %s): repairing until "
            "the leader sends it past that index",
            self.cfg.self_id,
            report.last_index,
            "none" if current is None else current.promised_index,
        )

    def _note_open_damage(self) -> None:
        report = self.store.damage
        if report is None:
            return
        logger.error(
            "node=%s DAMAGE cut from the log at open: %d entries to fetch again from the "
            "leader (%s)",
            self.cfg.self_id,
            report.entries_lost,
            report.describe(),
        )

    def on_damage(self, exc: CorruptLogError, found_by: str) -> None:
        """An entry of this member's log failed its check at run time (``found_by``: scrub,
        read, replication, snapshot, get). The member must not serve or lead on it: it
        restarts, and the restart's open checks every segment and cuts the log at the first
        damaged entry; the leader then sends everything after (docs/STORAGE.md "Damage and
        repair"). A disk that keeps producing damage stops the node instead."""
        self.corruption_found[found_by] = self.corruption_found.get(found_by, 0) + 1
        logger.error(
            "node=%s DAMAGE found by %s: index=%d path=%s offset=%d role=%s: %s",
            self.cfg.self_id,
            found_by,
            exc.index,
            exc.path,
            exc.offset,
            self.core.role.value if hasattr(self, "core") else "starting",
            exc,
        )
        if self._damage_handled:
            return
        self._damage_handled = True
        root = self.store.root
        marker = damage.next_restart(root)
        if marker.restarts > damage.MAX_DAMAGE_RESTARTS:
            fatal(
                "damage",
                f"DAMAGE_REPEATS {marker.restarts} damage restarts within "
                f"{damage.DAMAGE_RESTART_WINDOW_S:.0f} s: the disk under {root} keeps "
                f"failing; replace it (last: {exc})",
            )
        damage.write_marker(root, marker)
        fatal_mod.restart("damage", f"index={exc.index} found_by={found_by}: {exc}")

    def suspect_damage(self, position: int, found_by: str = "read") -> None:
        """The application read bad bytes at data ``position`` (a message whose own CRC
        failed): check the entry holding it, in a thread; damage goes to :meth:`on_damage`.
        Callable from any thread of the process."""
        store = self.store
        loop = self._loop
        if loop is None:
            return

        def check() -> None:
            index = store.index_at_position(position)
            if index:
                store.verify_entries(index, 1)

        async def run() -> None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, check)
            except CorruptLogError as exc:
                self.on_damage(exc, found_by)
            except DLedgerError as exc:
                logger.warning("node=%s damage check at %d: %s", self.cfg.self_id, position, exc)

        loop.call_soon_threadsafe(lambda: loop.create_task(run()))

    async def _carry_out(self, rd: Ready) -> None:
        """One Ready, in the contract's order (dledger.core docstring)."""
        transport = self._transport
        assert transport is not None
        for m in rd.early_messages:
            transport.send(m)
        for req in rd.snapshot_requests:
            self.snapshots_out.start(req)
        if rd.snapshot is not None:
            await self._install_snapshot(rd.snapshot)
        conf_committed = any(e.type == EntryType.CONFIG for e in rd.committed)
        committed = rd.committed
        if rd.must_persist():
            stable = (
                ()
                if conf_committed or rd.snapshot is not None or rd.rewind_to is not None
                else _stable_prefix(rd)
            )
            if stable:
                await self._persist_applying(rd, stable)
                committed = committed[len(stable) :]
            else:
                await self._persist(rd)
        for m in rd.messages:
            transport.send(m)
        if conf_committed:
            await self._save_committed_conf(rd.committed)
        if rd.rewind_to is not None:
            self._rewind(rd.rewind_to)
        self._apply(committed)
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.role, rd.soft_state.term)
        self.core.advance(rd)
        if conf_committed or self.core.conf_state is not self._conf_seen:
            self._sync_members()
        self._arm_notice_release(rd.notices_held)
        await self._maybe_checkpoint()

    async def _persist_applying(self, rd: Ready, stable: Sequence[Entry]) -> None:
        """The Ready's persist job, and meanwhile the apply of ``stable``: committed entries
        that earlier jobs already stored, so that what they answer does not wait for this
        job's fsync (the disk and the apply overlap, as etcd's apply and WAL write do;
        docs/PERFORMANCE.md "SYNC_FLUSH at 16 and 256 in flight")."""
        job = asyncio.ensure_future(self._persist(rd))
        try:
            await asyncio.sleep(0)  # the job reaches the flush thread before the apply runs
            self._apply(stable)
        finally:
            await job

    def _apply(self, committed: Sequence[Entry]) -> None:
        """Apply committed entries in order and answer the proposals they complete."""
        if not committed:
            return
        try:
            failpoints.hit("apply")
            self.sm.apply(committed)
        except Exception as exc:
            # The application's state is unknown after a failed apply: end the
            # process now (recovery replays from its checkpoint).
            fatal("apply", exc)
        self._applied = committed[-1].index
        self._resolve_waiters(self._applied)

    def _rewind(self, index: int) -> None:
        """Roll the state machine back to ``index``: the entries applied above it were a
        damaged or forged copy, replaced by the leader's (already persisted)."""
        hook = getattr(self.sm, "rewind", None)
        logger.error(
            "node=%s rewind applied=%d to=%d: applied entries were replaced by the leader's",
            self.cfg.self_id,
            self._applied,
            index,
        )
        if not callable(hook):
            fatal(
                "apply",
                DLedgerError(
                    f"entries {index + 1}..{self._applied} this node applied differed by "
                    "content from its leader's and were replaced; this state machine cannot "
                    "roll back (no rewind()): restore this node from a snapshot of a member"
                ),
            )
        try:
            hook(index)
        except Exception as exc:
            fatal("apply", exc)
        self._applied = index

    async def _install_snapshot(self, meta: SnapshotMeta) -> None:
        """A Ready's snapshot: the staged log and files replace this node's; the core reads
        the new store from now on. Any failure ends the process (a restart finishes it)."""
        try:
            async with self._store_lock:
                store = await self.snapshots_in.install(meta)
                self.store = store
                self.core.replace_store(store)
                # The core adopted the snapshot's configuration when it accepted it; the
                # install saved it (membership.json) before the marker goes.
                install_app(self.cfg.store_dir, self.sm, meta.index)
                # A state machine without snapshot files of its own is the log itself.
                takes_files = callable(getattr(self.sm, "install_snapshot", None))
                applied = self.sm.applied_index() if takes_files else meta.index
            chain = store.chain_at(meta.index)
            if (
                applied != meta.index
                or store.term_at(meta.index) != meta.term
                or not agree(chain, meta.chain)
            ):
                raise DLedgerError(
                    f"installed snapshot {meta.index}/{meta.term}: applied {applied}, term "
                    f"{store.term_at(meta.index)}, chain {chain_fmt(chain)} (the leader's: "
                    f"{chain_fmt(meta.chain)})"
                )
        except Exception as exc:
            fatal("snapshot-install", exc)
        self._applied = meta.index
        logger.info(
            "node=%s snapshot installed index=%d term=%d first_index=%d",
            self.cfg.self_id,
            meta.index,
            meta.term,
            store.first_index(),
        )

    def _arm_notice_release(self, held: bool) -> None:
        """One pending release while notices are held; cancelled once none is (an append
        carried the commit), so that the next hold lingers in full: a stale timer released
        it early, a notice per send at 1 in flight (docs/PERFORMANCE.md)."""
        if held:
            if self._notice_release is None:
                self._notice_release = asyncio.get_running_loop().call_later(
                    COMMIT_NOTICE_LINGER_MS / 1000, self._release_notices
                )
        elif self._notice_release is not None:
            self._notice_release.cancel()
            self._notice_release = None

    def _release_notices(self) -> None:
        """The linger of the held commit notices is over: the core sends those still due."""
        self._notice_release = None
        if self._stopped.is_set():
            return
        self.core.release_notices()
        self._wake()

    async def _persist(self, rd: Ready) -> None:
        """The Ready's persist job in the flush thread: hard state, cut, append and (under
        SYNC_FLUSH) flush, and the promise (dledger.server.promises); under ASYNC_FLUSH an
        entry in the page cache counts as stable (docs/STORAGE.md). A full disk refuses the
        job without writing the append: it is retried until space returns, and nothing that
        depends on it is sent meanwhile."""
        sync = self.cfg.store.flush_disk_type is FlushDiskType.SYNC_FLUSH
        # SYNC_FLUSH, a promise beyond what the promise file covers durably, no hard state
        # and no cut: the promise, PROMISE_AHEAD_ENTRIES ahead, is written in its own thread
        # while the flush thread writes the log (two fdatasync side by side cost about one),
        # recording what was durable before the job. The jobs after it only refresh the
        # exact promise (no fdatasync) until they pass it (dledger.server.promises).
        beside = (
            sync
            and rd.promise is not None
            and rd.promise > self._promises.ceiling
            and rd.hard_state is None
            and rd.truncate_from is None
            and rd.snapshot is None
        )
        job: Callable[[], None] = functools.partial(self._persist_job, rd, sync, beside)
        if beside:
            assert rd.promise is not None
            self._promise_wanted = max(self._promise_wanted, rd.promise)
            promise = functools.partial(
                write_promise_ahead,
                self._promises,
                rd.promise,
                self._hard_state,
                self.store.flushed_index(),
                self._promise_ahead,
            )
            job = functools.partial(self._beside_job, job, promise)
        # ASYNC_FLUSH with only entries to append: a copy into the page cache, which never
        # waits for the disk; the hop to the thread and back cost more than the copy (ASYNC
        # sends at 1-16 in flight were 20-35% slower with it). Hard state and cuts fsync.
        inline = not sync and rd.hard_state is None and rd.truncate_from is None
        if rd.entries and self.raft_stats is not None:
            self.raft_stats.appended(rd.entries)
        while True:
            try:
                if inline:
                    job()
                else:
                    await asyncio.get_running_loop().run_in_executor(self._flush_pool, job)
                return
            except DiskFullError as exc:
                self.note_drop(DROP_DISK_FULL, f"persist of {len(rd.entries)} entries: {exc}")
            await asyncio.sleep(PERSIST_RETRY_MS / 1000)

    def _beside_job(self, log_job: Callable[[], None], promise_job: Callable[[], None]) -> None:
        """In the flush thread: hand the durable promise to its own thread, write and flush
        the log here, and once both are done refresh the exact promise; the first error is
        raised (every step is safe to run again). The event loop waits for this one job: one
        hop to a thread and one wake-up per round, not two and a gather."""
        promised = self._promise_pool.submit(promise_job)
        try:
            log_job()
        finally:
            # Never return (nor retry the job) while the promise write still runs: one writer.
            failed = promised.exception()
        if failed is not None:
            raise failed
        self._refresh_promise()

    def _persist_job(self, rd: Ready, sync: bool, promised_beside: bool) -> None:
        """Step 2 of the Ready contract: hard state, cut, entries, flush, then the promise
        (with the hard state's copy) before any acknowledgement leaves, unless it is being
        written beside this job. Under SYNC_FLUSH a job with a hard state, a cut or a
        snapshot writes the promise durably after the log; a job whose promise the file
        covers durably already refreshes the exact promise (no fdatasync). Under ASYNC_FLUSH
        the promise follows what the store flushed (dledger.server.promises), written here
        only with a hard state change; the checkpoint catches up the rest."""
        persist(self.store, rd.hard_state, rd.truncate_from, rd.entries, flush=sync)
        if rd.hard_state is not None:
            self._hard_state = rd.hard_state
        if promised_beside:
            return
        if rd.promise is not None:
            self._promise_wanted = max(self._promise_wanted, rd.promise)
        if not sync:
            if rd.hard_state is not None:
                self._write_flushed_promise()
            return
        plain = rd.hard_state is None and rd.truncate_from is None and rd.snapshot is None
        if plain and rd.promise is not None and rd.promise <= self._promises.ceiling:
            self._refresh_promise()
        elif rd.promise is not None or rd.hard_state is not None:
            write_promise(self._promises, self._promise_wanted, self._hard_state)

    def _refresh_promise(self) -> None:
        """SYNC_FLUSH, in the flush thread after the log's flush: the exact promise and what
        the store flushed, in the page cache (the durable promise covers it already);
        nothing while the promise is held (a damaged file's repair)."""
        if held(self._promises):
            return
        self._promises.refresh(self._promise_wanted, self._hard_state, self.store.flushed_index())

    def _write_flushed_promise(self) -> None:
        """ASYNC_FLUSH: promise only what the store flushed (in the flush thread)."""
        flushed = min(self._promise_wanted, self.store.flushed_index())
        write_promise(self._promises, flushed, self._hard_state)

    def _on_soft_state(self, role: Role, term: int) -> None:
        leader = self.core.leader_id
        logger.info("node=%s role=%s term=%d leader=%s", self.cfg.self_id, role.value, term, leader)
        if role is not Role.LEADER:
            self._fail_waiters("leadership lost before commit; outcome unknown")
        self._leader_changed.set()
        self._leader_changed = asyncio.Event()
        self.sm.on_role_change(role, term, leader)

    def _resolve_waiters(self, applied: int) -> None:
        while self._waiters and self._waiters[0].last_index <= applied:
            w = heapq.heappop(self._waiters)
            if w.future.done():
                continue
            if self.store.term_at(w.last_index) == w.term:
                w.future.set_result(None)
            else:
                w.future.set_exception(ProposalLostError("entries replaced by a newer leader"))

    def _fail_waiters(self, why: str) -> None:
        for w in self._waiters:
            if not w.future.done():
                w.future.set_exception(ProposalLostError(why))
        self._waiters.clear()

    async def _maybe_checkpoint(self) -> None:
        now = time.monotonic()
        if (now - self._last_checkpoint_s) * 1000 >= CHECKPOINT_INTERVAL_MS:
            self._last_checkpoint_s = now
            # In the flush thread: the checkpoint is an atomic file write with fsyncs.
            await asyncio.get_running_loop().run_in_executor(
                self._flush_pool,
                self._checkpoint_job,
                self.core.commit_index,
                self._applied,
            )

    def _checkpoint_job(self, commit_index: int, applied_index: int) -> None:
        self.store.write_checkpoint(commit_index, applied_index)
        try:
            if self.cfg.store.flush_disk_type is FlushDiskType.ASYNC_FLUSH:
                self._write_flushed_promise()
            elif self._promises.current is None and not held(self._promises):
                # A promise file found damaged at start is rewritten once its repair ended,
                # whether or not a new entry comes to carry it (docs/RAFT.md section 11).
                write_promise(self._promises, self._promise_wanted, self._hard_state)
            else:
                # The refreshed exact promise made durable once per checkpoint: after a
                # power cut the file is at most this far behind the acknowledgements.
                self._promises.sync()
        except DiskFullError as exc:
            # Only creating the file allocates; the next checkpoint tries again.
            logger.warning("node=%s promise not written: %s", self.cfg.self_id, exc)

    async def wait_leader_change(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leader_changed.wait(), timeout_s)


def _stored_hard_state(cfg: NodeConfig) -> HardState:
    """The store's ``meta`` (term and vote), read while the store is opening; an empty hard
    state when it is missing or damaged (the promise's copy then starts at term 0, and the
    newer of the two is what the node starts from: dledger.server.promises.recover)."""
    try:
        return codec.decode_hard_state((Path(cfg.store_dir) / META_FILE).read_bytes())
    except (OSError, codec.RecordError):
        return HardState()


def _stable_prefix(rd: Ready) -> Sequence[Entry]:
    """The committed entries of ``rd`` that earlier persist jobs stored: those below the first
    index this Ready's job writes (a cut or its entries). A committed entry is never cut, so
    only ``rd.entries`` can hold committed entries that are not stable yet."""
    firsts = (rd.truncate_from, rd.entries[0].index if rd.entries else None)
    writes = [i for i in firsts if i is not None]
    if not writes:
        return rd.committed
    first = min(writes)
    n = 0
    for e in rd.committed:
        if e.index >= first:
            break
        n += 1
    return rd.committed[:n]


class _PeerServicer(pb_grpc.DLedgerPeerServicer):
    def __init__(self, node: DLedgerNode) -> None:
        self.node = node

    async def Stream(
        self, request_iterator: AsyncIterator[pb.PeerMessage], context: grpc.aio.ServicerContext
    ) -> pb.PeerAck:
        sender = await self._sender(context)
        received = 0
        async for pm in request_iterator:
            received += 1
            self.node.on_peer_message(sender, pm)
        return pb.PeerAck(received=received)

    async def Join(
        self, request: pb.JoinRequest, context: grpc.aio.ServicerContext
    ) -> pb.JoinResponse:
        node = self.node
        if node.cfg.tls is None:
            sender = await self._claimed_sender(context)
        else:
            sender = await self._certified_sender(context)
        if request.group != node.cfg.group or request.node_id != sender:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.PERMISSION_DENIED,
                    E.PEER_IDENTITY,
                    f"{_echo(sender)} cannot join as {_echo(request.node_id)} of group "
                    f"{_echo(request.group)}",
                ),
            )
        try:
            return await node.join(request)
        except (DLedgerError, TimeoutError) as exc:
            failure = errormap.dledger_failure(exc, node)
            if failure is None:
                raise
            await status.abort(context, failure)

    async def InstallSnapshot(
        self, request_iterator: AsyncIterator[pb.SnapshotChunk], context: grpc.aio.ServicerContext
    ) -> pb.SnapshotReply:
        sender = await self._sender(context)
        try:
            return await self.node.snapshots_in.receive(sender, request_iterator)
        except SnapshotRefused as exc:
            await status.abort(context, refused_status(exc))
            raise  # unreachable: abort raises

    async def Holdings(
        self, request: pb.HoldingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldingsResponse:
        """What this member's log holds, for a repairing member (dledger.server.goodcopy);
        authenticated like Stream."""
        await self._sender(context)
        node = self.node
        if request.group != node.cfg.group:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.PERMISSION_DENIED,
                    E.NOT_A_MEMBER,
                    f"this member is of group {_echo(node.cfg.group)}, not {_echo(request.group)}",
                ),
            )
        h = holdings_of(node)
        return to_response(h, chain_or_none(node, h.last_index) or 0)

    async def _sender(self, context: grpc.aio.ServicerContext) -> str:
        """The member calling (the call is refused when it is none)."""
        if self.node.cfg.tls is None:
            return await self._claimed_sender(context)
        return await self._certified_sender(context)

    async def _certified_sender(self, context: grpc.aio.ServicerContext) -> str:
        """Mutual TLS: the member its certificate names (dledger.server.members)."""
        cfg = self.node.cfg
        sender = stream_sender(
            context.auth_context(),
            context.invocation_metadata() or (),
            cfg.group,
            cfg.self_id,
            _AcceptedPeers(self.node),
        )
        if isinstance(sender, Refused):
            REFUSALS.count(
                sender.reason, f"node={cfg.self_id} peer={context.peer()} {sender.failure.detail}"
            )
            await status.abort(context, sender.failure)
        return sender

    async def _claimed_sender(self, context: grpc.aio.ServicerContext) -> str:
        """Plaintext: the member the stream's headers name (anyone who can reach the peer port
        can claim to be a member; tlsEnable closes that)."""
        node = self.node
        md = dict(context.invocation_metadata() or ())
        group, sender = md.get("x-raftmq-group", ""), md.get("x-raftmq-from", "")
        # x-raftmq-client-addr is ignored: redirects use configured addresses only.
        if (
            group != node.cfg.group
            or len(sender) > MAX_NODE_ID_CHARS
            or not node.accepts_peer(sender)
        ):
            node.note_drop(DROP_STREAM_REFUSED, f"group={_echo(group)} from={_echo(sender)}")
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.PERMISSION_DENIED,
                    E.NOT_A_MEMBER,
                    f"of group {_echo(node.cfg.group)}: group={_echo(group)} from={_echo(sender)}",
                ),
            )
        return str(sender)


class _AcceptedPeers:
    """The members a peer stream may come from, as the configuration says (a container)."""

    def __init__(self, node: DLedgerNode) -> None:
        self.node = node

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, str) and self.node.accepts_peer(node_id)


# ChangeMemberRequest.kind -> the core's change.
_CHANGE_KINDS = {k.name: k for k in ChangeKind}


class _ClientServicer(pb_grpc.DLedgerClientServicer):
    """The log client service. Errors become statuses through :mod:`rpckit.status`
    (:meth:`_fail` for dledger's errors, :func:`_invalid` for refused requests)."""

    def __init__(self, node: DLedgerNode) -> None:
        self.node = node

    async def _check_group(self, group: str, context: grpc.aio.ServicerContext) -> None:
        if group and group != self.node.cfg.group:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    E.UNKNOWN_GROUP,
                    f"this node serves group {_echo(self.node.cfg.group)}, not {_echo(group)}",
                ),
            )

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
        """End the call with the status of ``exc``, one of dledger's errors or a quorum
        timeout (anything else is raised again: gRPC answers UNKNOWN and logs it)."""
        failure = errormap.dledger_failure(exc, self.node)
        if failure is None:
            raise exc
        await status.abort(context, failure)

    async def Append(
        self, request: pb.AppendEntriesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendEntriesResponse:
        node = self.node
        await self._check_group(request.group, context)
        entry_type = request.type
        if entry_type not in node.cfg.client_entry_types:
            await status.abort(
                context,
                _invalid(
                    E.ENTRY_TYPE_NOT_ALLOWED,
                    f"type {entry_type} cannot be appended by clients "
                    f"(allowed: {sorted(node.cfg.client_entry_types)})",
                ),
            )
        bodies = request.bodies
        if len(bodies) > MAX_ENTRIES_PER_PROPOSAL:
            await status.abort(
                context,
                _invalid(
                    E.TOO_MANY_ENTRIES, f"{len(bodies)} bodies exceed {MAX_ENTRIES_PER_PROPOSAL}"
                ),
            )
        max_body = node.store.config.max_body_bytes
        for i, b in enumerate(bodies):
            if len(b) > max_body:
                # No retry can ever store it: distinct from the retryable BACK_PRESSURE.
                await status.abort(
                    context,
                    _invalid(
                        E.ENTRY_TOO_LARGE, f"body {i} has {len(b)} bytes, the limit is {max_body}"
                    ),
                )
        try:
            first, last, term = await node.propose(list(bodies), entry_type)
        except (DLedgerError, TimeoutError) as exc:
            await self._fail(context, exc)
        return pb.AppendEntriesResponse(first_index=first, last_index=last, term=term)

    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        node = self.node
        await self._check_group(request.group, context)
        commit = node.core.commit_index
        if request.index < 1:
            await status.abort(context, _invalid(E.INVALID_INDEX, "index must be >= 1"))
        if request.index > commit:
            return pb.GetResponse(commit_index=commit)
        count = min(max(1, request.max_count), GET_MAX_COUNT, commit - request.index + 1)
        max_bytes = min(request.max_bytes or GET_MAX_BYTES, GET_MAX_BYTES)
        try:
            entries = node.store.read_range(request.index, max_bytes, max_count=count)
        except LogCompactedError as exc:
            await self._fail(context, exc)
        except CorruptLogError as exc:
            # Answer first (DATA_LOSS LOG_DAMAGED index=...), then repair.
            asyncio.get_running_loop().call_later(DAMAGE_ANSWER_GRACE_S, node.on_damage, exc, "get")
            await self._fail(context, exc)
        except IndexOutOfRangeError:
            entries = []
        resp = pb.GetResponse(commit_index=commit)
        add = resp.entries.add  # in place: a list of Entry messages would be merged (copied)
        for e in entries:
            add(term=e.term, index=e.index, type=e.type, body=e.body)
        return resp

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        node = self.node
        await self._check_group(request.group, context)
        st = node.core.status()
        leader, addr = node.leader_client_addr()
        disk_total, disk_free = _disk_space(node.store.root)
        resp = pb.MetadataResponse(
            group=node.cfg.group,
            self_id=node.cfg.self_id,
            role=st.role.name,
            term=st.term,
            leader_id=leader or "",
            leader_client_addr=addr,
            commit_index=st.commit_index,
            applied_index=st.applied_index,
            first_index=node.store.first_index(),
            last_index=st.last_index,
            flushed_index=node.store.flushed_index(),
            peers=[
                pb.PeerProgress(id=p.peer_id, match_index=p.match_index, next_index=p.next_index)
                for p in st.peers
            ],
            store_path=str(node.store.root),
            refusals=REFUSALS.snapshot(),
            disk_total_bytes=disk_total,
            disk_free_bytes=disk_free,
        )
        resp.MergeFrom(health_fields(node, request.chain_index))
        return resp

    async def ListMembers(
        self, request: pb.ListMembersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMembersResponse:
        await self._check_group(request.group, context)
        return _list_members(self.node)

    async def ChangeMember(
        self, request: pb.ChangeMemberRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChangeMemberResponse:
        node = self.node
        await self._check_group(request.group, context)
        kind = _CHANGE_KINDS.get(request.kind)
        if kind is None:
            await status.abort(
                context,
                _invalid(
                    E.UNKNOWN_CHANGE,
                    f"kind {_echo(request.kind)} is not one of {sorted(_CHANGE_KINDS)}",
                ),
            )
        adding = kind in (ChangeKind.ADD_LEARNER, ChangeKind.ADD_VOTER)
        if adding and not request.peer_addr:
            await status.abort(
                context, _invalid(E.PEER_ADDR_REQUIRED, "a new member needs its peer_addr")
            )
        change = ConfChange(kind, request.node_id, request.peer_addr, request.client_addr)
        try:
            proposal = await node.change_member(change)
        except (DLedgerError, TimeoutError) as exc:
            await self._fail(context, exc)
        return pb.ChangeMemberResponse(
            members=node.members(), index=proposal.last_index, term=proposal.term
        )

    async def TransferLeadership(
        self, request: pb.TransferLeadershipRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransferLeadershipResponse:
        node = self.node
        await self._check_group(request.group, context)
        try:
            node.core.transfer_leadership(request.target_id)
        except DLedgerError as exc:
            await self._fail(context, exc)
        node._wake()
        deadline = time.monotonic() + node.cfg.election_timeout_ms * 4 / 1000
        while node.core.leader_id != request.target_id and time.monotonic() < deadline:
            await node.wait_leader_change(deadline - time.monotonic())
        if node.core.leader_id != request.target_id:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    E.TRANSFER_TIMEOUT,
                    f"leader is still {node.core.leader_id}",
                    leader_id=node.core.leader_id or "",
                    leader_addr=node.leader_client_addr()[1],
                    retryable=True,
                ),
            )
        return pb.TransferLeadershipResponse(
            leader_id=node.core.leader_id or "", term=node.core.term
        )


def _list_members(node: DLedgerNode) -> pb.ListMembersResponse:
    conf = node.core.conf_state
    return pb.ListMembersResponse(
        members=node.members(),
        leader_id=node.core.leader_id or "",
        config_index=conf.index,
        config_committed=conf.index <= node.core.commit_index,
        term=node.core.term,
    )


def _invalid(code: str, text: str) -> status.RpcFailure:
    """A request this node refuses whatever its state: not retryable."""
    return status.RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, code, text)
