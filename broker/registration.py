"""Registration with the NameServers: every node tells every NameServer in ``namesrvAddr`` who
it is (cluster, group, node id, Raft role and term, client address) and its whole topic table,
every ``registerBrokerPeriod`` and at once on any change (role, term or leader changed; a topic
created, updated or deleted).

One background task per NameServer, so a NameServer that is down or hung only ever delays
itself: each call has a short deadline, a failed one is retried after at most
:data:`RETRY_AFTER_FAILURE_MS`, and failures are logged at most once per period per NameServer.
On a clean stop the node unregisters, so routes drop it at once instead of after
``brokerExpiredTime``.

With ``tlsEnable`` the NameServers are reached over TLS (their certificates checked against
``tlsServerTrustCertPath``). With a member certificate (``tlsServerCertPath``) every
registration and unregistration is signed with its key (`mqsecurity.membersig`), so a
NameServer with ``brokerAuthenticationEnabled`` knows it comes from a member of the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc

from broker.config import BrokerConfig
from broker.state.features import NODE_SUPPORTED_LEVEL
from broker.state.machine import BrokerStateMachine
from mqrelease import RELEASE
from mqsecurity.channels import open_aio_channel
from mqsecurity.membersig import MemberSigner
from prockit.fatal import supervise

logger = logging.getLogger(__name__)

# A NameServer answers from memory in well under a millisecond; 3 s only cuts off a hung one.
REGISTER_DEADLINE_MS = 3000
# Unregistering happens while the node stops: do not hold the shutdown up for long.
UNREGISTER_DEADLINE_MS = 1000
# After a failed registration (NameServer down or restarting) try again this soon rather than
# a whole period later, so a restarted NameServer learns about the node within seconds.
RETRY_AFTER_FAILURE_MS = 3000
# gRPC's default reconnect backoff grows to 120 s: a restarted NameServer would then be
# ignored for minutes. Keep the backoff short (connection attempts to loopback/LAN are cheap).
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
_SERVICE = pb.DESCRIPTOR.services_by_name["NameServer"].full_name
# The gRPC method paths a member signature covers (mqsecurity.membersig).
REGISTER_METHOD = f"/{_SERVICE}/RegisterBroker"
UNREGISTER_METHOD = f"/{_SERVICE}/UnregisterBroker"


@dataclass(slots=True)
class _Target:
    addr: str
    channel: grpc.aio.Channel
    stub: pb_grpc.NameServerStub
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failing: bool = False
    last_error_log_s: float = float("-inf")
    registrations: int = 0


class BrokerRegistrar:
    """Registers one broker node with every NameServer. :meth:`start` inside the event loop
    (after the node started), :meth:`stop` before the node stops."""

    def __init__(
        self,
        cfg: BrokerConfig,
        sm: BrokerStateMachine,
        *,
        register_deadline_ms: int = REGISTER_DEADLINE_MS,
    ) -> None:
        self.cfg = cfg
        self.sm = sm
        self.period_s = cfg.registerBrokerPeriod / 1000
        self.deadline_s = register_deadline_ms / 1000
        self._addrs = cfg.namesrv_addrs
        self._targets: list[_Target] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        files = cfg.tls_files
        self._signer = (
            MemberSigner(files.cert_path, files.key_path)
            if files is not None and files.cert_path and files.key_path
            else None
        )
        sm.add_change_listener(self.notify)

    @property
    def enabled(self) -> bool:
        return bool(self._addrs)

    def notify(self) -> None:
        """Something NameServers must know changed: register with all of them now."""
        for t in self._targets:
            t.wake.set()

    def signature(self, method: str, request: Message) -> tuple[tuple[str, str | bytes], ...]:
        """The member signature headers of one call (none without a member certificate)."""
        if self._signer is None:
            return ()
        return self._signer.metadata(method, request.SerializeToString(deterministic=True))

    def request(self) -> pb.RegisterBrokerRequest:
        sm = self.sm
        return pb.RegisterBrokerRequest(
            cluster=self.cfg.brokerClusterName,
            broker_name=self.cfg.brokerName,
            node_id=self.cfg.dLegerSelfId,
            role=sm.role.name,
            client_addr=self.cfg.client_addr,
            term=sm.term,
            topics=[
                pb.TopicConfig(
                    topic_name=t.name,
                    read_queue_nums=t.read_queue_nums,
                    write_queue_nums=t.write_queue_nums,
                    perm=t.perm,
                    message_type=t.message_type,
                )
                for _, t in sorted(sm.topics.items())
            ],
            heartbeat_period_ms=self.cfg.registerBrokerPeriod,
            rmq5_addr=self.cfg.rmq5_addr,
            remoting_addr=self.cfg.remoting_addr,
            release=RELEASE,
            supported_feature_level=NODE_SUPPORTED_LEVEL,
            feature_level=sm.feature_level,
        )

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for addr in self._addrs:
            channel = open_aio_channel(addr, self.cfg.client_security, CHANNEL_OPTIONS)
            target = _Target(addr, channel, pb_grpc.NameServerStub(channel))
            target.wake.set()  # register at once
            self._targets.append(target)
            # Supervised: a NameServer that is down or slow is handled in _register; anything
            # else escaping the loop is a bug and ends the process (prockit.fatal) instead of
            # leaving a node that silently stopped registering.
            name = f"register-{addr}"
            self._tasks.append(supervise(loop.create_task(self._loop(target), name=name), name))
        if self._addrs:
            logger.info(
                "node=%s registering with namesrv=%s period_ms=%d",
                self.cfg.dLegerSelfId,
                ";".join(self._addrs),
                self.cfg.registerBrokerPeriod,
            )

    async def _loop(self, t: _Target) -> None:
        # Ends when stop() begins, not only by cancellation: a cancel can be lost on its way
        # through an await here (a gRPC call cancelled under it ends as an AioRpcError
        # CANCELLED, which _register takes for a NameServer failure; Python 3.11's wait_for
        # returns a result that is ready at the cancel), and a loop that went on would keep
        # registering a node that is stopping, and stop() would wait for it forever.
        while not self._stopped:
            wait_s = self.period_s
            if t.failing:
                wait_s = min(wait_s, RETRY_AFTER_FAILURE_MS / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(t.wake.wait(), wait_s)
            t.wake.clear()
            if self._stopped:
                return
            await self._register(t)

    async def _register(self, t: _Target) -> None:
        request = self.request()
        try:
            await t.stub.RegisterBroker(
                request,
                timeout=self.deadline_s,
                metadata=self.signature(REGISTER_METHOD, request),
            )
        except grpc.aio.AioRpcError as exc:
            now = time.monotonic()
            if now - t.last_error_log_s >= self.period_s:
                t.last_error_log_s = now
                logger.warning(
                    "node=%s namesrv=%s register failed status=%s detail=%s",
                    self.cfg.dLegerSelfId,
                    t.addr,
                    exc.code().name,
                    exc.details(),
                )
            t.failing = True
            return
        t.registrations += 1
        if t.failing or t.registrations == 1:
            logger.info(
                "node=%s namesrv=%s registered role=%s term=%d topics=%d",
                self.cfg.dLegerSelfId,
                t.addr,
                pb.BrokerRole.Name(request.role),
                request.term,
                len(request.topics),
            )
        t.failing = False

    async def stop(self) -> None:
        """Stop registering and unregister from every NameServer (short deadline each)."""
        if self._stopped:
            return
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        # A task that failed was already reported (and made fatal) by its supervisor.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        request = pb.UnregisterBrokerRequest(
            cluster=self.cfg.brokerClusterName,
            broker_name=self.cfg.brokerName,
            node_id=self.cfg.dLegerSelfId,
        )

        async def unregister(t: _Target) -> None:
            try:
                await t.stub.UnregisterBroker(
                    request,
                    timeout=UNREGISTER_DEADLINE_MS / 1000,
                    metadata=self.signature(UNREGISTER_METHOD, request),
                )
            except grpc.aio.AioRpcError as exc:
                logger.info(
                    "node=%s namesrv=%s unregister failed status=%s",
                    self.cfg.dLegerSelfId,
                    t.addr,
                    exc.code().name,
                )

        await asyncio.gather(*(unregister(t) for t in self._targets))
        for t in self._targets:
            await t.channel.close()
        self._targets.clear()
