"""Admin operations behind ``mqadmin`` (client/mqadmin.py): create, update and delete topics on
every broker group of a cluster, as the NameServer lists them; routes, cluster and node status;
queue offsets, consumer progress and offset resets; message lookup by key or id; the
dead-letter queue of a consumer group: list, and resend to the original topic.

Every failure is an ``MQClientError`` carrying the broker's or NameServer's stable code."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as ns_grpc

from client.consumer import PullConsumer
from client.errors import MQClientError
from client.message import (
    DLQ_PREFIX,
    PROPERTY_ORIGIN_MESSAGE_ID,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
)
from client.producer import Producer
from client.route import (
    NAMESRV_RPC_TIMEOUT_S,
    ChannelPool,
    RouteClient,
    TopicRoute,
    first_namesrv_answer,
    parse_namesrv_addr,
)
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from msgcodec import (
    PROPERTY_DELAY,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
)

log = logging.getLogger(__name__)
T_ = TypeVar("T_")

# How long create_topic waits for the groups' leaders and for the route to appear.
CREATE_TOPIC_TIMEOUT_S = 15.0
POLL_S = 0.1
# One admin call to one broker group (following NOT_LEADER redirects within it).
ADMIN_CALL_TIMEOUT_S = 6.0
# RocketMQ PermName: read + write.
PERM_READ_WRITE = 6
_HEX32 = re.compile(r"^[0-9A-Fa-f]{32}$")
# dlqList / dlqResend read at most this many dead letters per call.
MAX_DLQ_MESSAGES = 10_000
DLQ_PULL_BATCH = 256
# Properties the broker adds on the way to the DLQ; a resend leaves them out.
_SYSTEM_PROPERTIES = frozenset(
    {
        PROPERTY_DLQ_ORIGIN_TOPIC,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_DELAY,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
    }
)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """``topicStatus``: one queue's offsets."""

    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """``consumerProgress``: one queue of a consumer group. ``consumer_offset`` is -1 when the
    group never committed one; ``lag`` then counts from the queue's min offset."""

    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int


@dataclass(frozen=True, slots=True)
class ResetOffset:
    broker_name: str
    queue_id: int
    offset: int


