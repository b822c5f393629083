"""The composition root of a broker process: where everything is built, once, in one order.

Two functions build a node's broker (docs/ARCHITECTURE.md, "The composition root"):

- :func:`assemble` builds the broker's components and its v1 servicer over any
  :class:`broker.components.raftnode.RaftNode` (the real node, or a test's stand-in) and a state
  machine, each component receiving what it uses in its constructor. Nothing is set on a component
  after it was built.
- :func:`build` builds the whole process from ``broker.conf``: the state machine, the call
  guard, the DLedger node, then :func:`assemble` over that node, then what serves beside it
  (the RocketMQ 5 port, the RocketMQ 4.x remoting port, ``/metrics``, the NameServer
  registration, the scrubber).
  ``broker.__main__`` starts and stops what it returns.

This is the one broker module that names ``dledger.server.node.DLedgerNode``; every other one
uses the node through :class:`broker.components.raftnode.RaftNode`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from broker.components.applied import AppliedMessages, NodeContext
from broker.components.authadmin import AuthAdmin
from broker.components.consumers import ConsumerGroups
from broker.components.delaydelivery import Scheduler
from broker.components.disk import DiskGuard
from broker.components.leaderops import LeaderOps
from broker.components.lookups import Lookups
from broker.components.offsets import ConsumerOffsets
from broker.components.pop import Pops
from broker.components.producers import ProducerRegistry
from broker.components.pulling import PullPath
from broker.components.raftnode import RaftNode
from broker.components.retry import Retries
from broker.components.scrubber import Scrubber
from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.components.stats import BrokerStats
from broker.components.subscriptions import SubscriptionGroups
from broker.components.timermoves import Timers
from broker.components.topics import Topics
from broker.components.transactions import Transactions
from broker.config import BrokerConfig, ConfigError, node_config, service_config, v2_settings
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.internal.service import LeaderOpsServicer
from broker.frontends.v1.service import BrokerServicer
from broker.liveconfig import LiveConfig, LiveSettings, service_overlay
from broker.metrics import BrokerExporter, BrokerMetrics, identity_labels
from broker.registration import BrokerRegistrar
from broker.state.auth.secrets import SecretBox, load_key_file
from broker.state.machine import BrokerStateMachine
from dledger.log import Entry
from dledger.server.metrics import RaftStats, raft_families
from dledger.server.node import DLedgerNode
from mqsecurity.credentials import Credentials


@dataclass(frozen=True, slots=True)
class Broker:
    """One node's broker: its components over one Raft node and state machine, the v1
    servicer over them, and the leader operations (``leader_ops``) with their service for the
    forwards of the other members (``leader_service``). The front ends, the metrics and the
    process wiring take what they use from here. ``guard`` is the node's call guard (None:
    no users); ``disk_guard`` refuses sends above the disk watermark (None: never);
    ``stats`` is counted into when the process serves metrics (None: nothing is).
    :func:`assemble` also takes ``secret_box``, which seals user secrets (None: users cannot
    be created here), and ``init_user``, the Super user a leader creates when the group has
    none."""

    node: RaftNode
    sm: BrokerStateMachine
    cfg: ServiceConfig
    applied: AppliedMessages
    topics: Topics
    sender: SendPath
    puller: PullPath
    offsets: ConsumerOffsets
    lookups: Lookups
    consumers: ConsumerGroups
    producers: ProducerRegistry
    retries: Retries
    scheduler: Scheduler
    timers: Timers
    auth: AuthAdmin
    pops: Pops
    txns: Transactions
    subgroups: SubscriptionGroups
    leader_ops: LeaderOps
    servicer: BrokerServicer
    leader_service: LeaderOpsServicer
    guard: AuthGuard | None
    disk_guard: DiskGuard | None
    stats: BrokerStats | None


def assemble(
    node: RaftNode,
    sm: BrokerStateMachine,
    cfg: ServiceConfig,
    *,
    disk_guard: DiskGuard | None = None,
    secret_box: SecretBox | None = None,
    init_user: Credentials | None = None,
    guard: AuthGuard | None = None,
    stats: BrokerStats | None = None,
    broker_conf: BrokerConfig | None = None,
) -> Broker:
    """The broker of ``node``, each component built after the ones it takes (the arguments:
    :class:`Broker`)."""
    ctx = NodeContext(node, sm, cfg, service_overlay)
    applied = AppliedMessages(ctx)
    topics = Topics(ctx)
    txns = Transactions(applied)
    sender = SendPath(ctx, topics, disk_guard, stats, txns.prepare)
    puller = PullPath(topics, applied, stats=stats)
    offsets = ConsumerOffsets(topics, applied)
    lookups = Lookups(applied)
    consumers = ConsumerGroups(topics)
    producers = ProducerRegistry(cfg.producers_per_user)
    retries = Retries(topics, applied, sender)
    scheduler = Scheduler(applied)
    timers = Timers(applied)
    auth = AuthAdmin(ctx, secret_box, init_user)
    pops = Pops(topics, applied, retries, cfg.pop_max_attempts, cfg.pop_min_invisible_ms)
    subgroups = SubscriptionGroups(ctx, cfg.pop_max_attempts)
    leader_ops = LeaderOps(node, sender, pops, txns, subgroups)
    servicer = BrokerServicer(
        node,
        applied=applied,
        topics=topics,
        puller=puller,
        offsets=offsets,
        lookups=lookups,
        consumers=consumers,
        producers=producers,
        retries=retries,
        subgroups=subgroups,
        leader_ops=leader_ops,
        auth=auth,
        guard=guard,
        live_config=LiveConfig(ctx, broker_conf),
    )
    return Broker(
        node=node, sm=sm, cfg=cfg, applied=applied, topics=topics, sender=sender,
        puller=puller, offsets=offsets, lookups=lookups, consumers=consumers,
        producers=producers, retries=retries, scheduler=scheduler, timers=timers, auth=auth,
        pops=pops, txns=txns, subgroups=subgroups, leader_ops=leader_ops, servicer=servicer,
        leader_service=LeaderOpsServicer(node, leader_ops, guard),
        guard=guard, disk_guard=disk_guard, stats=stats,
    )  # fmt: skip


class Port(Protocol):
    """A front end serving beside the node (the RocketMQ 5 port): bound before the node
    starts, served once it runs, stopped before it stops."""

    def bind(self) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Process:
    """What one ``mqbroker`` process runs, built by :func:`build`; ``broker.__main__`` starts
    the node and these around it. None: not configured."""

    node: RaftNode
    broker: Broker
    v2_port: Port | None
    remoting_port: Port | None
    exporter: BrokerExporter | None
    registrar: BrokerRegistrar | None
    scrubber: Scrubber


def build(cfg: BrokerConfig) -> Process:
    """The full broker process of ``cfg``: a DLedger node applying into the broker state
    machine, serving the v1 servicer on its client port, every call of which passes the ACL
    guard. `ConfigError` when the ACL key file cannot be used or the RocketMQ 5 port cannot be
    served (its packages are missing)."""
    box = load_key_file(cfg.aclEncryptionKeyPath) if cfg.aclEncryptionKeyPath else None
    sm = BrokerStateMachine(
        cfg.storePathRootDir,
        dedup_window_ms=cfg.dedupWindowSeconds * 1000,
        dedup_max_ids=cfg.dedupWindowMaxIds,
        hash_slots=cfg.maxHashSlotNum,
        max_index_records=cfg.maxIndexNum,
    )
    late = _LateBroker()
    guard = _guard(cfg, sm, box, late)
    metrics = bool(cfg.metricsPort)
    node = DLedgerNode(
        node_config(cfg),
        sm,
        client_services=[late.register],
        call_guard=guard,
        raft_stats=RaftStats() if metrics else None,
    )
    sm.attach(LazyLog(node))
    disk_guard = DiskGuard(
        cfg.dLegerSelfId,
        cfg.storePathRootDir,
        cfg.disk_watermarks,
        next_allocation=node.log_next_allocation_bytes,
    )
    broker = assemble(
        node,
        sm,
        service_config(cfg),
        disk_guard=disk_guard,
        secret_box=box,
        init_user=cfg.initAuthenticationUser,
        guard=guard,
        stats=BrokerStats() if metrics else None,
        broker_conf=cfg,
    )
    late.fill(broker)
    exporter = (
        BrokerExporter(
            cfg.bind_host,
            cfg.metricsPort,
            _metrics(broker, node),
            cfg.metrics_tls_files,
            identity_labels(cfg.brokerClusterName, cfg.brokerName, cfg.dLegerSelfId),
        )
        if metrics
        else None
    )
    registrar = BrokerRegistrar(cfg, sm) if cfg.namesrv_addrs else None
    scrubber = Scrubber(sm, cfg.scrubRecordsPerSecond)
    # The live keys read outside the service (disk marks, scrub rates, dedup window), pushed to
    # their components whenever the group's override table changes, from now on.
    sm.set_config_hook(LiveSettings(cfg, sm, node, disk_guard, scrubber).apply)
    ports = v2_port(cfg, broker), remoting_port(cfg, broker)
    return Process(node, broker, *ports, exporter, registrar, scrubber)


class _LateBroker:
    """The one cycle of the process, closed here. The node takes the broker's hooks when it
    is built (the v1 servicer for its client port, the call guard), while the broker takes the
    node; and the guard's check of a call naming stored messages reads them through the
    broker. So the node is built with hooks that reach the broker through this, filled right
    after :func:`assemble` and before the node starts; nothing calls a hook before."""

    def __init__(self) -> None:
        self._broker: Broker | None = None

    def fill(self, broker: Broker) -> None:
        assert self._broker is None, "the broker is built once"
        self._broker = broker

    def _get(self) -> Broker:
        assert self._broker is not None, "a node hook ran before the broker was assembled"
        return self._broker

    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        """The node's client-port registrar: the v1 servicer and the leader operations its
        members forward (called from ``start()``)."""
        broker = self._get()
        return [*broker.servicer.register(server), *broker.leader_service.register(server)]

    def topic_at(self, position: int) -> str:
        """The guard's view of stored messages: the topic of the applied one at
        ``position``."""
        return self._get().applied.message(position).topic


def _guard(
    cfg: BrokerConfig, sm: BrokerStateMachine, box: SecretBox | None, late: _LateBroker
) -> AuthGuard | None:
    """The ACL guard of every client call, when authentication or authorization is on."""
    settings = AuthSettings(
        authentication_enabled=cfg.authenticationEnabled,
        authorization_enabled=cfg.authorizationEnabled,
        max_skew_ms=cfg.authenticationMaxClockSkewMs,
        cluster_name=cfg.brokerClusterName,
    )
    return AuthGuard(sm, settings, box, late.topic_at) if settings.active else None


def _metrics(broker: Broker, node: DLedgerNode) -> BrokerMetrics:
    """What ``/metrics`` reads: the Raft member's families (dledger's, of the concrete node)
    and the broker's components."""
    assert broker.stats is not None, "metrics are counted only when the process serves them"
    return BrokerMetrics(
        broker.node,
        broker.sm,
        broker.offsets,
        broker.stats,
        polls=broker.puller.polls,
        store_path=str(broker.sm.root),
        raft_families=functools.partial(raft_families, node),
        delay_levels=len(broker.cfg.delay_levels_ms),
        disk_guard=broker.disk_guard,
        clients=lambda: (broker.producers.live_count(), broker.consumers.live_count()),
    )


