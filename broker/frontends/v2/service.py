"""``apache.rocketmq.v2.MessagingService``: the RocketMQ 5 front end of one node.

A thin adapter like :mod:`broker.frontends.v1.service`: each RPC checks and converts the protocol's
fields and calls the broker's components (topics from :class:`broker.components.topics.Topics`,
leader operations as typed requests through the one forwarder,
:class:`broker.frontends.internal.forwarder.Forwarder`, onto
:mod:`broker.components.leaderops`); the clients' Settings live in
:class:`broker.frontends.v2.clients.ClientTable`. Every answer carries its outcome in the body's
``Status`` (OK = 20000), as RocketMQ 5 clients expect: a failure is never a bare gRPC error. What is
served and what is not yet: docs/RMQ5.md.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.components.applied import AppliedMessages
from broker.components.consumers import MAX_CLIENT_INFO_CHARS, client_info
from broker.components.leaderops import (
    ChangeInvisibleRequest,
    CreateGroupRequest,
    DeadLetterRequest,
    EndTransactionRequest,
    ReceiveRequest,
    RenewRequest,
)
from broker.components.locks import ClientInfo
from broker.components.pop import Received
from broker.components.producers import ProducerRegistry, peer_address
from broker.components.pulling import MAX_SUBSCRIPTION_CHARS
from broker.components.raftnode import RaftNode
from broker.components.sending import OutgoingMessage
from broker.components.subscriptions import SubscriptionGroups
from broker.components.topics import Topics
from broker.frontends import rpcmap
from broker.frontends.internal.codec import call_pb
from broker.frontends.internal.forwarder import Failure, Forwarder, Origin
from broker.frontends.v1.rpcerrors import error_failure
from broker.frontends.v2 import stubs
from broker.frontends.v2.clients import DEFAULT_MAX_CLIENTS_PER_USER, V2_INFO, ClientTable
from broker.frontends.v2.coalesce import Coalescers
from broker.frontends.v2.codes import v2_code_name
from broker.frontends.v2.consuming import (
    PROPERTY_MESSAGE_GROUP,
    assignments,
    consumer_backoff,
    fifo_queue,
    message_group_problem,
    pooled_endpoints,
    pools_members,
)
from broker.frontends.v2.interceptor import (
    Caller,
    caller_signature,
    current_caller,
    refusal_response,
)
from broker.frontends.v2.renewals import DEFAULT_MAX_MS, DEFAULT_SLICE_MS, Renewals, RenewPolicy
from broker.frontends.v2.routes import GroupTopic, NameServerRoutes
from broker.frontends.v2.txn import ProducerStreams, merged
from broker.state.errors import BrokerError, TopicNotFoundError
from broker.state.names import is_valid_group_name, is_valid_topic_name
from broker.state.records import (
    DEFAULT_TOPIC_MESSAGE_TYPE,
    MAX_QUEUE_NUMS,
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
)
from broker.state.transactions import PROPERTY_TRANSACTION_PREPARED, transaction_id
from mqerrors import codes as E
from msgcodec import (
    PROPERTY_DELAY,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
)
from rpckit import decodeguard

v2, v2_service, v2_grpc = stubs.load()

logger = logging.getLogger(__name__)

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
# The v2 message id: version "01" and the 16 bytes of RocketMQ 5's id as 32 upper-case hex
# characters. The 16 bytes are stored as the message's uniq id (docs/RMQ5.md, "Message ids").
V2_ID = re.compile(r"01([0-9A-F]{32})")
V2_ID_VERSION = "01"
# Messages in one SendMessage: the clients send one (or a small batch); a batch is one entry.
MAX_SEND_MESSAGES = 1024
# Addresses in a client's Endpoints, and the characters of a host in one.
MAX_ENDPOINT_ADDRESSES = 16
MAX_HOST_CHARS = 255
# Queues in one route answer: far above a real topic's (groups x queues), small enough for any
# client's default receive limit.
MAX_ROUTE_QUEUES = 8192
# Topics of a producer's Settings, subscriptions of a consumer's: far above an application's.
MAX_SETTINGS_TOPICS = 1024
# Characters of each user-agent field (version, platform, hostname) a Settings may carry.
MAX_UA_FIELD_CHARS = 255
# Open Telemetry streams per node: one per client and node, far above a real deployment's.
MAX_TELEMETRY_STREAMS = 10_000
# Telemetry commands one stream may send: a client sends Settings once and again only after
# a reconnect; the rest are answers to the server's commands (none are sent so far).
MAX_COMMANDS_PER_STREAM = 10_000
# Producers' retry policy: RocketMQ 5's defaults (3 attempts, backoff 10 ms doubling to 1 s).
PRODUCER_MAX_ATTEMPTS = 3
MAX_CLIENT_ATTEMPTS = 16
BACKOFF_INITIAL_MS = 10
BACKOFF_MAX_MS = 1000
BACKOFF_MULTIPLIER = 2.0
# The request timeout a client is told when it asks for none or a silly one (RocketMQ's 3 s).
REQUEST_TIMEOUT_MS = 3000
MAX_REQUEST_TIMEOUT_MS = 60_000
# Consumers' receive settings (answered in Settings, and used when a receive names none).
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_MS = 20_000
# A receive answers this long before its call's deadline, so the answer arrives in time.
RECEIVE_DEADLINE_MARGIN_MS = 500
# Entries of one AckMessage: the clients ack one message (or a received batch) at a time.
MAX_ACK_ENTRIES = 1024
# Properties raftmq itself reads or writes in a stored message: a client may not set them.
RESERVED_PROPERTIES = frozenset(
    {
        PROPERTY_DELAY,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_DLQ_ORIGIN_TOPIC,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_MESSAGE_GROUP,
        PROPERTY_TIMER_DELIVER_MS,
    }
)
CLIENT_ID_HEADER = "x-mq-client-id"
LANGUAGE_HEADER = "x-mq-language"
# The largest time or duration in ms a request may name (a Timestamp's own limit, the end of
# year 9999): beyond it no clock, Timestamp or int64 field downstream holds the value.
MAX_FIELD_MS = 253_402_300_799_999
# Codes of a group creation that fails for a reason the client must hear (a full table, its
# user's quota, a refusal): the Settings is not answered OK then. Others (no leader) leave the
# defaults in force, and the next Settings tries again.
GROUP_CREATION_REFUSED = frozenset(
    {E.TOO_MANY_SUBGROUPS, E.RESOURCE_EXHAUSTED, E.PERMISSION_DENIED, E.UNAUTHENTICATED}
)
# Characters of a status message: for people reading a client's log, like the error contract's
# details (rpckit.status.MAX_DETAIL_BYTES) short whatever a request held.
MAX_STATUS_TEXT_CHARS = 1024


class V2Error(BrokerError):
    """A request the front end refuses itself: ``code`` is an ``apache.rocketmq.v2.Code`` name."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