class MQAdmin:
    """Admin operations over the NameServers and the broker groups' leaders. ``security``:
    TLS and the credentials that sign every call (default: plaintext, anonymous); the
    producers and consumers some commands use get the same."""

    def __init__(self, namesrv_addr: str, security: ClientSecurity = PLAINTEXT) -> None:
        self.namesrv_addr = namesrv_addr
        self.security = security
        self._namesrvs = parse_namesrv_addr(namesrv_addr)

    def _pool(self) -> ChannelPool:
        """Channels for one operation, opened as ``self.security`` says (every admin method
        takes its channels here)."""
        return ChannelPool(self.security)

    def create_topic(
        self,
        topic: str,
        queues: int = 8,
        cluster: str = "",
        timeout_s: float = CREATE_TOPIC_TIMEOUT_S,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: int = PERM_READ_WRITE,
        message_type: str = "",
        broker_names: Collection[str] = (),
    ) -> list[str]:
        """Create (or update) ``topic`` with ``queues`` read and write queues (or
        ``read_queues`` / ``write_queues``), ``perm`` and ``message_type`` (RocketMQ 5's
        ``message.type`` attribute; "": MIXED) on every group of ``cluster`` (every
        cluster when empty; only the groups ``broker_names`` when given); returns the broker
        group names once every group routes it.
        Raises ``MQClientError`` on a broker's refusal or at the timeout."""
        deadline = time.monotonic() + timeout_s
        channels = self._pool()
        try:
            done: set[str] = set()
            wanted: set[str] = set()
            while time.monotonic() < deadline:
                groups = self._leaders(channels, cluster)
                if broker_names:
                    groups = {n: a for n, a in groups.items() if n in broker_names}
                    if not groups:
                        raise MQClientError.local(
                            E.NO_BROKER, f"no broker group {sorted(broker_names)} is registered"
                        )
                wanted = set(groups)
                for name, leader_addr in groups.items():
                    if name in done or not leader_addr:
                        continue
                    try:
                        channels.broker(leader_addr).CreateTopic(
                            pb.CreateTopicRequest(
                                topic=pb.TopicConfig(
                                    topic_name=topic,
                                    read_queue_nums=queues if read_queues is None else read_queues,
                                    write_queue_nums=(
                                        queues if write_queues is None else write_queues
                                    ),
                                    perm=perm,
                                    message_type=message_type,
                                )
                            ),
                            timeout=max(deadline - time.monotonic(), POLL_S),
                        )
                        done.add(name)
                    except grpc.RpcError as exc:
                        err = MQClientError.from_rpc(exc)
                        if not err.retryable:  # NOT_LEADER, an election, a dead node
                            raise err from exc
                        log.info("create %s on %s: %s; retrying", topic, name, err)
                if wanted and done >= wanted and self._routed(channels, topic, wanted):
                    return sorted(wanted)
                time.sleep(POLL_S)
            raise MQClientError(
                E.TIMEOUT,
                "DEADLINE_EXCEEDED",
                f"topic {topic}: created on {sorted(done)} of "
                f"{sorted(wanted)} within {timeout_s} s",
            )
        finally:
            channels.close()

    def _leaders(self, channels: ChannelPool, cluster: str) -> dict[str, str]:
        for addr in self._namesrvs:
            try:
                info = ns_grpc.NameServerStub(channels.get(addr)).GetClusterInfo(
                    ns_pb.GetClusterInfoRequest(), timeout=NAMESRV_RPC_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                log.warning("namesrv=%s: %s", addr, MQClientError.from_rpc(exc))
                continue
            out: dict[str, str] = {}
            for c in info.clusters:
                if cluster and c.name != cluster:
                    continue
                for g in c.groups:
                    leader = next((m for m in g.members if m.node_id == g.leader_id), None)
                    out[g.broker_name] = leader.client_addr if leader else ""
            return out
        return {}

    def _routed(self, channels: ChannelPool, topic: str, groups: set[str]) -> bool:
        try:
            route = RouteClient(self.namesrv_addr, channels).get_route(topic, force=True)
        except MQClientError:
            return False
        return {g.broker_name for g in route.groups if g.leader_addr} >= groups

    # -- NameServer views ---------------------------------------------------------------

    def _namesrv_call(self, call: Callable[[ns_grpc.NameServerStub], T_]) -> T_:
        """``call`` on the first NameServer that answers; a NameServer's error answer (not
        ``UNAVAILABLE``) is raised at once."""
        channels = self._pool()
        try:
            return first_namesrv_answer(channels, self._namesrvs, call)
        finally:
            channels.close()

    def cluster_info(self) -> ns_pb.GetClusterInfoResponse:
        """Clusters, their broker groups and every registered member (``clusterList``)."""
        resp: ns_pb.GetClusterInfoResponse = self._namesrv_call(
            lambda stub: stub.GetClusterInfo(
                ns_pb.GetClusterInfoRequest(), timeout=NAMESRV_RPC_TIMEOUT_S
            )
        )
        return resp

    def topic_list(self) -> list[str]:
        """Every topic some registered broker serves, sorted."""
        resp = self._namesrv_call(
            lambda stub: stub.GetAllTopicList(
                ns_pb.GetAllTopicListRequest(), timeout=NAMESRV_RPC_TIMEOUT_S
            )
        )
        return list(resp.topics)

    def topic_route_info(self, topic: str) -> ns_pb.GetRouteInfoByTopicResponse:
        """The NameServer's route of ``topic`` (``TOPIC_NOT_FOUND`` / ``NOT_FOUND`` if none)."""
        resp: ns_pb.GetRouteInfoByTopicResponse = self._namesrv_call(
            lambda stub: stub.GetRouteInfoByTopic(
                ns_pb.GetRouteInfoByTopicRequest(topic=topic), timeout=NAMESRV_RPC_TIMEOUT_S
            )
        )
        return resp

    # -- per-group broker calls -----------------------------------------------------------

    def _each_group(
        self,
        topic: str,
        call: Callable[[RouteClient, TopicRoute, str], T_],
        only: Collection[str] = (),
    ) -> list[T_]:
        """``call`` for every broker group routing ``topic`` (only those named in ``only``
        when given)."""
        channels = self._pool()
        try:
            routes = RouteClient(self.namesrv_addr, channels)
            route = routes.get_route(topic, force=True)
            names = [g.broker_name for g in route.groups if not only or g.broker_name in only]
            return [call(routes, route, name) for name in names]
        finally:
            channels.close()

    @staticmethod
    def _leader_call(
        routes: RouteClient,
        topic: str,
        broker_name: str,
        call: Callable[[bpb_grpc.BrokerStub, float], T_],
    ) -> T_:
        return routes.call_leader(topic, broker_name, call, ADMIN_CALL_TIMEOUT_S)

    def _queue_offsets(
        self, routes: RouteClient, topic: str, name: str, queue_id: int
    ) -> pb.GetQueueOffsetsResponse:
        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.GetQueueOffsetsResponse:
            resp: pb.GetQueueOffsetsResponse = stub.GetQueueOffsets(
                pb.GetQueueOffsetsRequest(topic=topic, queue_id=queue_id), timeout=t
            )
            return resp

        return self._leader_call(routes, topic, name, call)

    def _view_message(
        self, routes: RouteClient, topic: str, name: str, req: pb.ViewMessageRequest
    ) -> pb.ViewMessageResponse:
        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.ViewMessageResponse:
            resp: pb.ViewMessageResponse = stub.ViewMessage(req, timeout=t)
            return resp

        return self._leader_call(routes, topic, name, call)

    def delete_topic(self, topic: str, only: Collection[str] = ()) -> list[str]:
        """Delete ``topic`` on every broker group routing it (those named in ``only`` when
        given); returns those groups' names."""

        def one(routes: RouteClient, route: TopicRoute, name: str) -> str:
            self._leader_call(
                routes,
                topic,
                name,
                lambda stub, t: stub.DeleteTopic(pb.DeleteTopicRequest(topic=topic), timeout=t),
            )
            return name

        return self._each_group(topic, one, only)

    def topic_status(self, topic: str, only: Collection[str] = ()) -> list[QueueStatus]:
        """Min and max offset of every readable queue of ``topic`` in every group."""

        def one(routes: RouteClient, route: TopicRoute, name: str) -> list[QueueStatus]:
            group = route.group(name)
            assert group is not None
            out = []
            for q in range(group.read_queue_nums):
                resp = self._queue_offsets(routes, topic, name, q)
                out.append(QueueStatus(name, q, resp.min_offset, resp.max_offset))
            return out

        return [s for rows in self._each_group(topic, one, only) for s in rows]

    def consumer_progress(
        self, group: str, topic: str, only: Collection[str] = ()
    ) -> list[QueueProgress]:
        """Per readable queue: the broker's max offset, ``group``'s committed offset, the lag."""

        def one(routes: RouteClient, route: TopicRoute, name: str) -> list[QueueProgress]:
            # One call per broker group (GetConsumerLag), not two per queue.
            def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.GetConsumerLagResponse:
                req = pb.GetConsumerLagRequest(consumer_group=group, topic=topic)
                resp: pb.GetConsumerLagResponse = stub.GetConsumerLag(req, timeout=t)
                return resp

            resp = self._leader_call(routes, topic, name, call)
            return [
                QueueProgress(name, q.queue_id, q.max_offset, q.committed_offset, q.lag)
                for q in resp.queues
            ]

        return [p for rows in self._each_group(topic, one, only) for p in rows]

    def reset_offset_by_time(
        self,
        group: str,
        topic: str,
        timestamp_ms: int,
        only: Collection[str] = (),
        queue_id: int = -1,
        queue_offset: int | None = None,
    ) -> list[ResetOffset]:
        """Set ``group``'s offset of every queue of ``topic`` (of the groups ``only``, of the
        queue ``queue_id`` when not -1) to the first message stored at or after
        ``timestamp_ms`` (the queue's end if none), or to ``queue_offset`` when given;
        returns the offsets set."""
        req = pb.ResetConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=queue_id)
        if queue_offset is None:
            req.timestamp_ms = timestamp_ms
        else:
            req.queue_offset = queue_offset

        def one(routes: RouteClient, route: TopicRoute, name: str) -> list[ResetOffset]:
            resp = self._leader_call(
                routes, topic, name, lambda stub, t: stub.ResetConsumerOffset(req, timeout=t)
            )
            return [ResetOffset(name, o.queue_id, o.queue_offset) for o in resp.offsets]

        return [r for rows in self._each_group(topic, one, only) for r in rows]

    def update_topic_perm(self, topic: str, perm: int, only: Collection[str] = ()) -> list[str]:
        """``updateTopicPerm``: the topic's perm on every group routing it (those in ``only``
        when given), its queues and message type kept as each group has them."""

        def one(routes: RouteClient, route: TopicRoute, name: str) -> str:
            def call(stub: bpb_grpc.BrokerStub, t: float) -> None:
                have = stub.GetTopic(pb.GetTopicRequest(topic=topic), timeout=t).topic
                config = pb.TopicConfig()
                config.CopyFrom(have)
                config.perm = perm
                stub.CreateTopic(pb.CreateTopicRequest(topic=config), timeout=t)

            self._leader_call(routes, topic, name, call)
            return name

        return self._each_group(topic, one, only)

    def query_msg_by_key(
        self,
        topic: str,
        key: str,
        max_num: int = 32,
        begin_ms: int = 0,
        end_ms: int = 0,
        only: Collection[str] = (),
    ) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` stored from ``begin_ms`` to ``end_ms`` (0: no
        bound) in every group (those in ``only`` when given), newest first."""
        req = pb.QueryMessageByKeyRequest(
            topic=topic,
            key=key,
            max_num=max_num,
            begin_timestamp_ms=begin_ms,
            end_timestamp_ms=end_ms,
        )

        def one(routes: RouteClient, route: TopicRoute, name: str) -> list[MessageExt]:
            resp = self._leader_call(
                routes,
                topic,
                name,
                lambda stub, t: stub.QueryMessageByKey(req, timeout=t),
            )
            return [MessageExt.from_pb(m, name) for m in resp.messages]

        msgs = [m for rows in self._each_group(topic, one, only) for m in rows]
        return sorted(msgs, key=lambda m: m.store_timestamp_ms, reverse=True)[:max_num]

    def query_msg_by_id(self, topic: str, msg_id: str) -> MessageExt:
        """The message of ``topic`` whose uniq id (``msg_id``) or ``offset_msg_id`` is
        ``msg_id``, looked up in every group; ``MESSAGE_NOT_FOUND`` when none has it."""
        requests = [pb.ViewMessageRequest(msg_id=msg_id, topic=topic)]
        if _HEX32.match(msg_id):  # offset msg ids are hex too: try both readings
            requests.append(pb.ViewMessageRequest(offset_msg_id=msg_id, topic=topic))
        else:
            requests = [pb.ViewMessageRequest(offset_msg_id=msg_id, topic=topic)]

        def one(routes: RouteClient, route: TopicRoute, name: str) -> MessageExt | None:
            for req in requests:
                try:
                    resp = self._view_message(routes, topic, name, req)
                except MQClientError as exc:
                    if exc.status in ("NOT_FOUND", "INVALID_ARGUMENT"):
                        continue
                    raise
                if resp.message.topic == topic:
                    return MessageExt.from_pb(resp.message, name)
            return None

        found = [m for m in self._each_group(topic, one) if m is not None]
        if not found:
            raise MQClientError(
                E.MESSAGE_NOT_FOUND, "NOT_FOUND", f"no message {msg_id} in topic {topic}"
            )
        return found[0]

    def dlq_messages(self, group: str, max_num: int = MAX_DLQ_MESSAGES) -> list[MessageExt]:
        """Every message in ``%DLQ%{group}`` (every broker group), oldest first per queue."""
        topic = DLQ_PREFIX + group
        out: list[MessageExt] = []
        with PullConsumer(group, self.namesrv_addr, self.security) as consumer:
            for mq in consumer.fetch_queues(topic):
                offset = 0
                while len(out) < max_num:
                    res = consumer.pull(mq, offset, min(DLQ_PULL_BATCH, max_num - len(out)))
                    if res.status == "OFFSET_ILLEGAL" and res.next_begin_offset != offset:
                        offset = res.next_begin_offset
                        continue
                    out.extend(res.messages)
                    if res.status != "FOUND" or res.next_begin_offset <= offset:
                        break
                    offset = res.next_begin_offset
        return out

    def resend_dlq(
        self, group: str, msg_id: str = "", producer_group: str = "mqadmin-dlq"
    ) -> list[tuple[MessageExt, SendResult]]:
        """Send dead letters of ``group`` (all, or those whose original or stored id is
        ``msg_id``) back to their original topics. The resent copy's id is derived from the
        dead letter's, so resending twice within the broker's dedup window stores it once."""
        wanted = msg_id.upper()
        letters = [
            m
            for m in self.dlq_messages(group)
            if not wanted or wanted in (m.msg_id.upper(), m.store_msg_id.upper())
        ]
        if wanted and not letters:
            raise MQClientError(
                E.MESSAGE_NOT_FOUND, "NOT_FOUND", f"no dead letter {msg_id} for group {group}"
            )
        out = []
        # A one-shot producer: no heartbeats (producerConnection lists applications).
        with Producer(
            producer_group, self.namesrv_addr, security=self.security, heartbeat_interval_s=0
        ) as producer:
            for m in letters:
                origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC, "")
                if not origin:
                    raise MQClientError(
                        E.BAD_DEAD_LETTER, "FAILED_PRECONDITION", f"{m.msg_id} has no origin topic"
                    )
                props = {k: v for k, v in m.properties.items() if k not in _SYSTEM_PROPERTIES}
                props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, m.msg_id)
                resend_id = hashlib.md5(
                    f"{m.store_msg_id or m.msg_id}/resend".encode(), usedforsecurity=False
                ).hexdigest()
                msg = Message(origin, m.body, m.tags, m.keys, props, msg_id=resend_id.upper())
                out.append((m, producer.send(msg)))
        return out

    def queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` over every group, sorted."""
        channels = self._pool()
        try:
            return sorted(RouteClient(self.namesrv_addr, channels).get_route(topic).read_queues())
        finally:
            channels.close()

    # -- users and ACL rules (RocketMQ 5.3's ACL 2.0; every broker group keeps its own) ----

    def _on_groups(
        self,
        call: Callable[[bpb_grpc.BrokerStub, float], T_],
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, T_]:
        """``call`` on the leader of every broker group of ``cluster`` (every cluster when
        empty) as the NameServer lists them, or only on the group of the node
        ``broker_addr``; the answers by group name (the address for ``broker_addr``)."""
        channels = self._pool()
        try:
            targets = (
                {broker_addr: broker_addr} if broker_addr else self._leaders(channels, cluster)
            )
            if not targets:
                raise MQClientError.local(E.NO_BROKER, "no broker group is registered")
            leaderless = sorted(name for name, addr in targets.items() if not addr)
            if leaderless:
                raise MQClientError(
                    E.NO_LEADER, "UNAVAILABLE", f"no leader in {leaderless}", retryable=True
                )
            return {
                name: _follow_leader(channels, addr, name, call)
                for name, addr in sorted(targets.items())
            }
        finally:
            channels.close()

    def create_user(
        self,
        username: str,
        password: str,
        user_type: str = "",
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, pb.User]:
        """``createUser``: the user as every group stored it."""
        req = pb.CreateUserRequest(username=username, password=password, user_type=user_type)
        return self._on_groups(
            lambda stub, t: stub.CreateUser(req, timeout=t).user, cluster, broker_addr
        )

    def update_user(
        self,
        username: str,
        password: str = "",
        user_type: str = "",
        user_status: str = "",
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, pb.User]:
        """``updateUser``: change the fields given (empty: keep)."""
        req = pb.UpdateUserRequest(
            username=username, password=password, user_type=user_type, user_status=user_status
        )
        return self._on_groups(
            lambda stub, t: stub.UpdateUser(req, timeout=t).user, cluster, broker_addr
        )

    def delete_user(self, username: str, cluster: str = "", broker_addr: str = "") -> list[str]:
        """``deleteUser`` (and its ACL rules); the groups it was deleted from."""
        req = pb.DeleteUserRequest(username=username)
        return list(
            self._on_groups(lambda stub, t: stub.DeleteUser(req, timeout=t), cluster, broker_addr)
        )

    def list_users(
        self, name_filter: str = "", cluster: str = "", broker_addr: str = ""
    ) -> dict[str, list[pb.User]]:
        """``listUser``: each group's users whose name contains ``name_filter``."""
        req = pb.ListUserRequest(filter=name_filter)
        return self._on_groups(
            lambda stub, t: list(stub.ListUser(req, timeout=t).users), cluster, broker_addr
        )

    def put_acl(
        self,
        subject: str,
        resources: list[str],
        actions: list[str],
        decision: str = "Allow",
        source_ips: list[str] | None = None,
        *,
        update: bool = False,
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, pb.Acl]:
        """``createAcl`` (``update`` False) or ``updateAcl``: one rule per resource; the
        subject's rules afterwards, per group."""
        fields: dict[str, Any] = {
            "subject": subject,
            "resources": resources,
            "actions": actions,
            "decision": decision,
            "source_ips": source_ips or [],
        }

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.Acl:
            if update:
                acl: pb.Acl = stub.UpdateAcl(pb.UpdateAclRequest(**fields), timeout=t).acl
            else:
                acl = stub.CreateAcl(pb.CreateAclRequest(**fields), timeout=t).acl
            return acl

        return self._on_groups(call, cluster, broker_addr)

    def delete_acl(
        self,
        subject: str,
        resources: list[str] | None = None,
        cluster: str = "",
        broker_addr: str = "",
    ) -> list[str]:
        """``deleteAcl``: the subject's rules for ``resources`` (all when none given)."""
        req = pb.DeleteAclRequest(subject=subject, resources=resources or [])
        return list(
            self._on_groups(lambda stub, t: stub.DeleteAcl(req, timeout=t), cluster, broker_addr)
        )

    def list_acls(
        self,
        subject_filter: str = "",
        resource_filter: str = "",
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, list[pb.Acl]]:
        """``listAcl``: each group's rules, by subject."""
        req = pb.ListAclRequest(subject_filter=subject_filter, resource_filter=resource_filter)
        return self._on_groups(
            lambda stub, t: list(stub.ListAcl(req, timeout=t).acls), cluster, broker_addr
        )

    def copy_users(
        self, from_addr: str, to_addr: str, usernames: Sequence[str] = ()
    ) -> pb.ImportUsersResponse:
        """``copyUser``: users of the group of node ``from_addr`` (all, or ``usernames``) onto
        the group of node ``to_addr``, their secrets sealed under the cluster's acl.key as
        stored (both groups must share it); what the target created, updated, left as it
        was."""
        names = list(usernames) or [""]  # "": every user in one call

        def export(stub: bpb_grpc.BrokerStub, t: float) -> list[pb.SealedUser]:
            return [
                u
                for name in names
                for u in stub.ExportUsers(pb.ExportUsersRequest(username=name), timeout=t).users
            ]

        def import_(stub: bpb_grpc.BrokerStub, t: float) -> pb.ImportUsersResponse:
            done: pb.ImportUsersResponse = stub.ImportUsers(
                pb.ImportUsersRequest(users=users), timeout=t
            )
            return done

        channels = self._pool()
        try:
            users = _follow_leader(channels, from_addr, from_addr, export)
            if not users:
                raise MQClientError.local(E.USER_NOT_FOUND, f"{from_addr} has no users")
            return _follow_leader(channels, to_addr, to_addr, import_)
        finally:
            channels.close()

    def copy_acls(self, from_addr: str, to_addr: str, subjects: Sequence[str] = ()) -> list[pb.Acl]:
        """``copyAcl``: the rules of ``subjects`` (``User:alice`` or ``alice``; all when
        none) of the group of node ``from_addr`` onto the group of node ``to_addr``, each rule
        created there or, for a resource the subject has a rule for already, replaced (so
        copying twice is the same as once; the users must be there: ``copyUser`` first). The
        subjects' rules on the target afterwards."""
        listed = self.list_acls(broker_addr=from_addr)[from_addr]
        wanted = {s if s.startswith("User:") else f"User:{s}" for s in subjects}
        acls = [a for a in listed if not wanted or a.subject in wanted]
        if wanted - {a.subject for a in acls}:
            shown = ", ".join(sorted(wanted - {a.subject for a in acls}))
            raise MQClientError.local(E.ACL_NOT_FOUND, f"{from_addr} has no rules of {shown}")

        def put(stub: bpb_grpc.BrokerStub, t: float) -> list[pb.Acl]:
            have = {a.subject: a for a in stub.ListAcl(pb.ListAclRequest(), timeout=t).acls}
            return [put_acl_rules(stub, acl, have.get(acl.subject), t) for acl in acls]

        channels = self._pool()
        try:
            return _follow_leader(channels, to_addr, to_addr, put)
        finally:
            channels.close()

    def update_sub_group(
        self, config: pb.SubscriptionGroup, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, pb.SubscriptionGroup]:
        """``updateSubGroup``: create or replace a consumer group's config (consume type,
        max delivery attempts, retry backoff); the config as every group applied it."""
        req = pb.UpdateSubscriptionGroupRequest(config=config)
        return self._on_groups(
            lambda stub, t: stub.UpdateSubscriptionGroup(req, timeout=t).config,
            cluster,
            broker_addr,
        )

    def delete_sub_group(self, group: str, cluster: str = "", broker_addr: str = "") -> list[str]:
        """``deleteSubGroup``: drop a consumer group's config; the broker groups it was
        deleted from."""
        req = pb.DeleteSubscriptionGroupRequest(group=group)
        return list(
            self._on_groups(
                lambda stub, t: stub.DeleteSubscriptionGroup(req, timeout=t), cluster, broker_addr
            )
        )

    def get_user(
        self, username: str, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, pb.User]:
        """``getUser``: the user as every broker group keeps it (``USER_NOT_FOUND`` where a
        group has none)."""
        req = pb.GetUserRequest(username=username)
        return self._on_groups(
            lambda stub, t: stub.GetUser(req, timeout=t).user, cluster, broker_addr
        )

    def get_acl(self, subject: str, cluster: str = "", broker_addr: str = "") -> dict[str, pb.Acl]:
        """``getAcl``: the subject's rules as every broker group keeps them."""
        req = pb.GetAclRequest(subject=subject)
        return self._on_groups(
            lambda stub, t: stub.GetAcl(req, timeout=t).acl, cluster, broker_addr
        )

    def consumer_groups(
        self, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, list[pb.ConsumerGroupInfo]]:
        """Every consumer group a broker group knows (committed offsets or live consumers):
        its topics and online consumers, by broker group."""
        req = pb.ListConsumerGroupsRequest()
        return self._on_groups(
            lambda stub, t: list(stub.ListConsumerGroups(req, timeout=t).groups),
            cluster,
            broker_addr,
        )

    def consumer_clients(
        self, group: str, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, list[str]]:
        """The client ids of ``group``'s live consumers (their heartbeats), by broker group."""
        req = pb.GetConsumerListRequest(consumer_group=group)
        return self._on_groups(
            lambda stub, t: list(stub.GetConsumerList(req, timeout=t).client_ids),
            cluster,
            broker_addr,
        )

    def consumer_connections(
        self, group: str, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, list[pb.ClientConnection]]:
        """``group``'s live consumers with their address, language, release, protocol,
        subscriptions and locked queues, by broker group (the address for ``broker_addr``:
        that node only). Every node of each group of ``cluster`` (every cluster when empty) is
        asked and the answers merged (:func:`merged_consumers`): raftmq's consumers heartbeat
        every node, a RocketMQ 5 consumer only the nodes it is connected to; a node that does
        not answer is skipped while another of its group does."""
        req = pb.GetConsumerListRequest(consumer_group=group, with_connections=True)

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.GetConsumerListResponse:
            resp: pb.GetConsumerListResponse = stub.GetConsumerList(req, timeout=t)
            return resp

        targets = {broker_addr: [broker_addr]} if broker_addr else self._members(cluster)
        if not targets:
            raise MQClientError.local(E.NO_BROKER, "no broker group is registered")
        channels = self._pool()
        try:
            return {
                name: merged_consumers(_every_node(channels, addrs, name, call))
                for name, addrs in sorted(targets.items())
            }
        finally:
            channels.close()

    def _members(self, cluster: str) -> dict[str, list[str]]:
        """The client addresses of every registered node of each broker group of ``cluster``
        (every cluster when empty), by group name."""
        return {
            g.broker_name: sorted(m.client_addr for m in g.members)
            for c in self.cluster_info().clusters
            if not cluster or c.name == cluster
            for g in c.groups
            if g.members
        }

    def producer_connections(
        self, group: str, topic: str, broker_addr: str = ""
    ) -> dict[str, list[pb.ProducerConnection]]:
        """``producerConnection``: ``group``'s live producers as the nodes of each broker group
        routing ``topic`` know them (only the node ``broker_addr`` when given), by broker group
        (the address for ``broker_addr``). Every node is asked: raftmq's producers heartbeat
        each node, a RocketMQ 5 client only the nodes it is connected to; a node that does not
        answer is skipped while another of its group does."""
        req = pb.GetProducerConnectionsRequest(producer_group=group, topic=topic)

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.GetProducerConnectionsResponse:
            resp: pb.GetProducerConnectionsResponse = stub.GetProducerConnections(req, timeout=t)
            return resp

        if broker_addr:
            targets = {broker_addr: [broker_addr]}
        else:
            route = self._route(topic)
            targets = {g.broker_name: list(g.addrs) for g in route.groups}
        channels = self._pool()
        try:
            return {
                name: merged_producers(_every_node(channels, addrs, name, call))
                for name, addrs in sorted(targets.items())
            }
        finally:
            channels.close()

    def _route(self, topic: str) -> TopicRoute:
        channels = self._pool()
        try:
            return RouteClient(self.namesrv_addr, channels).get_route(topic, force=True)
        finally:
            channels.close()

    def producers(
        self, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, pb.GetProducerConnectionsResponse]:
        """Every live producer each broker group's leader knows (at most 1,000 per group:
        ``truncated`` says more exist), by broker group."""
        req = pb.GetProducerConnectionsRequest()
        return self._on_groups(
            lambda stub, t: stub.GetProducerConnections(req, timeout=t), cluster, broker_addr
        )

    def group_topics(self, cluster: str = "", broker_addr: str = "") -> dict[str, list[str]]:
        """The topics every broker group serves, by broker group."""
        req = pb.ListTopicsRequest()
        return self._on_groups(
            lambda stub, t: sorted(c.topic_name for c in stub.ListTopics(req, timeout=t).topics),
            cluster,
            broker_addr,
        )

    def broker_configs(
        self, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, pb.GetBrokerConfigResponse]:
        """``getBrokerConfig``: each node's own broker.conf as it runs (credentials shown only
        as set), by node address: the node ``broker_addr``, or every registered node of
        ``cluster`` (of every cluster when empty). A node that does not answer fails it."""
        req = pb.GetBrokerConfigRequest()
        return self._each_node(
            lambda stub, t: stub.GetBrokerConfig(req, timeout=t), cluster, broker_addr
        )

    def update_broker_config(
        self,
        key: str,
        value: str = "",
        *,
        clear: bool = False,
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, pb.UpdateBrokerConfigResponse]:
        """``updateBrokerConfig``: set ``key`` to ``value`` (``clear``: drop the override) on
        every member of each broker group through its log: the group of the node
        ``broker_addr``, or every group of ``cluster`` (of every cluster when empty). A key
        that needs a restart, an unknown key or a refused value: INVALID_REQUEST, nothing
        changed. The answers by group (by address for ``broker_addr``)."""
        req = pb.UpdateBrokerConfigRequest(key=key, value=value, clear=clear)
        return self._on_groups(
            lambda stub, t: stub.UpdateBrokerConfig(req, timeout=t), cluster, broker_addr
        )

    def broker_runtime_info(
        self, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, pb.GetBrokerRuntimeInfoResponse]:
        """``brokerStatus``: each node's runtime figures, by node address (the nodes as for
        :meth:`broker_configs`)."""
        req = pb.GetBrokerRuntimeInfoRequest()
        return self._each_node(
            lambda stub, t: stub.GetBrokerRuntimeInfo(req, timeout=t), cluster, broker_addr
        )

    def _each_node(
        self,
        call: Callable[[bpb_grpc.BrokerStub, float], T_],
        cluster: str = "",
        broker_addr: str = "",
    ) -> dict[str, T_]:
        """``call`` on the node ``broker_addr`` itself (not its leader), or on every
        registered node of ``cluster`` (of every cluster when empty); by node address."""
        if broker_addr:
            addrs = [broker_addr]
        else:
            addrs = sorted(
                m.client_addr
                for c in self.cluster_info().clusters
                if not cluster or c.name == cluster
                for g in c.groups
                for m in g.members
            )
        if not addrs:
            raise MQClientError.local(E.NO_BROKER, "no broker node is registered")
        channels = self._pool()
        try:
            out: dict[str, T_] = {}
            for addr in addrs:
                try:
                    out[addr] = call(channels.broker(addr), ADMIN_CALL_TIMEOUT_S)
                except grpc.RpcError as exc:
                    err = MQClientError.from_rpc(exc)
                    raise MQClientError(err.code, err.status, f"{addr}: {err.message}") from exc
            return out
        finally:
            channels.close()

    def sub_groups(
        self, cluster: str = "", broker_addr: str = ""
    ) -> dict[str, list[pb.SubscriptionGroup]]:
        """Every consumer group's config, by broker group."""
        req = pb.ListSubscriptionGroupsRequest()
        return self._on_groups(
            lambda stub, t: list(stub.ListSubscriptionGroups(req, timeout=t).groups),
            cluster,
            broker_addr,
        )