def v2_port(cfg: BrokerConfig, broker: Broker) -> Port | None:
    """The RocketMQ 5 front end over the same components (docs/RMQ5.md), when
    ``grpcServerPort`` is set; its stubs are loaded only then (`ConfigError` when they cannot
    be)."""
    if not cfg.grpcServerPort:
        return None
    try:
        from broker.frontends.v2.server import V2Port, V2Security
        from broker.frontends.v2.service import V2Config
    except ImportError as exc:
        raise ConfigError(f"cannot serve grpcServerPort: {exc}") from None
    v2cfg = V2Config(**v2_settings(cfg))
    security = V2Security(
        tls=cfg.tls_files if cfg.tlsEnable else None,
        guard=broker.guard,
        client=cfg.client_security,
        plaintext_port=cfg.grpcServerPlaintextPort,
    )
    host = cfg.bind_host
    return V2Port(broker, v2cfg, f"[{host}]" if ":" in host else host, cfg.namesrv_addrs, security)


def remoting_port(cfg: BrokerConfig, broker: Broker) -> Port | None:
    """RocketMQ 4.x's remoting front end over the same components (docs/REMOTING.md), when
    ``remotingListenPort`` is set: TLS with the node's certificate when ``tlsEnable`` is on
    (RocketMQ's ``tls.enable``); forwards travel as the node's own calls do."""
    if not cfg.remotingListenPort:
        return None
    from broker.frontends.remoting.port import RemotingPort

    return RemotingPort(
        broker,
        cfg.bind_host,
        cfg.remotingListenPort,
        broker.cfg.store_host,
        cfg.tls_files if cfg.tlsEnable else None,
        cfg.client_security,
    )


class LazyLog:
    """The state machine's view of the node's log (``BrokerStateMachine.attach``): the node's
    store exists once the node started (before it applies anything), and a snapshot install
    replaces it, so each read asks the node for it."""

    def __init__(self, node: RaftNode) -> None:
        self._node = node

    def body_position(self, index: int) -> int:
        return self._node.store.body_position(index)

    def first_index(self) -> int:
        return self._node.store.first_index()

    def last_index(self) -> int:
        return self._node.store.last_index()

    def read(self, index: int) -> Entry:
        return self._node.store.read(index)

    def read_at(self, position: int, size: int) -> bytes:
        return self._node.store.read_at(position, size)
