"""One DLedger member as an asyncio process: drives the Raft core with real time, disk and gRPC.

The node follows the core's driver contract (``dledger.core`` docstring) in a single task, the
*ready loop*: send the early messages, persist the Ready's hard state, truncation and entries
in one job in a thread (the loop keeps taking messages and proposals meanwhile, into the core's
unstable tail, and the next job writes all of them: group commit), then send the other
messages, apply committed entries, ``advance``. Nothing on the event loop waits for the disk.
Commit notices a Ready holds are released by one ``loop.call_later`` timer
COMMIT_NOTICE_LINGER_MS after the hold began (at most one pending; a Ready that holds none
ends the hold, and the timer then finds nothing to release).
Peer RPC and client RPC listen on separate ports so that either can be cut off on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import heapq
import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger import failpoints
from dledger.appsnapshot import AppSnapshot
from dledger.chain import agree
from dledger.chain import fmt as chain_fmt
from dledger.core import (
    COMMIT_NOTICE_LINGER_MS,
    ChangeKind,
    ConfChange,
    ConfigError,
    ConfState,
    InstallSnapshot,
    Message,
    Proposal,
    RaftNode,
    Ready,
    Role,
    SnapshotMeta,
)
from dledger.core.membership import MEMBER_ID_RE, joining
from dledger.core.membership import decode as decode_conf
from dledger.log import (
    CorruptLogError,
    DLedgerError,
    Entry,
    EntryType,
    FeatureLevelError,
    FormatTooNewError,
    HardState,
)
from dledger.rewind import NeedsSnapshotError, RewindOutcome
from dledger.server import confrepair, rewinds
from dledger.server.chaincheck import (
    chain_check_loop,
    peer_asker,
)
from dledger.server.client_service import ClientServicer
from dledger.server.convert import echo, from_pb, validate
from dledger.server.errors import ProposalLostError, StartError
from dledger.server.flushthread import FlushThread
from dledger.server.formats import check_store_formats
from dledger.server.goodcopy import GoodCopyCheck, holdings_asker, holdings_of
from dledger.server.logroom import LogRoom
from dledger.server.membership import (
    CONF_FILE,
    JOIN_RETRY_MS,
    AddressBook,
    DamagedConfFileError,
    IncompatibleStoreError,
    RefusedJoins,
    check_joiner_level,
    load_conf,
    save_conf,
)
from dledger.server.metrics import RaftStats
from dledger.server.nodeconfig import (
    DEFAULT_CLIENT_ENTRY_TYPES,
    RETENTION_CHECK_INTERVAL_S,
    LogOnlyStateMachine,
    NodeConfig,
    ServiceRegistrar,
    StateMachine,
)
from dledger.server.peer_service import PeerServicer
from dledger.server.peersock import MAX_PROTOCOL_VERSION, PeerSocketServer
from dledger.server.persister import ReadyPersister
from dledger.server.promises import (
    PromiseError,
    StartState,
    hold_promise,
    promise_ahead_entries,
    promise_file,
    recover,
)
from dledger.server.scrub import (
    Scrubber,
)
from dledger.server.snapshots import (
    SnapshotReceiver,
    SnapshotSender,
    clear_staging,
    finish_install,
    install_app,
    pending_install,
)
from dledger.server.transport import (
    MAX_GRPC_MESSAGE_BYTES,
    SERVER_OPTIONS,
    LinkStats,
    PeerTransport,
)
from dledger.storage import (
    FlushDiskType,
    SegmentedLogStore,
    codec,
    damage,
)
from dledger.storage.promise import PromiseWriter, read_promise
from dledger.storage.retention import used_percent
from dledger.storage.store import META_FILE
from mqerrors import codes as E
from mqrelease import BASELINE_LEVEL, RELEASE
from mqsecurity.channels import open_aio_channel
from mqsecurity.errors import CertificateError
from prockit import fatal as fatal_mod
from prockit.fatal import fatal, spawn
from rpckit import decodeguard, status
from rpckit.callguard import CallGuard, GuardInterceptor
from rpckit.serving import add_health_and_reflection, bind, bind_insecure

logger = logging.getLogger(__name__)

# How often the applied/commit checkpoint is written while entries are being applied.
CHECKPOINT_INTERVAL_MS = 1000
# How early a timer may fire and still count as due: the loop's timers have a resolution of
# a millisecond (uvloop's clock), so a release timer can wake just under its delay.
_TIMER_SLACK_S = 0.001
# How long a node waits for the leader's view of the members before retention deletes
# (the check's interval is NodeConfig.retention_check_interval_s).
RETENTION_RPC_TIMEOUT_S = 3.0
# The settings retune() changes while the node runs (each read at its next use).
RETUNABLE_FIELDS = frozenset({"retention_early_used_percent", "scrub_bytes_per_s"})
# Peer messages dropped by the node before the core (keys of DLedgerNode.dropped(), with the
# core's DROP_* reasons): a stream refused at its start (peer_service.DROP_STREAM_REFUSED), a
# message claiming another sender than its stream, a message malformed in itself, a batch
# nested in a batch.
DROP_SENDER_MISMATCH = "sender_mismatch"
DROP_INVALID = "invalid"
DROP_NESTED_BATCH = "nested_batch"
# Where the extra plaintext client port (NodeConfig.plaintext_client_port) listens: local
# tools only, never the network.
PLAINTEXT_CLIENT_HOST = "127.0.0.1"

__all__ = [
    "DEFAULT_CLIENT_ENTRY_TYPES",
    "RETENTION_CHECK_INTERVAL_S",
    "DLedgerNode",
    "LogOnlyStateMachine",
    "NodeConfig",
    "ServiceRegistrar",
    "StateMachine",
]


@dataclass(order=True, slots=True)
class _Waiter:
    last_index: int
    seq: int
    term: int = field(compare=False)
    first_index: int = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class DLedgerNode:
    """A running member: call :meth:`start`, then :meth:`wait_closed` or :meth:`stop`."""

    # The peer socket's receiving side (cfg.peer_socket_port; None when not offered).
    _socket_server: PeerSocketServer | None = None
    # The membership file this process's start repaired, by where the configuration came
    # from (dledger.server.confrepair: log, settings, quorum); empty unless it did.
    membership_repairs: Mapping[str, int] = MappingProxyType({})
    # The ready loop's wake-up: a flag, and the future the loop awaits while it is clear
    # (settled by _wake; an asyncio.Event made a future, looked its loop up and kept a list
    # of waiters on every wait, for the one waiter there is).
    _woken = False
    _wake_fut: asyncio.Future[None] | None = None
    # When the current hold of a Ready's commit notices began (loop time; None: none held).
    _notice_hold_since: float | None = None

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
        self._flush = FlushThread(f"flush-{cfg.self_id}")
        self._last_checkpoint_s = 0.0
        self._applied = 0
        # The group's committed feature level and its CONFIG entry's index (0: never raised).
        self._feature_level = BASELINE_LEVEL
        self._feature_level_index = 0
        self._leader_changed = asyncio.Event()
        # The one pending release_notices() call, while a Ready's commit notices are held.
        self._notice_release: asyncio.TimerHandle | None = None
        self.store: SegmentedLogStore
        self.core: RaftNode
        # The persist jobs and the promise file (dledger.server.persister), set at start.
        self._persister: ReadyPersister
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
        # Rebuilds after content repairs by how, restarts for them in the window (rewinds).
        self.state_rebuilds: dict[str, int] = {}
        self.rewind_restarts_recent = 0
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
        await self._bind_socket()
        self._check_formats()
        self._carry_out_rebuild()
        interrupted = pending_install(cfg.store_dir)
        try:
            if interrupted is not None:
                finish_install(cfg.store_dir)  # a crash stopped a snapshot install: finish it
            else:
                clear_staging(cfg.store_dir)  # a transfer a crash cut short
            self.store = SegmentedLogStore(
                cfg.store_dir,
                cfg.store,
                before_damage_cut=self._before_damage_cut,
                supported_feature_level=cfg.supported_feature_level,
            )
        except Exception as exc:
            raise StartError(f"store {cfg.store_dir}: {exc}") from exc
        self._note_open_damage()
        self._open_app(interrupted)
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
        start = self._recover_promise()
        conf = await self._start_conf(start.promised.index)
        self._open_core(conf, start)
        self._open_feature_level()
        self._transport = PeerTransport(
            cfg.group,
            cfg.self_id,
            cfg.public_client_addr,
            {},
            cfg.client_security,
            resolve=self._book.peer_addr,
            use_socket=cfg.peer_socket_enable,
        )
        self._sync_members()
        if cfg.unsafe_ack_before_replication:
            logger.warning(
                "node=%s UNSAFE unsafeAckBeforeReplication=true: appends are acknowledged "
                "BEFORE a majority holds them and CAN BE LOST. TEST ONLY, never in production",
                cfg.self_id,
            )
        await self._serve_ports()
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

    def _check_formats(self) -> None:
        """StartError, with nothing on disk changed, when a file of the store or of the
        application (its optional ``check_formats``) is of a format newer than this release
        reads (error FORMAT_TOO_NEW: the message names the file and both versions)."""
        app_check = getattr(self.sm, "check_formats", None)
        try:
            check_store_formats(self.cfg.store_dir, self.cfg.self_id)
            if callable(app_check):
                app_check()
        except Exception as exc:
            if getattr(exc, "code", None) != E.FORMAT_TOO_NEW:
                raise
            raise StartError(f"node {self.cfg.self_id}: {exc}") from exc

    def _open_app(self, interrupted: int | None) -> None:
        """The application's state opened (an interrupted snapshot install finished first).
        A file of the application's in a format newer than it reads (error FORMAT_TOO_NEW,
        whatever the application's class for it) stops the start with one line."""
        try:
            if interrupted is not None:
                install_app(self.cfg.store_dir, self.sm, interrupted)
            self._applied = self.sm.applied_index()
        except NeedsSnapshotError as exc:
            self._reseed_from_leader(exc)
        except Exception as exc:
            if getattr(exc, "code", None) != E.FORMAT_TOO_NEW:
                raise
            raise StartError(f"node {self.cfg.self_id}: {exc}") from exc

    def _reseed_from_leader(self, cause: NeedsSnapshotError) -> NoReturn:
        """The application's state cannot be opened nor rebuilt from this log: with another
        voter in the group (which holds every committed entry this member holds: a commit
        needs a majority, so two voters or more), drop the log at a restart in place, its
        promise raised to the log's last index first, so that the member comes back
        *repairing* (it neither votes nor counts toward a commit) and a leader installs a
        snapshot; alone, stop (nobody else holds a copy)."""
        cfg = self.cfg
        conf = self._reseed_conf(cause)  # None: the dLegerPeers group's
        voters = conf.voters if conf is not None else frozenset(cfg.peers)
        others = sorted(voters - {cfg.self_id})
        if not others:
            raise StartError(
                f"node {cfg.self_id}: {cause}; no other voter holds a copy to take a snapshot "
                "from: restore this node's store from a backup"
            ) from cause
        last = self.store.last_index()
        _raise_promise(cfg, last, "the log is dropped")
        first = self.store.first_index()
        rewinds.write_marker(
            cfg.store_dir, rewinds.RewoundMarker(RewindOutcome.NEEDS_SNAPSHOT.value, first - 1, "-")
        )
        fatal_mod.restart(
            "rebuild",
            f"REBUILD_STATE how=snapshot index={first - 1} last={last}: {cause}; dropping the "
            f"log to take a snapshot from the leader (voters {', '.join(others)} hold it)",
        )

    def _recover_promise(self) -> StartState:
        """The promise file read (and the hard state recovered from it if need be);
        StartError when it refuses."""
        cfg = self.cfg
        try:
            promise = promise_file(cfg.store_dir, cfg.promise_path)
            start = recover(cfg.group, cfg.self_id, self.store, promise, self._applied)
        except (ConfigError, PromiseError, FormatTooNewError) as exc:
            raise StartError(f"node {cfg.self_id}: {exc}") from exc
        if start.promise_damaged:
            self.corruption_found["promise"] = 1
        return start

    def _reseed_conf(self, cause: NeedsSnapshotError) -> ConfState | None:
        """The configuration a reseed decides with: the saved one, or when it is damaged what
        the log or the settings say (the file is repaired by the start after the reseed);
        StartError when neither decides (no member is known to hold a copy)."""
        cfg = self.cfg
        try:
            return load_conf(cfg.store_dir, cfg.self_id)
        except DamagedConfFileError as exc:
            local = confrepair.decide_locally(
                cfg.self_id,
                self.store,
                applied=self._applied,
                joins=bool(cfg.join_addr),
                damage=str(exc),
            )
            if local is None:
                raise StartError(
                    f"node {cfg.self_id}: {cause}; and {exc}: which members hold a copy to "
                    "take a snapshot from is unknown: restore membership.json or the store "
                    "from a backup"
                ) from exc
            return local.conf

    def _open_core(self, conf: ConfState | None, start: StartState) -> None:
        """The Raft core over the open store, from the recovered promise and hard state;
        StartError when it refuses."""
        cfg = self.cfg
        try:
            promise = promise_file(cfg.store_dir, cfg.promise_path)
            self._persister = ReadyPersister(
                self.store,
                self._flush,
                sync=cfg.store.flush_disk_type is FlushDiskType.SYNC_FLUSH,
                node_id=cfg.self_id,
                promises=start.writer,
                hard_state=start.hard_state,
                promised=start.promised.index,
                promise_ahead=promise_ahead_entries(cfg.store_dir, promise),
                note_drop=self.note_drop,
                raft_stats=self.raft_stats,
            )
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
        except (ConfigError, PromiseError, FormatTooNewError, FeatureLevelError) as exc:
            raise StartError(f"node {cfg.self_id}: {exc}") from exc
        except CorruptLogError as exc:
            # The replay of the log's configuration entries met damage the open's check did
            # not cover (an older segment): restart with every segment checked.
            self.on_damage(exc, "start")
            raise StartError(f"node {cfg.self_id}: {exc}") from exc  # on_damage restarted
        if conf is None:
            self._save_start_conf()

    def _open_feature_level(self) -> None:
        """At start: the committed feature level (the core's configuration at the commit
        index; the core refused a log above this node's support) raises the store's if need
        be, and the application hears it once."""
        conf = self.core.conf_state_at(self.core.commit_index)
        self._feature_level = max(conf.features, self.store.feature_level)
        self._feature_level_index = conf.index
        self.store.set_feature_level(self._feature_level)
        self._notify_feature_level()

    def _notify_feature_level(self) -> None:
        hook = getattr(self.sm, "on_feature_level", None)
        if callable(hook):
            hook(self._feature_level, self._feature_level_index)

    def feature_level(self) -> int:
        """The group's committed feature level as this member applied it (docs/RAFT.md
        "Feature level"): what the application gates its proposals and files on."""
        return self._feature_level

    def _note_committed_level(self, conf: ConfState) -> None:
        """A committed CONFIG entry set ``conf``: when it raised the feature level, the store
        writes the format of the new level at once (its next checkpoint is due now) and the
        application hears it."""
        if conf.features <= self._feature_level:
            return
        logger.warning(
            "node=%s group=%s feature level %d -> %d committed at index %d",
            self.cfg.self_id,
            self.cfg.group,
            self._feature_level,
            conf.features,
            conf.index,
        )
        self._feature_level = conf.features
        self._feature_level_index = conf.index
        self.store.set_feature_level(conf.features)
        self._last_checkpoint_s = 0.0  # write the new format with the next Ready
        self._notify_feature_level()

    def _check_entries_level(self, entries: Sequence[Entry]) -> None:
        """Before persisting: a CONFIG entry above this node's support must never reach its
        disk (the core drops such appends; this is the last line): stop the process."""
        for e in entries:
            if e.type != EntryType.CONFIG:
                continue
            level = decode_conf(e.body, e.index).features
            if level > self.cfg.supported_feature_level:
                fatal(
                    "feature-level",
                    f"{E.FEATURE_LEVEL_UNSUPPORTED} CONFIG entry {e.index} sets the group's "
                    f"feature level {level}; raftmq {RELEASE} supports up to "
                    f"{self.cfg.supported_feature_level}: upgrade this node",
                )

    def _spawn_tasks(self, conf: ConfState | None) -> None:
        """The node's loops. Fail fast: an exception escaping any of them ends the process
        (prockit.fatal); their cancellation by stop() does not."""
        cfg = self.cfg
        self._tasks = [
            spawn(self._tick_loop(), "tick"),
            spawn(self._ready_loop(), "ready"),
            spawn(self._retention_loop(), "retention"),
        ]
        # Always running, paused while the rate is 0, so that retune() can turn it on and off.
        self.scrubber = Scrubber(
            lambda: self.store,
            self.on_damage,
            cfg.scrub_bytes_per_s,
            min_pass_interval_s=cfg.scrub_min_pass_interval_s,
        )
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
            self._peer_server, pb_grpc.add_DLedgerPeerServicer_to_server, PeerServicer(self)
        )
        self._client_server = grpc.aio.server(
            options=SERVER_OPTIONS,
            interceptors=[GuardInterceptor(self._call_guard)] if self._call_guard else None,
        )
        decodeguard.add_servicer(
            self._client_server, pb_grpc.add_DLedgerClientServicer_to_server, ClientServicer(self)
        )
        client_names = ["raftmq.dledger.v1.DLedgerClient"]
        for register in self._client_services:
            client_names.extend(register(self._client_server))
        peer_port = int(cfg.peers[cfg.self_id].rpartition(":")[2])
        for server, addr, names, mutual in (
            (self._peer_server, cfg.bind_addr(peer_port), ["raftmq.dledger.v1.DLedgerPeer"], True),
            (self._client_server, cfg.bind_addr(cfg.client_port), client_names, False),
        ):
            add_health_and_reflection(server, names)
            bind(server, addr, cfg.tls, StartError, require_client_cert=mutual)
        if cfg.plaintext_client_port:
            plain = f"{PLAINTEXT_CLIENT_HOST}:{cfg.plaintext_client_port}"
            bind_insecure(self._client_server, plain, StartError)

    async def _serve_ports(self) -> None:
        """Start serving the ports bound at start (peers first, then clients)."""
        assert self._peer_server is not None and self._client_server is not None
        await self._peer_server.start()
        if self._socket_server is not None:
            await self._socket_server.serve()
        await self._client_server.start()

    async def _bind_socket(self) -> None:
        """The peer socket's port (dledger.server.peersock), bound but not serving yet, when
        the configuration offers one; StartError when it cannot be bound."""
        cfg = self.cfg
        if not (cfg.peer_socket_enable and cfg.peer_socket_port):
            return
        try:
            server = PeerSocketServer(self, MAX_GRPC_MESSAGE_BYTES)
            await server.bind(cfg.bind_host or cfg.client_host, cfg.peer_socket_port)
        except (OSError, CertificateError) as exc:
            raise StartError(f"peer socket port {cfg.peer_socket_port}: {exc}") from exc
        self._socket_server = server

    def peer_socket_offer(self) -> tuple[int, int]:
        """The peer socket's port and highest protocol version, (0, 0) when not offered (what
        DLedgerPeer.PeerSocket answers)."""
        if self._socket_server is None:
            return 0, 0
        return self._socket_server.port, MAX_PROTOCOL_VERSION

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
        if self._socket_server is not None:
            await self._socket_server.stop()
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
        self._flush.shutdown()
        with contextlib.suppress(Exception):
            self.store.write_checkpoint(self.core.commit_index, self._applied)
        with contextlib.suppress(AttributeError):  # a start that failed before it was opened
            self._persister.close()
        self.store.close()
        logger.info("node=%s stopped", self.cfg.self_id)

    async def wait_closed(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ inputs

    def _wake(self) -> None:
        if self._woken:
            return
        self._woken = True
        fut = self._wake_fut
        if fut is not None:
            self._wake_fut = None
            if not fut.done():  # cancelled with the ready loop's task (at stop)
                fut.set_result(None)

    def wake(self) -> None:
        """Run the ready loop (after an input to the core from outside it)."""
        self._wake()

    def set_readers_waiting(self, waiting: bool) -> None:
        """Readers wait for this node's next apply (or no longer): a follower's answers then
        ask its leader for commit notices without their linger (docs/RAFT.md section 4). On
        the node's event loop; it takes effect with the next answer (no Ready needed)."""
        self.core.set_readers_waiting(waiting)

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
        if m is not None:
            self.on_peer_core_message(sender, m)

    def on_peer_core_message(self, sender: str, m: Message) -> None:
        """A peer's message already converted (``from_pb``, or read in place by the peer
        socket: dledger.server.peerwire.decode_append): checked, then stepped."""
        if m.from_id != sender:
            self.note_drop(
                DROP_SENDER_MISMATCH, f"claiming from={echo(m.from_id)} on stream of {sender}"
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

    def retune(self, **changes: Any) -> None:
        """Change settings of :data:`RETUNABLE_FIELDS` while the node runs (the broker's live
        config: a replicated change applied on every member); ConfigError when the new config
        is invalid, nothing changed then. Each takes effect at its next use: the retention
        loop's next round, the scrubber's next step."""
        unknown = set(changes) - RETUNABLE_FIELDS
        assert not unknown, f"not retunable: {sorted(unknown)}"
        cfg = dataclasses.replace(self.cfg, **changes)  # validated by NodeConfig
        self.cfg = cfg
        if self.scrubber is not None:
            self.scrubber.set_rate(cfg.scrub_bytes_per_s)

    def _retention_early(self) -> bool:
        """Whether the store's file system is at or above the early mark (RocketMQ's
        diskMaxUsedSpaceRatio): retention then deletes expired segments now."""
        mark = self.cfg.retention_early_used_percent
        if not mark:
            return False
        try:
            used = used_percent(os.statvfs(self.cfg.store_dir))
        except OSError as exc:
            logger.debug("node=%s disk usage unknown: %s", self.cfg.self_id, exc)
            return False
        return used >= mark

    async def _retention_loop(self) -> None:
        self.retention_rounds = 0  # rounds done (tests wait for rounds, not for time)
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
            floor = self._retention_applied()
            early = self._retention_early()
            save = getattr(self.sm, "save_state", None)
            if floor < self._applied and callable(save):
                save()  # an idle application's state on disk catches up for the next round
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
                        early=early,
                    ),
                )
            self.retention_rounds += 1
            if deleted:
                hook = getattr(self.sm, "on_prefix_deleted", None)
                if callable(hook):
                    hook(self.store.first_index())
                logger.info(
                    "node=%s retention deleted=%d segments first_index=%d floor=%d early=%s",
                    self.cfg.self_id,
                    deleted,
                    self.store.first_index(),
                    floor,
                    early,
                )

    def _retention_applied(self) -> int:
        """The highest index retention may treat as applied: the state machine's state on disk
        (its optional ``durable_index()``), not only in memory. A restart opens that state and
        applies the log from the entry after it: deleting entries above it would leave the
        restarted application a hole it cannot fill."""
        durable = getattr(self.sm, "durable_index", None)
        return min(self._applied, durable()) if callable(durable) else self._applied

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

    async def set_feature_level(self, level: int) -> tuple[int, int]:
        """Raise the group's feature level to ``level`` (0: the highest this node supports)
        on the leader, answered once committed and applied: returns (the committed level,
        the index of its CONFIG entry). A level the group has already committed answers at
        once, on any member (a retry whose first answer was lost). Raises the core's errors
        (``FeatureLevelError`` naming the member that blocks it, ``ConfChangePendingError``,
        ``NotLeaderError`` ...), :class:`ProposalLostError` or asyncio.TimeoutError."""
        level = level or self.cfg.supported_feature_level
        if level == self._feature_level and self._feature_level_index <= self.core.commit_index:
            return self._feature_level, self._feature_level_index
        proposal = self.core.propose_feature_level(level)
        self._wake()
        await self._wait_applied(proposal)
        return level, proposal.last_index

    async def _wait_applied(self, proposal: Proposal) -> None:
        """Until the apply of ``proposal``'s last entry settles its future (or the append
        timeout does, with TimeoutError). The future is awaited directly under a timer of
        its own: ``asyncio.wait_for`` made a second future and a done-callback, and woke the
        waiting task one loop callback later."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
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
        timer = loop.call_later(self.cfg.append_timeout_ms / 1000, _time_out, future)
        try:
            await future
        finally:
            timer.cancel()

    # ------------------------------------------------------------------ membership

    async def _start_conf(self, promised: int) -> ConfState | None:
        """The configuration saved with the store, checked against the log, or, when the
        file is damaged, repaired (dledger.server.confrepair) and saved again; a node started
        empty to join a group starts as a learner knowing only itself (and saves that, so a
        restart before it was added does not turn it into a voter of the ``dLegerPeers``
        group). StartError when nothing decides."""
        cfg = self.cfg
        try:
            decided = await confrepair.decide(
                cfg.store_dir,
                cfg.self_id,
                self.store,
                applied=self._applied,
                promised=promised,
                joins=bool(cfg.join_addr),
                ask=confrepair.quorum_asker(self, sorted(set(cfg.peers) - {cfg.self_id})),
            )
        except (ConfigError, FormatTooNewError) as exc:
            raise StartError(f"node {cfg.self_id}: {exc}") from exc
        except CorruptLogError as exc:
            # The scan met damage: restart with every segment checked.
            self.on_damage(exc, "start")
            raise StartError(f"node {cfg.self_id}: {exc}") from exc
        conf = decided.conf
        if decided.source != confrepair.FROM_FILE:
            self._note_conf_repair(decided)
        if conf is None and cfg.join_addr and self.store.last_index() == 0:
            conf = joining(cfg.self_id)
            save_conf(cfg.store_dir, conf, is_joining=True)
        return conf

    def _note_conf_repair(self, decided: confrepair.StartConf) -> None:
        """Report a repaired membership file (an ERROR line, the metrics
        ``raftmq_corruption_found_total{found_by="membership"}`` and
        ``raftmq_corruption_membership_repairs_total{source}``) and save what replaced it (the
        settings' is saved once the core holds it, as at any start without a file)."""
        cfg = self.cfg
        self.corruption_found["membership"] = self.corruption_found.get("membership", 0) + 1
        self.membership_repairs = {decided.source: 1}  # one file, repaired once per start
        logger.error(
            "node=%s DAMAGE found by start in %s: %s; REPAIRED from %s: %s",
            cfg.self_id,
            CONF_FILE,
            decided.damage,
            decided.source,
            "the settings (dLegerPeers)" if decided.conf is None else decided.conf.describe(),
        )
        if decided.conf is not None:
            save_conf(cfg.store_dir, decided.conf, is_joining=decided.is_joining)

    def _save_start_conf(self) -> None:
        """A member of a ``dLegerPeers`` group that never changed its membership has no
        membership file, so its core replayed the CONFIG entries of the whole log at this
        start: every stored byte read (20 s of a restart at 30,000,000 stored messages,
        docs/PERFORMANCE.md "A deep backlog"). Saved now, the configuration in force at the
        applied index makes the next start replay only the entries above it, as after a
        membership change (a CONFIG entry applied later is saved before it applies)."""
        conf = self.core.conf_state_at(self._applied)
        save_conf(self.cfg.store_dir, conf)
        logger.info(
            "node=%s membership saved at start applied=%d %s",
            self.cfg.self_id,
            self._applied,
            conf.describe(),
        )

    async def _save_committed_conf(self, committed: Sequence[Entry]) -> None:
        """Before the application applies past a CONFIG entry, save the configuration it
        set: a restart then replays only the CONFIG entries above the applied index."""
        last = max(e.index for e in committed if e.type == EntryType.CONFIG)
        conf = self.core.conf_state_at(last)
        await self._flush.run(functools.partial(save_conf, self.cfg.store_dir, conf))
        logger.info(
            "node=%s membership committed index=%d %s", self.cfg.self_id, last, conf.describe()
        )
        self._note_committed_level(conf)

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
                    supported_feature_level=(
                        self.cfg.supported_feature_level
                        if me
                        else (p.supported_feature_level if p is not None else 0)
                    ),
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
        check_joiner_level(
            self.cfg.group,
            request.node_id,
            request.supported_feature_level,
            self.core.feature_level,
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
            supported_feature_level=self.cfg.supported_feature_level,
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
                if info is not None and info.code in (
                    IncompatibleStoreError.code,
                    FeatureLevelError.code,
                ):
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
        loop = asyncio.get_running_loop()
        while True:
            if not self._woken:
                fut = self._wake_fut = loop.create_future()
                await fut
            self._woken = False
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
        _raise_promise(self.cfg, report.last_index, "the damage cut")

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
        conf_committed = bool(rd.committed) and any(
            e.type == EntryType.CONFIG for e in rd.committed
        )
        committed = rd.committed
        self._check_entries_level(rd.entries)
        # Before the job: a state machine that cannot roll back marks its rebuild durably
        # first, so that no crash leaves the repaired log under the state the bad copy made.
        rebuild = self._rewind(rd) if rd.rewind_to is not None else None
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
                await self._persister.persist(rd)
        for m in rd.messages:
            transport.send(m)
        if conf_committed:
            await self._save_committed_conf(rd.committed)
        if rebuild is not None:
            assert rd.rewind_to is not None
            self._restart_to_rebuild(rd.rewind_to, rebuild)
        self._apply(committed)
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.role, rd.soft_state.term)
        self.core.advance(rd)
        if conf_committed or self.core.conf_state is not self._conf_seen:
            self._sync_members()
        self._arm_notice_release(rd.notices_held)
        if (time.monotonic() - self._last_checkpoint_s) * 1000 >= CHECKPOINT_INTERVAL_MS:
            await self._checkpoint()  # tested here: no coroutine made for a Ready that skips it

    async def _persist_applying(self, rd: Ready, stable: Sequence[Entry]) -> None:
        """The Ready's persist job, and meanwhile the apply of ``stable``: committed entries
        that earlier jobs already stored, so that what they answer does not wait for this
        job's fsync (the disk and the apply overlap, as etcd's apply and WAL write do;
        docs/PERFORMANCE.md "SYNC_FLUSH at 16 and 256 in flight")."""
        job = self._persister.begin(rd)  # in the flush thread's queue (or done) already
        try:
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

    def _rewind(self, rd: Ready) -> RewindOutcome | None:
        """Roll the state machine back to ``rd.rewind_to``: the entries applied above it
        were a damaged or forged copy, replaced by the leader's (the Ready's job writes
        them). Called before that job. None when it rolled back in place; else how its
        state is to be rebuilt, already marked durably (:meth:`_mark_rebuild`): the node
        restarts once the job is done (:meth:`_restart_to_rebuild`)."""
        index = rd.rewind_to
        assert index is not None
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
            outcome = hook(index)
        except Exception as exc:
            fatal("apply", exc)
        if outcome is None or outcome is RewindOutcome.ROLLED_BACK:
            self._applied = index
            return None
        outcome = RewindOutcome(outcome)
        last = max(self.store.last_index(), rd.entries[-1].index if rd.entries else 0)
        self._mark_rebuild(index, outcome, last)
        return outcome

    def _mark_rebuild(self, index: int, outcome: RewindOutcome, last: int) -> None:
        """The state machine cannot roll back to ``index`` in place: record how its state is
        rebuilt at the next start (the marker ``rewound``), and for a snapshot raise the
        promise to ``last`` (the highest index the log held or is about to) first, so that
        the member comes back repairing once its log is dropped. Only here, where the
        leader's copy of every replaced entry is being taken (the Ready follows its append:
        it holds every committed entry), is dropping the log safe."""
        leader = self.core.leader_id or ""
        marker = rewinds.next_restart(self.cfg.store_dir, outcome.value, index, leader, time.time())
        if marker.restarts > rewinds.MAX_REWIND_RESTARTS:
            self._stop_rewind_repeats(marker)
        if outcome is RewindOutcome.NEEDS_SNAPSHOT:
            held = max(last, self.core.commit_index, self._applied)
            _raise_promise(self.cfg, held, "the log is dropped")
        rewinds.write_marker(self.cfg.store_dir, marker)

    def _stop_rewind_repeats(self, marker: rewinds.RewoundMarker) -> NoReturn:
        """One restart to rebuild too many within the window: a peer keeps handing this member
        entries that differ from its leader's. Stop rather than restart for ever (the damage
        path's ``DAMAGE_REPEATS`` precedent): the member's appends all claim its leader's id,
        so refusing "the sender" would refuse the leader that repairs it. The state machine
        already marked its rebuild; the log holds the bad copy, which the next start replays
        and the leader's next append finds again (nothing is lost). The count is dropped
        first: a start by a person begins a new one (else its first repair would stop it)."""
        rewinds.clear_marker(self.cfg.store_dir)
        fatal(
            "rewind",
            f"REWIND_REPEATS {marker.restarts} restarts to rebuild the state after content "
            f"repairs within {rewinds.REWIND_RESTART_WINDOW_S:.0f} s (the last: entries "
            f"{marker.index + 1}..{self._applied} replaced by leader "
            f"{marker.leader or 'unknown'}'s copy): a peer keeps sending this member appends "
            "that claim the leader's id and carry other entries (a forgery: on an --insecure "
            "group any peer can claim any id). Turn on mTLS for the peer port, find the "
            "sender by its connections to this member's peer port, then start this member "
            "again (it rebuilds its state by itself; the count starts anew)",
        )

    def _restart_to_rebuild(self, index: int, outcome: RewindOutcome) -> None:
        """Restart this process in place (same PID, as for damage), the Ready's job done: the
        next start rebuilds the state, by a replay of the repaired log (the state machine
        marked itself) or from a leader's snapshot (the log dropped first)."""
        what = (
            "rebuilding the state by a replay of the repaired log from its first entry"
            if outcome is RewindOutcome.REPLAY_AT_START
            else "dropping the log to take a snapshot from the leader (the log's start was "
            "deleted: no replay can rebuild the state)"
        )
        fatal_mod.restart(
            "rewind",
            f"REBUILD_STATE how={outcome.value} index={index} applied={self._applied} "
            f"leader={self.core.leader_id or ''}: entries {index + 1}..{self._applied} this "
            "member applied differed by content from its leader's and were replaced; the "
            f"state machine cannot roll them back in place: {what}",
        )

    def _carry_out_rebuild(self) -> None:
        """A rebuild the previous run decided (:meth:`_mark_rebuild`): count it and,
        for a snapshot, drop the log before the store opens."""
        marker = rewinds.read_marker(self.cfg.store_dir)
        if marker is None:
            return
        if rewinds.in_window(marker, time.time()):
            self.rewind_restarts_recent = marker.restarts
        if marker.how == rewinds.DONE:
            rewinds.carried_out(self.cfg.store_dir, marker)
            return
        self.state_rebuilds[marker.how] = self.state_rebuilds.get(marker.how, 0) + 1
        if marker.how == RewindOutcome.NEEDS_SNAPSHOT.value:
            rewinds.drop_log(self.cfg.store_dir)
        logger.warning(
            "node=%s state rebuilt after a content repair at index %d (leader %s): %s",
            self.cfg.self_id,
            marker.index,
            marker.leader,
            "the log was dropped, the leader sends a snapshot"
            if marker.how == RewindOutcome.NEEDS_SNAPSHOT.value
            else "the application replays the log",
        )
        rewinds.carried_out(self.cfg.store_dir, marker)

    async def _install_snapshot(self, meta: SnapshotMeta) -> None:
        """A Ready's snapshot: the staged log and files replace this node's; the core reads
        the new store from now on. Any failure ends the process (a restart finishes it)."""
        try:
            async with self._store_lock:
                store = await self.snapshots_in.install(meta)
                self.store = store
                self._persister.store = store
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
        self._note_committed_level(self.core.conf_state_at(meta.index))
        logger.info(
            "node=%s snapshot installed index=%d term=%d first_index=%d",
            self.cfg.self_id,
            meta.index,
            meta.term,
            store.first_index(),
        )

    def _arm_notice_release(self, held: bool) -> None:
        """Step 6 of the Ready contract: release the held commit notices
        COMMIT_NOTICE_LINGER_MS after the hold began. A Ready that holds none ends the hold
        (the next one lingers in full: a release timed from an earlier hold came early, a
        notice per send at 1 in flight, docs/PERFORMANCE.md); the pending timer is not
        cancelled but finds no hold, or a later one, which it waits out. At one send in
        flight a hold begins and ends once per send: one clock read each, and one timer per
        linger instead of a timer armed and cancelled per send."""
        if not held:
            self._notice_hold_since = None
            return
        if self._notice_hold_since is not None:
            return
        loop = asyncio.get_running_loop()
        self._notice_hold_since = loop.time()
        if self._notice_release is None:
            linger_s = COMMIT_NOTICE_LINGER_MS / 1000
            self._notice_release = loop.call_later(linger_s, self._release_notices)

    def _release_notices(self) -> None:
        """The linger of the held commit notices is over: the core sends those still due.
        A timer that finds no hold does nothing; one that finds a hold begun after it was
        armed waits for the rest of that hold's linger."""
        self._notice_release = None
        since = self._notice_hold_since
        if since is None or self._stopped.is_set():
            return
        loop = asyncio.get_running_loop()
        due = since + COMMIT_NOTICE_LINGER_MS / 1000
        if loop.time() < due - _TIMER_SLACK_S:
            self._notice_release = loop.call_at(due, self._release_notices)
            return
        self._notice_hold_since = None
        self.core.release_notices()
        self._wake()

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

    async def _checkpoint(self) -> None:
        """The applied/commit checkpoint (at most every CHECKPOINT_INTERVAL_MS)."""
        self._last_checkpoint_s = time.monotonic()
        # In the flush thread: the checkpoint is an atomic file write with fsyncs.
        job = functools.partial(
            self._persister.checkpoint_job, self.core.commit_index, self._applied
        )
        await self._flush.run(job)

    async def wait_leader_change(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leader_changed.wait(), timeout_s)


def _raise_promise(cfg: NodeConfig, index: int, before: str) -> None:
    """Raise the promise file to ``index`` (when below) before this member loses log
    entries up to it: it then starts repairing (no votes, no quorums) until a leader has
    sent it past ``index``. With no process-held writer: the caller is about to replace
    the process or is opening it."""
    path = promise_file(cfg.store_dir, cfg.promise_path)
    current = read_promise(path)
    if current is not None and current.promised_index >= index:
        return
    hard = current.hard_state if current is not None else _stored_hard_state(cfg)
    writer = PromiseWriter(path, cfg.group, cfg.self_id, current)
    try:
        writer.write(index, hard)
    finally:
        writer.close()
    logger.warning(
        "node=%s promise raised to %d before %s (was %s): repairing until "
        "the leader sends it past that index",
        cfg.self_id,
        index,
        before,
        "none" if current is None else current.promised_index,
    )


def _stored_hard_state(cfg: NodeConfig) -> HardState:
    """The store's ``meta`` (term and vote), read while the store is opening; an empty hard
    state when it is missing or damaged (the promise's copy then starts at term 0, and the
    newer of the two is what the node starts from: dledger.server.promises.recover)."""
    try:
        return codec.decode_hard_state((Path(cfg.store_dir) / META_FILE).read_bytes())
    except (OSError, codec.RecordError):
        return HardState()


def _time_out(future: asyncio.Future[None]) -> None:
    """A proposal's append timeout ran out before its apply answered it."""
    if not future.done():
        future.set_exception(TimeoutError())


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