def _rule_key(rule: pb.AclRule) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """What makes two rules for one resource the same (actions and IPs in any order)."""
    return (rule.decision, tuple(sorted(rule.actions)), tuple(sorted(rule.source_ips)))


def put_acl_rules(stub: bpb_grpc.BrokerStub, acl: pb.Acl, have: pb.Acl | None, t: float) -> pb.Acl:
    """``acl``'s rules on ``stub``'s group, one call per rule (each rule has its own actions,
    decision and source IPs): UpdateAcl where the subject has a rule for the resource
    (``have``), CreateAcl elsewhere, nothing where ``have``'s rule is already the same (a
    copy run twice writes nothing to the log the second time); the subject's rules
    afterwards."""
    present = {r.resource: _rule_key(r) for r in have.rules} if have is not None else {}
    out = have or pb.Acl(subject=acl.subject)
    for rule in acl.rules:
        if present.get(rule.resource) == _rule_key(rule):
            continue
        fields: dict[str, Any] = {
            "subject": acl.subject,
            "resources": [rule.resource],
            "actions": list(rule.actions),
            "decision": rule.decision,
            "source_ips": list(rule.source_ips),
        }
        if rule.resource in present:
            out = stub.UpdateAcl(pb.UpdateAclRequest(**fields), timeout=t).acl
        else:
            out = stub.CreateAcl(pb.CreateAclRequest(**fields), timeout=t).acl
    return out