@dataclass(frozen=True, slots=True)
class V2Config:
    """What the front end tells clients: its group (the route's broker name), its own v2
    address, and the largest body the broker stores (``maxMessageSize``)."""

    group: str
    host: str
    port: int
    max_message_size_bytes: int
    # auto_renew (broker.frontends.v2.renewals): popAutoRenewInvisibleMs, popAutoRenewMaxMs
    renew_slice_ms: int = DEFAULT_SLICE_MS
    renew_max_ms: int = DEFAULT_MAX_MS
    clients_per_user: int = DEFAULT_MAX_CLIENTS_PER_USER  # grpcClientsPerUser


def status(code: str = "OK", text: str = "OK") -> Any:
    """A body status: ``code`` an ``apache.rocketmq.v2.Code`` name, ``text`` cut short."""
    return v2.Status(code=v2.Code.Value(code), message=text[:MAX_STATUS_TEXT_CHARS])


def _status_of(exc: Exception, node: RaftNode) -> Any:
    """The body status of a failure raised by a component, the forwarder or the adapter."""
    if isinstance(exc, V2Error):
        return status(exc.code, exc.text)
    if isinstance(exc, Failure):
        return status(v2_code_name(exc.code), f"{exc.code} {exc.text}")
    failure = error_failure(exc, node)
    if not isinstance(exc, BrokerError):
        logger.exception("v2 call failed")
    return status(v2_code_name(failure.code), failure.detail)


def _client_id(context: grpc.aio.ServicerContext) -> str:
    return _header(context, CLIENT_ID_HEADER)


def _header(context: grpc.aio.ServicerContext, name: str) -> str:
    """The call's text header ``name`` ("" when missing)."""
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else ""
    return ""


def _on_tls(context: grpc.aio.ServicerContext) -> bool:
    """Whether the call came over TLS (its connection's security, as gRPC reports it)."""
    kinds = context.auth_context().get("transport_security_type") or ()
    return b"ssl" in kinds


