"""``raftmq.nameserver.v1.NameServer`` over grpc.aio: the route table plus its expiry scan.

Errors map to gRPC status codes in :data:`_STATUS` and only there; the detail starts with the
error's stable code, and the status details carry it as a ``raftmq.common.v1.ErrorInfo``
(:mod:`rpckit.status`).

With ``brokerAuthenticationEnabled`` a RegisterBroker or UnregisterBroker must be signed by a
member certificate of the very group and node it is about (`mqsecurity.membersig`); anything
else is refused (``UNAUTHENTICATED`` unsigned or badly signed, ``PERMISSION_DENIED`` signed by
another member) before the table is touched, and counted (`mqsecurity.refusals`, shown by
GetClusterInfo).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from prometheus_client import ProcessCollector
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc

from mqerrors import codes as E
from mqmetrics.server import LoopCollector, MetricsServer
from mqsecurity import refusals
from mqsecurity.errors import CertificateError, SignatureError
from mqsecurity.membersig import MemberVerifier
from mqsecurity.refusals import REFUSALS
from mqsecurity.tls import https_server_context, read_pem
from nameserver.config import NameServerConfig
from nameserver.metrics import (
    ROUTE_FOUND,
    ROUTE_INVALID,
    ROUTE_NOT_FOUND,
    NameServerStats,
    nameserver_families,
)
from nameserver.remoting import NameServerRemoting
from nameserver.routes import (
    MAX_HOST_LEN,
    MAX_NAME_LEN,
    MAX_TOPICS_PER_NODE,
    InvalidRequestError,
    NameServerError,
    Registration,
    RouteTable,
    TooManyBrokersError,
    TooManyTopicsError,
    TopicNotExistError,
    TopicRoute,
    check_name,
)
from remoting.server import RemotingServer
from rpckit import decodeguard, status
from rpckit.serving import add_health_and_reflection, bind

logger = logging.getLogger(__name__)

SERVICE_NAME = "raftmq.nameserver.v1.NameServer"
# The gRPC method paths a member signature covers (the broker signs the same: mqsecurity).
REGISTER_METHOD = f"/{SERVICE_NAME}/RegisterBroker"
UNREGISTER_METHOD = f"/{SERVICE_NAME}/UnregisterBroker"
# The largest valid RegisterBroker request on the wire: every topic of the maximum table at
# the longest name and largest counts (tag + length + name, three int32 fields, the repeated
# field's own tag and length), plus the other fields at their longest.
_MAX_TOPIC_WIRE_BYTES = 1 + 1 + MAX_NAME_LEN + 3 * (1 + 5) + 1 + 2
MAX_REGISTRATION_BYTES = MAX_TOPICS_PER_NODE * _MAX_TOPIC_WIRE_BYTES + 4 * (
    1 + 2 + MAX_NAME_LEN + MAX_HOST_LEN + 6
)
# gRPC's default 4 MiB would refuse registrations of tables the limits allow (100,000 topics of
# 127 characters are about 15 MB); 16 MiB holds the largest valid one with room to spare. The
# answer of a larger request is RESOURCE_EXHAUSTED from gRPC itself, before any parsing.
MAX_RECEIVE_MESSAGE_BYTES = 16 << 20
assert MAX_REGISTRATION_BYTES < MAX_RECEIVE_MESSAGE_BYTES
SERVER_OPTIONS: list[tuple[str, int]] = [
    # Without this a second process on the same port "succeeds" and steals connections.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
]
# Characters of a caller-supplied name quoted in a refusal.
QUOTE_MAX_CHARS = 64
# In-flight RPCs get this long to finish when the server stops.
STOP_GRACE_S = 0.5

_STATUS: dict[type[NameServerError], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    TopicNotExistError: grpc.StatusCode.NOT_FOUND,
    TooManyBrokersError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    TooManyTopicsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# A full route table frees when brokers expire (a scan interval or so): retry after that long.
TABLE_FULL_RETRY_AFTER_MS = 10_000
# BrokerRole numbers to names; a number outside the enum (proto3 keeps unknown enum values)
# is refused as INVALID_REQUEST instead of raising in the enum lookup.
_ROLE_NAMES: dict[int, str] = {number: name for name, number in pb.BrokerRole.items()}


class StartError(NameServerError):
    """The NameServer cannot start (port busy). One line, for the CLI."""

    code = E.START_FAILED


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Handler = Callable[[Any, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]]


def _rpc(fn: _Handler[_Req, _Resp]) -> _Handler[_Req, _Resp]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: _Req, context: grpc.aio.ServicerContext) -> _Resp:
        try:
            return await fn(self, request, context)
        except NameServerError as exc:
            await status.abort(context, failure_of(exc))

    return wrapper


def failure_of(exc: NameServerError) -> status.RpcFailure:
    """The failed call ``exc`` becomes: its status, its code, and a retry hint when a full
    table may free up."""
    code = _STATUS.get(type(exc), grpc.StatusCode.INTERNAL)
    full = code is grpc.StatusCode.RESOURCE_EXHAUSTED
    return status.RpcFailure(
        code,
        exc.code,
        str(exc),
        retryable=full,
        retry_after_ms=TABLE_FULL_RETRY_AFTER_MS if full else 0,
    )


def registration_from_pb(req: pb.RegisterBrokerRequest) -> Registration:
    role = _ROLE_NAMES.get(req.role)
    if role is None:
        raise InvalidRequestError(f"role {req.role} is not a BrokerRole")
    if len(req.topics) > MAX_TOPICS_PER_NODE:  # before building a tuple of them
        raise InvalidRequestError(f"{len(req.topics)} topics exceed {MAX_TOPICS_PER_NODE}")
    return Registration(
        cluster=req.cluster,
        broker_name=req.broker_name,
        node_id=req.node_id,
        role=role,
        client_addr=req.client_addr,
        term=req.term,
        topics=tuple(
            TopicRoute(t.topic_name, t.read_queue_nums, t.write_queue_nums, t.perm, t.message_type)
            for t in req.topics
        ),
        heartbeat_period_ms=req.heartbeat_period_ms,
        rmq5_addr=req.rmq5_addr,
        release=req.release,
        supported_feature_level=req.supported_feature_level,
        feature_level=req.feature_level,
        remoting_addr=req.remoting_addr,
    )


def _quote(name: str) -> str:
    """A caller's name as a refusal quotes it: bounded, repr-quoted."""
    return repr(name[:QUOTE_MAX_CHARS])