def _follow_leader(
    channels: ChannelPool,
    addr: str,
    name: str,
    call: Callable[[bpb_grpc.BrokerStub, float], T_],
    timeout_s: float = ADMIN_CALL_TIMEOUT_S,
) -> T_:
    """``call`` on ``addr``, following ``NOT_LEADER`` redirects and waiting out retryable
    errors (an election) until ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            return call(channels.broker(addr), max(remaining, 0.05))
        except grpc.RpcError as exc:
            err = MQClientError.from_rpc(exc)
            if not err.retryable or time.monotonic() >= deadline:
                raise MQClientError(err.code, err.status, f"{name}: {err.message}") from exc
            if err.code == E.NOT_LEADER and err.leader_addr:
                addr = err.leader_addr
            else:
                time.sleep(min(max(err.retry_after_ms / 1000, POLL_S), max(remaining, 0)))


def _every_node(
    channels: ChannelPool,
    addrs: Sequence[str],
    name: str,
    call: Callable[[bpb_grpc.BrokerStub, float], T_],
) -> list[T_]:
    """``call`` on every node of ``addrs`` (one broker group, ``name``): the answers of those
    that answered; the last error when none did."""
    answers: list[T_] = []
    error: MQClientError | None = None
    for addr in addrs:
        try:
            answers.append(call(channels.broker(addr), ADMIN_CALL_TIMEOUT_S))
        except grpc.RpcError as exc:
            error = MQClientError.from_rpc(exc)
            log.info("%s: node %s: %s", name, addr, error)
    if not answers:
        if error is None:
            raise MQClientError.local(E.NO_BROKER, f"{name}: no member is registered")
        raise MQClientError(error.code, error.status, f"{name}: {error.message}")
    return answers


def merged_consumers(
    answers: Sequence[pb.GetConsumerListResponse],
) -> list[pb.ClientConnection]:
    """The consumers several nodes of one broker group answered, each (protocol, client id)
    once as the node that heard from it last knows it: raftmq's (v1) by client id, then the
    RocketMQ 5 ones (v2). A broker before 0.3.0 answers client ids only: listed without the
    rest."""
    best: dict[tuple[str, str], pb.ClientConnection] = {}
    for answer in answers:
        connections = list(answer.connections) or [
            pb.ClientConnection(client_id=c, protocol="v1") for c in answer.client_ids
        ]
        for c in connections:
            key = (c.protocol, c.client_id)
            seen = best.get(key)
            if seen is None or c.last_heartbeat_age_ms < seen.last_heartbeat_age_ms:
                best[key] = c
    return [best[k] for k in sorted(best)]


def merged_producers(
    answers: Sequence[pb.GetProducerConnectionsResponse],
) -> list[pb.ProducerConnection]:
    """The producers several nodes of one broker group answered, each (group, client id) once
    as the node that heard from it last knows it, by group then client id."""
    best: dict[tuple[str, str], pb.ProducerConnection] = {}
    for answer in answers:
        for p in answer.producers:
            key = (p.producer_group, p.connection.client_id)
            seen = best.get(key)
            if seen is None or (
                p.connection.last_heartbeat_age_ms < seen.connection.last_heartbeat_age_ms
            ):
                best[key] = p
    return [best[k] for k in sorted(best)]