def _ms(d: Duration | Timestamp, field: str) -> int:
    """A Duration or Timestamp of the request in ms; ``BAD_REQUEST`` naming ``field`` when it
    is negative, beyond :data:`MAX_FIELD_MS` or not a valid protobuf value."""
    seconds, nanos = int(d.seconds), int(d.nanos)
    if not 0 <= nanos < 1_000_000_000 or not 0 <= seconds <= MAX_FIELD_MS // 1000:
        raise V2Error(
            "BAD_REQUEST",
            f"{field} out of range: seconds {seconds}, nanos {nanos} "
            f"(0 to {MAX_FIELD_MS // 1000} s, nanos below 10^9)",
        )
    return min(seconds * 1000 + nanos // 1_000_000, MAX_FIELD_MS)


def _ms_as(code: str, d: Duration | Timestamp, field: str) -> int:
    """:func:`_ms` with the protocol's own code for the field (all of them 400xx, bad
    requests)."""
    try:
        return _ms(d, field)
    except V2Error as exc:
        raise V2Error(code, exc.text) from None


class Named(Protocol):
    """What the front end reads of a v2 ``Resource`` (a topic or a group)."""

    @property
    def name(self) -> str: ...


def _duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


class MessagingServicer:
    """Serves one node's RocketMQ 5 clients over the node's broker components. Every RPC of
    the service has a method (the generated registrar reads each); those not served yet
    (:data:`NOT_SERVED_UNARY`, :data:`NOT_SERVED_STREAMING`) answer NOT_IMPLEMENTED in their
    body."""

    def __init__(
        self,
        node: RaftNode,
        topics: Topics,
        applied: AppliedMessages,
        subgroups: SubscriptionGroups,
        forwarder: Forwarder,
        cfg: V2Config,
        routes: NameServerRoutes | None = None,
        registry: ProducerRegistry | None = None,
    ) -> None:
        self.node = node
        self.registry = registry  # the node's producer registry (None: producers not listed)
        self.topics = topics
        self.subgroups = subgroups
        self.forwarder = forwarder
        self.cfg = cfg
        self.routes = routes
        self.clients = ClientTable(max_per_user=cfg.clients_per_user)
        self.producers = ProducerStreams(applied, f"{cfg.host}:{cfg.port}")
        # Concurrent sends (acks) of one user to one topic share a leader call and an entry.
        self.coalesce = Coalescers(forwarder.call)
        policy = RenewPolicy(cfg.renew_slice_ms, cfg.renew_max_ms)
        self.renewals = Renewals(self.clients, self._renew, policy)
        self._next_queue = itertools.count()
        self._streams = 0
        self._streams_by: Counter[str] = Counter()  # open streams by user

    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        return decodeguard.add_servicer(
            server, v2_grpc.add_MessagingServiceServicer_to_server, self
        )

    # ------------------------------------------------------------------ routes

    async def QueryRoute(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            name = _topic_name(request.topic)
            queues: list[Any] = []
            for group, endpoints in await self._route_groups(name, request):
                queues += _queues(request.topic.resource_namespace, name, group, endpoints)
                if len(queues) >= MAX_ROUTE_QUEUES:
                    del queues[MAX_ROUTE_QUEUES:]
                    break
            if not queues:
                raise TopicNotFoundError(f"topic {name!r} does not exist")
        except Exception as exc:
            return v2_service.QueryRouteResponse(status=_status_of(exc, self.node))
        return v2_service.QueryRouteResponse(status=status(), message_queues=queues)

    async def _route_groups(self, name: str, request: Any) -> list[tuple[GroupTopic, list[Any]]]:
        """The groups serving topic ``name``, each with one single-address Endpoints per
        member (leader first): this node's group first (from its applied topic table), then
        the others the NameServers route it to. One address per Endpoints: the official
        clients open one gRPC channel per Endpoints, and the Node.js client's target for
        several addresses is their comma-joined list, which its resolver refuses
        (docs/RMQ5.md, "Routes and a dying node")."""
        remote = await self.routes.groups(name) if self.routes is not None else None
        out: list[tuple[GroupTopic, list[Any]]] = []
        own_addrs: tuple[str, ...] = ()
        for g in remote or ():
            if g.name == self.cfg.group:
                own_addrs = g.addrs
            elif endpoints := _endpoints_of(g.addrs):
                out.append((g, endpoints))
        try:
            local: TopicConfig | None = self.topics.get(name)
        except TopicNotFoundError:
            local = None
        if local is not None:
            own = GroupTopic(
                self.cfg.group,
                local.read_queue_nums,
                local.write_queue_nums,
                local.perm,
                local.message_type,
                own_addrs,
            )
            out.insert(0, (own, _endpoints_of(own_addrs) or self._endpoints(request)))
        return out

    def _endpoints(self, request: Any) -> list[Any]:
        """The addresses the client reached us by (any node answers every call), one
        Endpoints each, or this node's own v2 address when they are missing or not usable."""
        asked = request.endpoints
        if _usable_endpoints(asked):
            return _endpoints_of([f"{a.host}:{a.port}" for a in asked.addresses])
        return [_one_endpoint(self.cfg.host, self.cfg.port)]

    # ------------------------------------------------------------------ client lifecycle

    async def Telemetry(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        who = current_caller()
        full = self._no_room_for_stream(who)
        if full:
            yield v2_service.TelemetryCommand(status=status("TOO_MANY_REQUESTS", full))
            return
        self._streams += 1
        self._streams_by[who.user] += 1
        client_id = _client_id(context)
        stream = self.producers.open(client_id)
        try:
            count = 0
            async for command, pushed in merged(request_iterator, stream):
                if pushed is not None:  # a check-back for a producer (broker.frontends.v2.txn)
                    yield pushed
                    continue
                count += 1
                if count > MAX_COMMANDS_PER_STREAM:
                    yield v2_service.TelemetryCommand(
                        status=status("TOO_MANY_REQUESTS", "too many commands on one stream")
                    )
                    return
                if isinstance(command, decodeguard.Undecodable):
                    yield v2_service.TelemetryCommand(status=status("BAD_REQUEST", "undecodable"))
                    return
                reply = await self._command(client_id, stream, command, context.peer())
                if reply is not None:
                    yield reply
        finally:
            self.producers.close(stream)
            self._streams -= 1
            self._streams_by[who.user] -= 1
            if self._streams_by[who.user] <= 0:
                del self._streams_by[who.user]

    def _no_room_for_stream(self, who: Caller) -> str:
        """Why a new Telemetry stream of ``who`` is refused ("" when it is not): the node's
        limit, or the user's (grpcClientsPerUser: a client opens one stream per node, so a
        user holds as many streams as client records)."""
        if self._streams >= MAX_TELEMETRY_STREAMS:
            return "too many telemetry streams on this node"
        quota = self.cfg.clients_per_user
        if who.user and not who.unbounded and self._streams_by[who.user] >= quota:
            return (
                f"RESOURCE_EXHAUSTED quota grpcClientsPerUser: user {who.user!r} has {quota} "
                "telemetry streams open on this node"
            )
        return ""

    async def _command(
        self, client_id: str, stream: Any, command: Any, peer: str = ""
    ) -> Any | None:
        """One command the client sent on its Telemetry stream, checked against its user's
        rights (broker.frontends.rpcmap, TELEMETRY rows); the answer to send, if any. A refused
        command changes nothing."""
        kind = command.WhichOneof("command")
        if kind is None:
            return None  # an empty command: nothing to do
        caller = current_caller()
        argument = command.settings if kind == "settings" else command
        refused = caller.check(rpcmap.TELEMETRY + kind, argument)
        if refused is not None:
            return refusal_response(rpcmap.V2 + "Telemetry", refused)
        if kind != "settings":
            return None  # a client's answer to a server command: none are sent yet
        reply = await self._settings_reply(client_id, command.settings, caller, peer)
        if reply.status.code == v2.OK and command.settings.client_type == v2.PRODUCER:
            self.producers.publishing(stream, command.settings.publishing.topics, caller)
            self._register_producer(client_id, command.settings, caller, peer)
        return reply

    def _register_producer(self, client_id: str, settings: Any, caller: Caller, peer: str) -> None:
        """A producer's Settings made known to the node's producer registry (mqadmin
        producerConnection), under each topic it publishes to; a full registry or a used-up
        producersPerUser is logged, the Settings still served (sends never need it)."""
        if self.registry is None:
            return
        topics = [t.name for t in settings.publishing.topics]
        who = (caller.user, caller.unbounded)
        try:
            self.registry.v2_settings(client_id, topics, _described(settings, peer), who)
        except BrokerError as exc:
            logger.info("producer %r not registered: %s", client_id, exc)

    async def _settings_reply(
        self, client_id: str, settings: Any, caller: Caller, peer: str = ""
    ) -> Any:
        try:
            kind = settings.client_type if settings.HasField("client_type") else 0
            if kind not in (v2.PRODUCER, v2.SIMPLE_CONSUMER, v2.PUSH_CONSUMER):
                raise V2Error("UNRECOGNIZED_CLIENT_TYPE", f"client type {kind} is not served")
            _check_settings(kind, settings)
            group = settings.subscription.group.name if kind != v2.PRODUCER else ""
            if group:
                await self._ensure_group(group, caller)
            language = settings.user_agent.language
            info = _consumer_info(settings, peer) if group else V2_INFO
            self.clients.settings(
                client_id, kind, language, group, caller.user, caller.unbounded, info
            )
            reply = self._settings_for(kind, settings)
        except Exception as exc:
            return v2_service.TelemetryCommand(status=_status_of(exc, self.node))
        return v2_service.TelemetryCommand(status=status(), settings=reply)

    def _settings_for(self, kind: int, asked: Any) -> Any:
        has_timeout = asked.HasField("request_timeout")
        timeout_ms = _ms(asked.request_timeout, "request_timeout") if has_timeout else 0
        if not 0 < timeout_ms <= MAX_REQUEST_TIMEOUT_MS:
            timeout_ms = REQUEST_TIMEOUT_MS
        out = v2.Settings(
            client_type=kind,
            request_timeout=_duration(timeout_ms),
            user_agent=asked.user_agent,
        )
        if asked.HasField("access_point"):  # checked by _check_settings
            out.access_point.CopyFrom(asked.access_point)
        if kind == v2.PRODUCER:
            attempts = asked.backoff_policy.max_attempts
            if not 0 < attempts <= MAX_CLIENT_ATTEMPTS:
                attempts = PRODUCER_MAX_ATTEMPTS
            out.backoff_policy.CopyFrom(_exponential(attempts))
            topics = list(asked.publishing.topics)
            out.publishing.CopyFrom(
                v2.Publishing(
                    topics=topics,
                    max_body_size=self.cfg.max_message_size_bytes,
                    validate_message_type=asked.publishing.validate_message_type,
                )
            )
            return out
        group = self.subgroups.get(asked.subscription.group.name)
        out.backoff_policy.CopyFrom(consumer_backoff(asked.user_agent.language, group))
        sub = out.subscription
        if asked.subscription.HasField("group"):
            sub.group.CopyFrom(asked.subscription.group)
        sub.subscriptions.extend(asked.subscription.subscriptions)
        sub.fifo = group.fifo
        sub.receive_batch_size = RECEIVE_BATCH_SIZE
        sub.long_polling_timeout.CopyFrom(_duration(LONG_POLLING_TIMEOUT_MS))
        return out

    async def _ensure_group(self, name: str, caller: Caller) -> None:
        """A consumer naming a group without a config creates it with the defaults (as
        RocketMQ creates its consumers' subscription groups), so that ``mqadmin`` lists it,
        when its user may do what ``UpdateSubscriptionGroup`` needs for that (checked here on
        every path: the leader's own and the forward, which the leader's guard checks again).
        A refusal, a full table or a used-up quota fail the Settings; another failure (no
        leader) leaves the defaults in force, and the next Settings tries again."""
        if self.subgroups.known(name):
            return
        create = CreateGroupRequest(name)
        refused = caller.check(rpcmap.LEADER_OPS + "Call", call_pb(create))
        if refused is not None:
            raise Failure(refused.code, refused.reason)
        try:
            await self.forwarder.call(create, _origin(caller))
        except Failure as exc:
            if exc.code in GROUP_CREATION_REFUSED:
                raise
            logger.info(
                "subscription group %r not created from a consumer's Settings: %s", name, exc
            )

    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            caller = current_caller()
            record = self.clients.seen(_client_id(context), caller.user)
            if record.client_type == v2.PRODUCER and self.registry is not None:
                self.registry.v2_heartbeat(record.client_id, (caller.user, caller.unbounded))
            if request.client_type not in (0, record.client_type):
                raise V2Error(
                    "UNRECOGNIZED_CLIENT_TYPE",
                    f"client type {request.client_type} differs from the Settings' "
                    f"{record.client_type}",
                )
        except Exception as exc:
            return v2_service.HeartbeatResponse(status=_status_of(exc, self.node))
        return v2_service.HeartbeatResponse(status=status())

    async def NotifyClientTermination(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # Another user's client id: answered as an unknown one (OK), its record left alone.
        caller = current_caller()
        self.clients.terminated(_client_id(context), caller.user)
        if self.registry is not None:
            self.registry.v2_terminated(_client_id(context), (caller.user, caller.unbounded))
        return v2_service.NotifyClientTerminationResponse(status=status())

    # ------------------------------------------------------------------ sends

    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        n = len(request.messages)
        if not 0 < n <= MAX_SEND_MESSAGES:
            st = status("BAD_REQUEST", f"{n} messages; a send holds 1 to {MAX_SEND_MESSAGES}")
            return v2_service.SendMessageResponse(status=st)
        try:
            name = _topic_name(request.messages[0].topic)
            topic = self.topics.get(name)
            queue_id = next(self._next_queue) % max(1, topic.write_queue_nums)
            group = request.messages[0].system_properties.message_group
            if group:  # FIFO: every message of the group in one queue, in send order
                queue_id = fifo_queue(group, topic.write_queue_nums)
            kind = topic.message_type
            messages = tuple(
                _stored_message(m, name, kind, queue_id, group) for m in request.messages
            )
            stored = await self.coalesce.send(name, messages, _origin())
        except Exception as exc:
            st = _status_of(exc, self.node)
            entries = [v2_service.SendResultEntry(status=st) for _ in range(n)]
            return v2_service.SendMessageResponse(status=st, entries=entries)
        half = PROPERTY_TRANSACTION_PREPARED in messages[0].properties
        return v2_service.SendMessageResponse(
            status=status(),
            entries=[
                v2_service.SendResultEntry(
                    status=status(),
                    message_id=V2_ID_VERSION + s.uniq_id,
                    offset=s.queue_offset,
                    transaction_id=transaction_id(s.position) if half else "",
                )
                for s in stored
            ],
        )

    async def EndTransaction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            topic = _topic_name(request.topic)
            found = V2_ID.fullmatch(request.message_id)
            if found is None:
                raise V2Error("ILLEGAL_MESSAGE_ID", f"message id {request.message_id[:40]!r}")
            if request.resolution not in (v2.COMMIT, v2.ROLLBACK):
                raise V2Error("BAD_REQUEST", "resolution must be COMMIT or ROLLBACK")
            commit = request.resolution == v2.COMMIT
            end = EndTransactionRequest(topic, found.group(1), request.transaction_id, commit)
            await self.forwarder.call(end, _origin())
        except Exception as exc:
            return v2_service.EndTransactionResponse(status=_status_of(exc, self.node))
        return v2_service.EndTransactionResponse(status=status())

    # ------------------------------------------------------------------ POP consumption

    async def ReceiveMessage(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            query = self._receive_query(request, context)
            left_s = context.time_remaining()
            answer_ms = None if left_s is None else int(left_s * 1000) - RECEIVE_DEADLINE_MARGIN_MS
            received = await self.forwarder.receive(query, _origin(), answer_ms)
        except Exception as exc:
            yield v2_service.ReceiveMessageResponse(status=_status_of(exc, self.node))
            return
        if received and request.auto_renew:
            handles = [r.receipt_handle for r in received]
            self.renewals.track(_client_id(context), query.group, query.topic, handles)
        if not received:
            st = status("MESSAGE_NOT_FOUND", "no new message")
            yield v2_service.ReceiveMessageResponse(status=st)
            return
        namespace = request.message_queue.topic.resource_namespace
        # When the server handed them out (the Python push consumer measures its latency from it).
        now = _timestamp(time.time_ns() // 1_000_000)
        yield v2_service.ReceiveMessageResponse(delivery_timestamp=now)
        for r in received:
            yield v2_service.ReceiveMessageResponse(message=self._v2_message(r, namespace))
        yield v2_service.ReceiveMessageResponse(status=status())

    def _receive_query(self, request: Any, context: grpc.aio.ServicerContext) -> ReceiveRequest:
        group = _group_name(request.group)
        topic = _topic_name(request.message_queue.topic)
        expression = request.filter_expression
        if expression.type not in (v2.FILTER_TYPE_UNSPECIFIED, v2.TAG):
            raise V2Error("UNSUPPORTED", "only TAG filter expressions are served")
        if len(expression.expression) > MAX_SUBSCRIPTION_CHARS:
            raise V2Error("ILLEGAL_FILTER_EXPRESSION", f"over {MAX_SUBSCRIPTION_CHARS} characters")
        if request.auto_renew:
            invisible_ms = self.cfg.renew_slice_ms  # the server's pick, renewed (renewals.py)
        elif request.HasField("invisible_duration"):
            invisible_ms = _ms_as(
                "ILLEGAL_INVISIBLE_TIME", request.invisible_duration, "invisible_duration"
            )
        else:
            raise V2Error("ILLEGAL_INVISIBLE_TIME", "a receive names no invisible duration")
        poll_ms = LONG_POLLING_TIMEOUT_MS
        if request.HasField("long_polling_timeout"):
            poll_ms = _ms_as(
                "ILLEGAL_POLLING_TIME", request.long_polling_timeout, "long_polling_timeout"
            )
        left_s = context.time_remaining()
        if left_s is not None:
            poll_ms = max(0, min(poll_ms, int(left_s * 1000) - RECEIVE_DEADLINE_MARGIN_MS))
        queue_id = request.message_queue.id
        if not -1 <= queue_id < MAX_QUEUE_NUMS:
            raise V2Error("BAD_REQUEST", f"queue id {queue_id} is outside [-1, {MAX_QUEUE_NUMS})")
        batch = request.batch_size or RECEIVE_BATCH_SIZE
        # As the proxy does, the queue only names the broker: a receive pops from every
        # readable queue of this group (-1), so a client never long-polls an empty queue
        # while another holds messages.
        return ReceiveRequest(group, topic, -1, batch, invisible_ms, expression.expression, poll_ms)

    def _v2_message(self, r: Received, namespace: str) -> Any:
        m = r.message
        sp = v2.SystemProperties(
            keys=list(m.keys),
            message_id=V2_ID_VERSION + m.uniq_id,
            body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),
            body_encoding=v2.IDENTITY,
            message_type=v2.NORMAL,
            born_timestamp=_timestamp(m.born_timestamp_ms),
            born_host=m.born_host,
            store_timestamp=_timestamp(m.store_timestamp_ms),
            store_host=f"{self.cfg.host}:{self.cfg.port}",
            receipt_handle=r.receipt_handle,
            queue_id=r.queue_id,
            queue_offset=r.queue_offset,
            delivery_attempt=r.attempt,
        )
        if m.tags:
            sp.tag = m.tags
        properties = dict(m.properties)
        message_group = properties.pop(PROPERTY_MESSAGE_GROUP, "")
        if message_group:
            sp.message_type, sp.message_group = v2.FIFO, message_group
        return v2.Message(
            topic=v2.Resource(resource_namespace=namespace, name=m.topic),
            user_properties=_timed_fields(properties, sp),
            system_properties=sp,
            body=m.body,
        )

    async def AckMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        entries = request.entries
        try:
            if not 0 < len(entries) <= MAX_ACK_ENTRIES:
                raise V2Error("BAD_REQUEST", f"{len(entries)} entries; 1 to {MAX_ACK_ENTRIES}")
            group = _group_name(request.group)
            topic = _topic_name(request.topic)
            handles = tuple(e.receipt_handle for e in entries)
            codes = await self.coalesce.ack(group, topic, handles, _origin())
        except Exception as exc:
            st = _status_of(exc, self.node)
            return v2_service.AckMessageResponse(status=st, entries=_ack_entries(entries, st))
        self.renewals.forget(e.receipt_handle for e in entries)
        results = [status() if not c else status(v2_code_name(c), c) for c in codes]
        failed = next((st for st in results if st.code != v2.OK), None)
        return v2_service.AckMessageResponse(
            status=failed or status(),
            entries=[
                v2_service.AckMessageResultEntry(
                    message_id=e.message_id, receipt_handle=e.receipt_handle, status=st
                )
                for e, st in zip(entries, results, strict=True)
            ],
        )

    async def ChangeInvisibleDuration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            group = _group_name(request.group)
            topic = _topic_name(request.topic)
            invisible_ms = _ms_as(
                "ILLEGAL_INVISIBLE_TIME", request.invisible_duration, "invisible_duration"
            )
            self.renewals.forget((request.receipt_handle,))
            # A push consumer's nack waits at least the group's backoff, whatever delay the
            # client computed (the Node.js client 1.0.8 sends its backoff's seconds as ms).
            change = ChangeInvisibleRequest(
                group,
                topic,
                request.receipt_handle,
                invisible_ms,
                backoff_floor=self._is_push_consumer(context),
            )
            changed = await self.forwarder.call(change, _origin())
        except Exception as exc:
            return v2_service.ChangeInvisibleDurationResponse(status=_status_of(exc, self.node))
        return v2_service.ChangeInvisibleDurationResponse(
            status=status(), receipt_handle=changed.receipt_handle
        )

    def _is_push_consumer(self, context: grpc.aio.ServicerContext) -> bool:
        record = self.clients.get(_client_id(context), current_caller().user)
        return record is not None and record.client_type == v2.PUSH_CONSUMER

    async def ForwardMessageToDeadLetterQueue(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        try:
            group = _group_name(request.group)
            topic = _topic_name(request.topic)
            self.renewals.forget((request.receipt_handle,))
            dead = DeadLetterRequest(group, topic, request.receipt_handle)
            await self.forwarder.call(dead, _origin())
        except Exception as exc:
            st = _status_of(exc, self.node)
            return v2_service.ForwardMessageToDeadLetterQueueResponse(status=st)
        return v2_service.ForwardMessageToDeadLetterQueueResponse(status=status())

    async def QueryAssignment(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            group = self.subgroups.get(_group_name(request.group))
            name = _topic_name(request.topic)
            topic = self.topics.get(name)
            own = await self._route_groups(name, request)
            if not own or own[0][0].name != self.cfg.group:
                raise TopicNotFoundError(f"topic {name!r} is not served by this group")
            # Through every member the route names (consuming.assignments).
            readable = [q for q in range(topic.read_queue_nums) if self.topics.has_queue(name, q)]
            members = own[0][1]
            if pools_members(_header(context, LANGUAGE_HEADER), _on_tls(context)):
                members = pooled_endpoints(members)
            found = assignments(request.topic, group, self.cfg.group, members, readable)
        except Exception as exc:
            return v2_service.QueryAssignmentResponse(status=_status_of(exc, self.node))
        return v2_service.QueryAssignmentResponse(status=status(), assignments=found)

    async def _renew(
        self, group: str, topic: str, handles: list[str], invisible_ms: int
    ) -> list[str]:
        renew = RenewRequest(group, topic, tuple(handles), invisible_ms)
        return await self.forwarder.call(renew, _origin())


# RPCs not served yet (docs/RMQ5.md): each answers NOT_IMPLEMENTED in its body's status (the
# server-streaming ones in one message). Their handlers are made below from these names.
NOT_SERVED_UNARY = (
    "UpdateOffset",
    "GetOffset",
    "QueryOffset",
    "RecallMessage",
    "SyncLiteSubscription",
)
NOT_SERVED_STREAMING = ("PullMessage",)


def _unary_not_served(rpc: str) -> Callable[..., Awaitable[Any]]:
    async def handler(
        self: MessagingServicer, request: object, context: grpc.aio.ServicerContext
    ) -> Any:
        return getattr(v2_service, f"{rpc}Response")(status=_not_served(rpc))

    return handler


def _streaming_not_served(rpc: str) -> Callable[..., AsyncIterator[Any]]:
    async def handler(
        self: MessagingServicer, request: object, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        yield getattr(v2_service, f"{rpc}Response")(status=_not_served(rpc))

    return handler


for _rpc in NOT_SERVED_UNARY:
    setattr(MessagingServicer, _rpc, _unary_not_served(_rpc))
for _rpc in NOT_SERVED_STREAMING:
    setattr(MessagingServicer, _rpc, _streaming_not_served(_rpc))


def _check_settings(kind: int, s: Any) -> None:
    """Every field of a client's Settings that is kept or echoed, bounded (V2Error naming it)."""
    ua = s.user_agent
    for what, value in (
        ("version", ua.version),
        ("platform", ua.platform),
        ("hostname", ua.hostname),
    ):
        if len(value) > MAX_UA_FIELD_CHARS:
            raise V2Error("BAD_REQUEST", f"user_agent.{what} of {len(value)} characters")
    if s.HasField("access_point") and not _usable_endpoints(s.access_point):
        raise V2Error("BAD_REQUEST", "access_point: 1 to 16 addresses of host:port")
    topics, entries = s.publishing.topics, s.subscription.subscriptions
    if len(topics) > MAX_SETTINGS_TOPICS or len(entries) > MAX_SETTINGS_TOPICS:
        raise V2Error("BAD_REQUEST", f"more than {MAX_SETTINGS_TOPICS} topics or subscriptions")
    for resource in topics:
        _topic_name(resource)
    for entry in entries:
        _topic_name(entry.topic)
        if len(entry.expression.expression) > MAX_SUBSCRIPTION_CHARS:
            raise V2Error("ILLEGAL_FILTER_EXPRESSION", f"over {MAX_SUBSCRIPTION_CHARS} characters")
    if kind != v2.PRODUCER and not is_valid_group_name(s.subscription.group.name):
        raise V2Error("ILLEGAL_CONSUMER_GROUP", "a consumer's Settings names no valid group")


def _described(settings: Any, peer: str) -> tuple[str, str, str]:
    """The address a client's Settings came from, its language (the protocol's name of it)
    and its release (printable ASCII, bounded as a v1 client's)."""
    ua = settings.user_agent
    known = ua.language in v2.Language.values()
    language = v2.Language.Name(ua.language) if known else str(ua.language)
    version = "".join(ch for ch in ua.version if " " <= ch <= "~")[:MAX_CLIENT_INFO_CHARS]
    return peer_address(peer), language, version


def _consumer_info(settings: Any, peer: str) -> ClientInfo:
    """What a consumer's Settings (checked by :func:`_check_settings`) says of it, for the
    connection listings: its subscriptions as (topic, expression), kept as a v1 consumer's."""
    subscriptions = [
        (entry.topic.name, entry.expression.expression)
        for entry in settings.subscription.subscriptions
    ]
    return client_info(*_described(settings, peer), subscriptions, protocol="v2")


def _usable_endpoints(endpoints: Any) -> bool:
    addrs = endpoints.addresses
    return 0 < len(addrs) <= MAX_ENDPOINT_ADDRESSES and all(
        0 < len(a.host) <= MAX_HOST_CHARS and 0 < a.port < 65536 for a in addrs
    )


def _not_served(rpc: str) -> Any:
    return status("NOT_IMPLEMENTED", f"{rpc} is not served by raftmq yet (docs/RMQ5.md)")


def _group_name(resource: Named) -> str:
    name = resource.name
    if not is_valid_group_name(name):
        raise V2Error("ILLEGAL_CONSUMER_GROUP", f"group name {name[:130]!r} is not valid")
    return str(name)


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _ack_entries(entries: Any, st: Any) -> list[Any]:
    return [
        v2_service.AckMessageResultEntry(
            message_id=e.message_id, receipt_handle=e.receipt_handle, status=st
        )
        for e in entries
    ]


def _topic_name(resource: Named) -> str:
    name = resource.name
    if not is_valid_topic_name(name):
        raise V2Error("ILLEGAL_TOPIC", f"topic name {name[:130]!r} is not valid")
    return str(name)


def _queues(namespace: str, topic: str, group: GroupTopic, endpoints: Sequence[Any]) -> list[Any]:
    """The route's queues of one group: ids 0 to max(read, write) - 1 (so queue 0 always
    exists), each with its permission and the topic's accepted message types, and each once
    per member endpoint (queue-major, the members in the given order): a client that finds
    one member dead sends and receives through the same queue at another."""
    assert endpoints, "a group is routed with at least one endpoint"
    accepted = _accepted_types(group.message_type)
    read, write = group.read_queue_nums, group.write_queue_nums
    brokers = [v2.Broker(name=group.name, id=0, endpoints=e) for e in endpoints]
    return [
        v2.MessageQueue(
            topic=v2.Resource(resource_namespace=namespace, name=topic),
            id=q,
            permission=_permission(group.perm, q < read, q < write),
            broker=broker,
            accept_message_types=accepted,
        )
        for q in range(min(max(read, write), MAX_QUEUE_NUMS))
        for broker in brokers
    ]


def _endpoints_of(addrs: Sequence[str]) -> list[Any]:
    """``host:port`` addresses (from a NameServer) as one v2 Endpoints each; malformed and
    repeated ones left out."""
    out: dict[tuple[str, int], Any] = {}
    for addr in addrs:
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        if 0 < len(host) <= MAX_HOST_CHARS and port.isdigit() and 0 < int(port) < 65536:
            out.setdefault((host, int(port)), _one_endpoint(host, int(port)))
    return list(out.values())


def _one_endpoint(host: str, port: int) -> Any:
    return v2.Endpoints(scheme=_scheme(host), addresses=[v2.Address(host=host, port=port)])


def _permission(perm: int, readable: bool, writable: bool) -> int:
    r = readable and bool(perm & PERM_READ)
    w = writable and bool(perm & PERM_WRITE)
    return int(v2.READ_WRITE if r and w else v2.READ if r else v2.WRITE if w else v2.NONE)


def _scheme(host: str) -> int:
    if ":" in host:
        return int(v2.IPv6)
    parts = host.split(".")
    ipv4 = len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
    return int(v2.IPv4 if ipv4 else v2.DOMAIN_NAME)


def _exponential(attempts: int) -> Any:
    return v2.RetryPolicy(
        max_attempts=attempts,
        exponential_backoff=v2.ExponentialBackoff(
            initial=_duration(BACKOFF_INITIAL_MS),
            max=_duration(BACKOFF_MAX_MS),
            multiplier=BACKOFF_MULTIPLIER,
        ),
    )


def _accepted_types(topic_type: str) -> list[int]:
    """The v2 message types a topic of ``topic_type`` (its ``message.type``) takes."""
    if topic_type == DEFAULT_TOPIC_MESSAGE_TYPE:
        return [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]
    return [int(v2.MessageType.Value(topic_type))]


def _type_name(kind: int) -> str:
    """The name of a v2 message type; a number the protocol does not define, as a number."""
    try:
        return str(v2.MessageType.Name(kind))
    except ValueError:
        return str(kind)


def _stored_message(
    m: Any, topic: str, topic_type: str, queue_id: int, group: str = ""
) -> OutgoingMessage:
    """A v2 message as the broker stores it (the neutral message of a send): its id's 16
    bytes as the uniq id, tag, keys, user properties, born host and time. The codec checks
    the sizes (body, properties, host) when it encodes."""
    if m.topic.name != topic:
        raise V2Error("BAD_REQUEST", "the messages of one send must share their topic")
    sp = m.system_properties
    found = V2_ID.fullmatch(sp.message_id)
    if found is None:
        raise V2Error(
            "ILLEGAL_MESSAGE_ID",
            f"message id {sp.message_id[:40]!r} is not '01' and 32 upper-case hex characters",
        )
    kind = sp.message_type or v2.NORMAL
    if kind not in _accepted_types(topic_type):
        raise V2Error(
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
            f"a {_type_name(kind)} message for topic {topic!r} of type {topic_type}",
        )
    properties = dict(m.user_properties)
    _check_properties(properties)
    if kind == v2.FIFO:
        problem = message_group_problem(sp.message_group)
        if problem:
            raise V2Error("ILLEGAL_MESSAGE_GROUP", problem)
        if sp.message_group != group:
            raise V2Error("BAD_REQUEST", "the FIFO messages of one send must share their group")
        if sp.HasField("delivery_timestamp"):
            raise V2Error("MESSAGE_PROPERTY_CONFLICT_WITH_TYPE", "a FIFO message is not timed")
        properties[PROPERTY_MESSAGE_GROUP] = sp.message_group
    elif kind not in (v2.NORMAL, v2.TRANSACTION, v2.DELAY):
        raise V2Error("UNSUPPORTED", f"message type {_type_name(kind)} is not served")
    elif sp.HasField("message_group") or (kind != v2.DELAY and sp.HasField("delivery_timestamp")):
        raise V2Error(
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
            "message_group and delivery_timestamp belong to FIFO and DELAY messages",
        )
    if sp.body_encoding not in (v2.IDENTITY, v2.ENCODING_UNSPECIFIED):
        raise V2Error("UNSUPPORTED", "only IDENTITY bodies are accepted on send")
    born_ms = _ms(sp.born_timestamp, "born_timestamp")
    if kind == v2.TRANSACTION:  # a half message (broker.transactions)
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    if kind == v2.DELAY:
        properties[PROPERTY_TIMER_DELIVER_MS] = str(_delivery_ms(sp))
    return OutgoingMessage(
        topic=topic,
        queue_id=queue_id,
        tags=sp.tag,
        keys=tuple(sp.keys),
        properties=properties,
        body=m.body,
        born_host=sp.born_host,
        born_timestamp_ms=born_ms,
        msg_id=found.group(1),
    )


def _origin(caller: Caller | None = None) -> Origin:
    """The v2 call being served as the original caller of a leader operation: its user and
    the signature entries a forward carries (the leader's guard checks that user again)."""
    who = current_caller() if caller is None else caller
    return Origin(who.user, who.unbounded, caller_signature())


def _delivery_ms(sp: Any) -> int:
    """A DELAY message's delivery time in ms (the leader refuses one beyond
    ``timerMaxDelaySec``, broker.state.timerrules); a time in the past is delivered at once."""
    if not sp.HasField("delivery_timestamp"):
        raise V2Error("ILLEGAL_DELIVERY_TIME", "a DELAY message needs a delivery_timestamp")
    return _ms_as("ILLEGAL_DELIVERY_TIME", sp.delivery_timestamp, "delivery_timestamp")


def _timed_fields(props: Mapping[str, str], sp: Any) -> dict[str, str]:
    """A timed message is received as RocketMQ 5 shows it: type DELAY with its
    ``delivery_timestamp``, the broker's property left out of the user properties."""
    out = dict(props)
    deliver = out.pop(PROPERTY_TIMER_DELIVER_MS, "")
    if deliver.isascii() and deliver.isdigit() and len(deliver) <= 18:
        sp.message_type = v2.DELAY
        sp.delivery_timestamp.CopyFrom(_timestamp(int(deliver)))
    return out


def _check_properties(props: Iterable[str]) -> None:
    for key in props:
        if not key or key in RESERVED_PROPERTIES:
            raise V2Error(
                "ILLEGAL_MESSAGE_PROPERTY_KEY",
                f"user property {key[:64]!r} is empty or reserved by the broker",
            )


__all__ = ["MessagingServicer", "V2Config", "V2Error"]