class NameServerServicer(pb_grpc.NameServerServicer):
    """``verifier`` None: anyone may (un)register any group (brokerAuthenticationEnabled off)."""

    def __init__(
        self,
        table: RouteTable,
        verifier: MemberVerifier | None = None,
        stats: NameServerStats | None = None,
    ) -> None:
        self.table = table
        self.verifier = verifier
        self.stats = stats if stats is not None else NameServerStats()

    async def _authenticate(
        self,
        method: str,
        request: pb.RegisterBrokerRequest | pb.UnregisterBrokerRequest,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Refuse the call unless a member of ``request``'s group and node signed it."""
        if self.verifier is None:
            return
        try:
            who = self.verifier.verify(
                method,
                request.SerializeToString(deterministic=True),
                context.invocation_metadata() or (),
            )
        except SignatureError as exc:
            failure = status.RpcFailure(
                grpc.StatusCode.UNAUTHENTICATED, E.REGISTRATION_UNAUTHENTICATED, str(exc)
            )
        else:
            if (who.group, who.node_id) == (request.broker_name, request.node_id):
                return
            failure = status.RpcFailure(
                grpc.StatusCode.PERMISSION_DENIED,
                E.NOT_A_MEMBER,
                f"signed by {who.uri}, not by member {_quote(request.node_id)} of group "
                f"{_quote(request.broker_name)}",
            )
        REFUSALS.count(refusals.REGISTRATION, f"{method} from {context.peer()}: {failure.detail}")
        await status.abort(context, failure)

    @_rpc
    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterBrokerResponse:
        registrations = self.stats.registrations
        try:
            await self._authenticate(REGISTER_METHOD, request, context)
            self.table.register(registration_from_pb(request))
        except Exception:
            registrations["refused"] += 1
            raise
        registrations["ok"] += 1
        return pb.RegisterBrokerResponse(broker_expired_time_ms=self.table.broker_expired_time_ms)

    @_rpc
    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterBrokerResponse:
        await self._authenticate(UNREGISTER_METHOD, request, context)
        removed = self.table.unregister(request.cluster, request.broker_name, request.node_id)
        return pb.UnregisterBrokerResponse(removed=removed)

    @_rpc
    async def GetRouteInfoByTopic(
        self, request: pb.GetRouteInfoByTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRouteInfoByTopicResponse:
        queries = self.stats.route_queries
        try:
            check_name("topic", request.topic)
            routes = self.table.route(request.topic)
        except TopicNotExistError:
            queries[ROUTE_NOT_FOUND] += 1
            raise
        except InvalidRequestError:
            queries[ROUTE_INVALID] += 1
            raise
        queries[ROUTE_FOUND] += 1
        groups = []
        for g in routes:
            groups.append(
                pb.GroupRoute(
                    cluster=g.cluster,
                    broker_name=g.broker_name,
                    read_queue_nums=g.topic.read_queue_nums,
                    write_queue_nums=g.topic.write_queue_nums,
                    perm=g.topic.perm,
                    leader_id=g.leader.node_id if g.leader else "",
                    leader_addr=g.leader.client_addr if g.leader else "",
                    leader_term=g.leader.term if g.leader else 0,
                    followers=[
                        pb.NodeAddr(node_id=f.node_id, addr=f.client_addr) for f in g.followers
                    ],
                    message_type=g.topic.message_type,
                    rmq5_addrs=[
                        r.rmq5_addr
                        for r in (g.leader, *g.followers)
                        if r is not None and r.rmq5_addr
                    ],
                )
            )
        return pb.GetRouteInfoByTopicResponse(topic=request.topic, groups=groups)

    @_rpc
    async def GetClusterInfo(
        self, request: pb.GetClusterInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetClusterInfoResponse:
        clusters: dict[str, pb.ClusterInfo] = {}
        for g in self.table.cluster_info():
            cluster = clusters.setdefault(g.cluster, pb.ClusterInfo(name=g.cluster))
            cluster.groups.append(
                pb.GroupInfo(
                    broker_name=g.broker_name,
                    leader_id=g.leader_id,
                    members=[
                        pb.MemberInfo(
                            node_id=r.node_id,
                            role=r.role,
                            client_addr=r.client_addr,
                            term=r.term,
                            last_heartbeat_age_ms=age_ms,
                            heartbeat_period_ms=r.heartbeat_period_ms,
                            topic_count=len(r.topics),
                            release=r.release,
                            supported_feature_level=r.supported_feature_level,
                            feature_level=r.feature_level,
                        )
                        for r, age_ms in g.members
                    ],
                )
            )
        return pb.GetClusterInfoResponse(
            clusters=[clusters[k] for k in sorted(clusters)], refusals=REFUSALS.snapshot()
        )

    @_rpc
    async def GetAllTopicList(
        self, request: pb.GetAllTopicListRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAllTopicListResponse:
        return pb.GetAllTopicListResponse(topics=self.table.all_topics())


class NameServer:
    """One NameServer: call :meth:`start`, then :meth:`stop`."""

    def __init__(self, cfg: NameServerConfig, host: str | None = None) -> None:
        """``host`` overrides ``cfg.listenHost``."""
        self.cfg = cfg
        self.host = host if host is not None else cfg.listenHost
        self.table = RouteTable(cfg.brokerExpiredTime)
        self.stats = NameServerStats()
        self._metrics: MetricsServer | None = None
        self._server: grpc.aio.Server | None = None
        self._remoting: RemotingServer | None = None
        self._scan_task: asyncio.Task[None] | None = None

    @property
    def remoting(self) -> RemotingServer | None:
        """The RocketMQ remoting port's server (remotingListenPort), None when not served."""
        return self._remoting

    async def start(self) -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        decodeguard.add_servicer(
            server,
            pb_grpc.add_NameServerServicer_to_server,
            NameServerServicer(self.table, self._verifier(), self.stats),
        )
        add_health_and_reflection(server, [SERVICE_NAME])
        addr = f"{self.host}:{self.cfg.listenPort}"
        # Remoting first: the gRPC port accepts connections once bound, and whoever waits for
        # it (mqcluster, the tests) takes that as the NameServer being up.
        await self._start_remoting()
        bind(server, addr, self.cfg.tls_files, StartError)
        self._bind_metrics()
        await server.start()
        if self._metrics is not None:
            self._metrics.start()
        self._server = server
        self._scan_task = asyncio.get_running_loop().create_task(self._scan_loop(), name="scan")
        logger.info(
            "nameserver started addr=%s remoting_port=%d %s broker_authentication=%s "
            "broker_expired_time_ms=%d scan_interval_ms=%d",
            addr,
            self._remoting.port if self._remoting else 0,
            "tls" if self.cfg.tlsEnable else "plaintext",
            self.cfg.brokerAuthenticationEnabled,
            self.cfg.brokerExpiredTime,
            self.cfg.scanNotActiveBrokerInterval,
        )

    def _bind_metrics(self) -> None:
        """``/metrics`` on the listen host (metricsPort; 0: not served), bound now."""
        port = self.cfg.metricsPort
        if not port:
            return
        loop = asyncio.get_running_loop()
        collectors = [
            LoopCollector(
                lambda: nameserver_families(self.table, self.stats, self._remoting), loop
            ),
            ProcessCollector(registry=None),
        ]
        try:
            files = self.cfg.metrics_tls_files
            context = https_server_context(files) if files is not None else None
            self._metrics = MetricsServer(self.host, port, collectors, tls=context)
        except (OSError, CertificateError) as exc:
            raise StartError(f"metricsPort {self.host}:{port}: {exc}") from None

    async def _start_remoting(self) -> None:
        """The RocketMQ remoting port for 4.x clients (remotingListenPort; 0: not served), TLS
        only with tlsEnable, on the listen host."""
        port = self.cfg.remotingListenPort
        if not port:
            return
        files = self.cfg.tls_files
        try:
            context = https_server_context(files) if files is not None else None
        except CertificateError as exc:
            raise StartError(f"remotingListenPort: {exc}") from None
        server = RemotingServer(
            NameServerRemoting(self.table, self.stats), ssl_context=context, name="namesrv remoting"
        )
        try:
            await server.start(self.host, port)
        except OSError as exc:
            raise StartError(f"remotingListenPort {self.host}:{port}: {exc}") from None
        self._remoting = server

    def _verifier(self) -> MemberVerifier | None:
        if not self.cfg.brokerAuthenticationEnabled:
            return None
        path = self.cfg.tlsServerTrustCertPath
        try:
            pem = read_pem(path, "tlsServerTrustCertPath")  # its errors name the key
        except CertificateError as exc:
            raise StartError(str(exc)) from None
        try:
            return MemberVerifier(pem)
        except CertificateError as exc:
            raise StartError(f"tlsServerTrustCertPath: {path}: {exc}") from None

    async def _scan_loop(self) -> None:
        period_s = self.cfg.scanNotActiveBrokerInterval / 1000
        while True:
            await asyncio.sleep(period_s)
            self.table.scan_expired()

    async def stop(self) -> None:
        if self._scan_task is not None:
            self._scan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan_task
            self._scan_task = None
        if self._server is not None:
            await self._server.stop(grace=STOP_GRACE_S)
            self._server = None
        if self._remoting is not None:
            await self._remoting.stop()
            self._remoting = None
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.stop)
            self._metrics = None
        logger.info("nameserver stopped port=%d", self.cfg.listenPort)
