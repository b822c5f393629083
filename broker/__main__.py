"""``mqbroker -c FILE``: run one broker-group member in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from mqsecurity import handshakes

if __name__ == "__main__":  # `python -m broker`: before grpc is imported (docs/SECURITY.md)
    handshakes.tap_before_grpc(sys.argv[1:])

import argparse
import asyncio
import faulthandler
import gc
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import grpc
import uvloop

from broker.auth.guard import AuthGuard, AuthSettings
from broker.auth.secrets import load_key_file
from broker.config import KEYS, BrokerConfig, ConfigError, load_config, node_config
from broker.disk import DiskGuard
from broker.metrics import BrokerExporter
from broker.registration import BrokerRegistrar
from broker.scrubber import Scrubber
from broker.service import BrokerServicer, ServiceConfig
from broker.state import BrokerStateMachine
from dledger.fatal import spawn
from dledger.log import Entry
from dledger.procs import serve_until_signalled
from dledger.server import DLedgerNode, StartError
from mqcli import server_parser
from mqcli.logs import check_log_arguments, setup_server_logging


def _service_config(cfg: BrokerConfig) -> ServiceConfig:
    """The broker service's settings from ``broker.conf``."""
    return ServiceConfig(
        store_host=cfg.brokerIP1,
        store_port=cfg.listenPort,
        auto_create_topic=cfg.autoCreateTopicEnable,
        default_topic_queue_nums=cfg.defaultTopicQueueNums,
        max_message_size_bytes=cfg.maxMessageSize,
        slave_read_enable=cfg.slaveReadEnable,
        memory_ratio_percent=cfg.accessMessageInMemoryMaxRatio,
        offset_commit_interval_ms=cfg.consumerOffsetCommitIntervalMs,
        delay_levels_ms=cfg.delay_levels_ms,
        pop_max_attempts=cfg.popMaxDeliveryAttempts,
        subgroups_per_user=cfg.subscriptionGroupsPerUser,
        pop_waiters_per_user=cfg.popWaitersPerUser,
        long_polls_per_user=cfg.longPollsPerUser,
        consumers_per_user=cfg.consumersPerUser,
        queue_locks_per_user=cfg.queueLocksPerUser,
        pending_offsets_per_user=cfg.pendingOffsetsPerUser,
        topics_per_user=cfg.topicsPerUser,
        offset_groups_per_user=cfg.offsetGroupsPerUser,
        pop_min_invisible_ms=cfg.popMinInvisibleTimeMs,
        txn_timeout_ms=cfg.transactionTimeOut,
        txn_check_interval_ms=cfg.transactionCheckInterval,
        txn_check_max=cfg.transactionCheckMax,
        timer_max_delay_ms=cfg.timerMaxDelaySec * 1000,
    )


def build(cfg: BrokerConfig) -> tuple[DLedgerNode, BrokerStateMachine, BrokerServicer]:
    """The full broker: a DLedger node applying into the broker state machine, with the
    Broker service on its client port, every call of which passes the ACL guard.
    `ConfigError` when the ACL key file cannot be used."""
    box = load_key_file(cfg.aclEncryptionKeyPath) if cfg.aclEncryptionKeyPath else None
    sm = BrokerStateMachine(
        cfg.storePathRootDir,
        dedup_window_ms=cfg.dedupWindowSeconds * 1000,
        dedup_max_ids=cfg.dedupWindowMaxIds,
        hash_slots=cfg.maxHashSlotNum,
        max_index_records=cfg.maxIndexNum,
    )
    # The servicer needs the node and the node takes the servicer's registrar: the registrar
    # is looked up when the node starts (after both exist).
    registrars: list[Callable[[grpc.aio.Server], Sequence[str]]] = []
    settings = AuthSettings(
        authentication_enabled=cfg.authenticationEnabled,
        authorization_enabled=cfg.authorizationEnabled,
        max_skew_ms=cfg.authenticationMaxClockSkewMs,
        cluster_name=cfg.brokerClusterName,
    )
    guard = AuthGuard(sm, settings, box) if settings.active else None
    node = DLedgerNode(
        node_config(cfg),
        sm,
        client_services=[lambda s: registrars[0](s)],
        call_guard=guard,
    )
    sm.attach(_LazyLog(node))
    servicer = BrokerServicer(
        node,
        sm,
        _service_config(cfg),
        disk_guard=DiskGuard(
            cfg.dLegerSelfId,
            cfg.storePathRootDir,
            cfg.disk_watermarks,
            next_allocation=node.log_next_allocation_bytes,
        ),
        secret_box=box,
        init_user=cfg.initAuthenticationUser,
    )
    registrars.append(servicer.register)
    if guard is not None:
        applied = servicer.applied
        guard.topic_at = lambda position: applied.message(position).topic
    return node, sm, servicer


def rmq5_port(cfg: BrokerConfig, node: DLedgerNode, servicer: BrokerServicer) -> _Port | None:
    """The RocketMQ 5 front end over the same components (docs/RMQ5.md), when
    ``grpcServerPort`` is set; its stubs are loaded only then."""
    if not cfg.grpcServerPort:
        return None
    from broker.rmq5.server import V2Port, V2Security
    from broker.rmq5.service import V2Config

    v2cfg = V2Config(
        cfg.brokerName,
        cfg.brokerIP1,
        cfg.grpcServerPort,
        cfg.maxMessageSize,
        cfg.popMaxDeliveryAttempts,
        renew_slice_ms=cfg.popAutoRenewInvisibleMs,
        renew_max_ms=cfg.popAutoRenewMaxMs,
        clients_per_user=cfg.grpcClientsPerUser,
    )
    security = V2Security(
        tls=cfg.tls_files if cfg.tlsEnable else None,
        guard=node.call_guard,
        client=cfg.client_security,
        plaintext_port=cfg.grpcServerPlaintextPort,
    )
    return V2Port(
        node,
        servicer.topics,
        servicer.sender,
        servicer.pops,
        v2cfg,
        cfg.brokerIP1,
        cfg.namesrv_addrs,
        security,
        servicer.txns,
    )


class _Port(Protocol):
    def bind(self) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class _LazyLog:
    """The node's store, which exists once the node started (before it applies anything)."""

    def __init__(self, node: DLedgerNode) -> None:
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


async def _serve(
    node: DLedgerNode,
    sm: BrokerStateMachine,
    registrar: BrokerRegistrar | None = None,
    v2_port: _Port | None = None,
    exporter: BrokerExporter | None = None,
    scrubber: Scrubber | None = None,
) -> None:
    if v2_port is not None:
        v2_port.bind()
    if exporter is not None:
        exporter.bind(asyncio.get_running_loop())
    await node.start()
    if v2_port is not None:
        await v2_port.start()
    if exporter is not None:
        exporter.start()
    if scrubber is not None:
        scrubber.start()
    if registrar is not None:
        registrar.start()

        # Removed from the group: routes must stop naming this node (it serves nothing new).
        def unregister() -> None:
            spawn(registrar.stop(), "unregister-removed")

        node.removed_listeners.append(unregister)

    async def stop() -> None:
        if registrar is not None:
            await registrar.stop()  # unregister first: routes drop this node at once
        if exporter is not None:
            await exporter.stop()
        if v2_port is not None:
            await v2_port.stop()
        if scrubber is not None:
            await scrubber.stop()
        await node.stop()
        sm.close()  # the node applies nothing after stop(): final snapshot

    await serve_until_signalled(stop)


# The send path allocates short-lived tuples, protobuf objects and futures by the hundred per
# call, and a broker holds long-lived ones by the hundred thousand (dedup window, results,
# topic and offset tables). With CPython's default gen-0 threshold of 700 the cyclic collector
# ran several hundred times a second and walked the long-lived ones again and again. Raising
# the thresholds and freezing what start-up made keeps it to a few cheap runs a second.
GC_THRESHOLDS = (50_000, 20, 50)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop's event loop: at one send in flight the leader's loop turns
    about 25 times per message (gRPC completions, the ready loop, timers), and uvloop's turns
    and callbacks cost less CPU than the standard loop's (docs/PERFORMANCE.md, issue #23)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def enable_crash_traces() -> None:
    """Make a crash by signal (SIGBUS from a mapped file whose blocks a full disk could not
    give, SIGSEGV, SIGFPE, SIGABRT, SIGILL) print ``Fatal Python error: Bus error`` and every
    thread's stack to stderr (the node's log) instead of ending the process without a line."""
    faulthandler.enable(file=sys.stderr, all_threads=True)


def build_parser() -> argparse.ArgumentParser:
    """``mqbroker``'s command line (the systemd unit's test parses its ExecStart with it)."""
    parser = server_parser(
        "mqbroker",
        "Run one member of a raftmq broker group (a DLedger/Raft node).",
        "broker.conf keys",
        {
            name: f"{key.doc} (default: {'required' if key.default is None else key.default})"
            for name, key in KEYS.items()
        },
    )
    parser.add_argument("-c", "--config", required=True, help="broker.conf (properties format)")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        default="",
        help="sample the node with pyinstrument (a test extra) and write the profile, as text, "
        "to FILE when it stops (docs/PERFORMANCE.md)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    enable_crash_traces()
    check_log_arguments(parser, ns)
    setup_server_logging(ns)
    try:
        cfg = load_config(ns.config)
        if argv is None:  # a process of its own (it may re-execute itself)
            handshakes.count_refused_handshakes(cfg.tlsEnable)
        node, sm, servicer = build(cfg)
    except ConfigError as exc:
        print(f"mqbroker: {exc}", file=sys.stderr)
        return 2
    try:
        v2_port = rmq5_port(cfg, node, servicer)
    except ImportError as exc:
        print(f"mqbroker: cannot serve grpcServerPort: {exc}", file=sys.stderr)
        return 2
    registrar = BrokerRegistrar(cfg, sm) if cfg.namesrv_addrs else None
    scrubber = Scrubber(sm, cfg.scrubRecordsPerSecond)
    exporter = (
        BrokerExporter(cfg.brokerIP1, cfg.metricsPort, servicer, cfg.metrics_tls_files)
        if cfg.metricsPort
        else None
    )
    tune_gc()
    profiler = None
    if ns.profile:
        try:
            from pyinstrument import Profiler
        except ImportError:
            print(
                "mqbroker: --profile needs pyinstrument (pip install pyinstrument)", file=sys.stderr
            )
            return 2
        profiler = Profiler(interval=0.001, async_mode="disabled")
        profiler.start()
    try:
        run_event_loop(_serve(node, sm, registrar, v2_port, exporter, scrubber))
    except StartError as exc:
        print(f"mqbroker: cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        if profiler is not None:
            profiler.stop()
            with open(ns.profile, "w") as f:
                f.write(profiler.output_text(unicode=False, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
