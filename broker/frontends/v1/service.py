"""``raftmq.broker.v1.Broker``: the broker's gRPC front end on a node's client port.

A thin adapter: each RPC turns its request into the arguments of one component call and the
component's domain answer into the response. The components (one job each, no gRPC) are:
:mod:`broker.components.sending` (sends), :mod:`broker.components.pulling` (pulls, long polls),
:mod:`broker.components.offsets` (consumer offsets), :mod:`broker.components.topics` (topic admin),
:mod:`broker.components.lookups` (messages by key or id), :mod:`broker.components.consumers`
(consumer registry, queue locks), :mod:`broker.components.retry` (retries, dead letters) and the
others the constructor names; the composition root (:mod:`broker.app`) builds them and this adapter
once per process. Writes are proposed to the Raft log on the leader and answered once applied;
reads are answered from this node's applied state. Errors map to gRPC status codes in
:func:`error_status` and only there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from broker.components.applied import AppliedMessages
from broker.components.authadmin import AuthAdmin, UserView
from broker.components.consumers import ConsumerGroups
from broker.components.leaderops import (
    AckRequest,
    ChangeInvisibleRequest,
    DeadLetterRequest,
    EndTransactionRequest,
    LeaderOps,
    ReceiveRequest,
    RenewRequest,
    SendRequest,
)
from broker.components.locks import LiveClient
from broker.components.lookups import Found, Lookups
from broker.components.offsets import ConsumerOffsets
from broker.components.pop import Received
from broker.components.producers import ProducerRegistry, check_producer_topics, peer_address
from broker.components.pulling import PullPath, PullQuery, PullResult
from broker.components.raftnode import RaftNode
from broker.components.retry import Retries, SendBackItem
from broker.components.settings import ServiceConfig
from broker.components.subscriptions import SubscriptionGroups
from broker.components.topics import Topics
from broker.configview import runtime_info
from broker.frontends.authguard import AuthGuard, owner_of
from broker.frontends.internal.codec import outgoing_of
from broker.frontends.v1.pbmessage import message_pb
from broker.frontends.v1.pullwire import PullAnswer, encode_pull_response, serialize_response
from broker.frontends.v1.rpcerrors import (
    error_status as error_status,  # re-exported: the broker's mapping
)
from broker.frontends.v1.rpcerrors import rpc as _rpc
from broker.frontends.v1.sendwire import SendWire, parse_send_request
from broker.liveconfig import LiveConfig
from broker.state.auth.model import Rule, User
from broker.state.errors import (
    InvalidRequestError,
)
from broker.state.machine import SendResult
from broker.state.message import validate_topic
from broker.state.records import TopicConfig
from broker.state.subgroups import (
    BACKOFF_CUSTOMIZED,
    MAX_MULTIPLIER_MILLI,
    Backoff,
    SubGroup,
)
from rpckit import decodeguard

__all__ = ["BrokerServicer", "ServiceConfig", "error_status"]

logger = logging.getLogger(__name__)

SERVICE_NAME = "raftmq.broker.v1.Broker"


class BrokerServicer(pb_grpc.BrokerServicer):
    """Serves one node. :meth:`register` adds it to the node's client port."""

    def __init__(
        self,
        node: RaftNode,
        *,
        applied: AppliedMessages,
        topics: Topics,
        puller: PullPath,
        offsets: ConsumerOffsets,
        lookups: Lookups,
        consumers: ConsumerGroups,
        producers: ProducerRegistry,
        retries: Retries,
        subgroups: SubscriptionGroups,
        leader_ops: LeaderOps,
        auth: AuthAdmin,
        guard: AuthGuard | None = None,
        live_config: LiveConfig | None = None,
    ) -> None:
        """The components this adapter calls, built once by the composition root
        (:func:`broker.app.assemble`); ``guard`` is the node's call guard, which names the
        user of each call (None: no users, nobody held to a quota); ``live_config``: the
        node's broker.conf with the group's live overrides, as GetBrokerConfig shows it and
        UpdateBrokerConfig changes it (:mod:`broker.liveconfig`; None: a servicer built without
        a broker.conf answers with no keys and refuses changes)."""
        self.node = node
        self.live_config = live_config
        self.boot_ms = int(time.time() * 1000)
        self.applied = applied
        self.topics = topics
        # The leader operations' components (sends, POP consumption, transactions).
        self.sender = leader_ops.sender
        self.puller = puller
        self.offsets = offsets
        self.lookups = lookups
        self.consumers = consumers
        self.producers = producers
        self.retries = retries
        self.pops = leader_ops.pops
        self.txns = leader_ops.txns
        self.subgroups = subgroups
        self.leader_ops = leader_ops
        self.auth = auth
        self.guard = guard

    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        """Add the service to ``server``: undecodable requests are refused with
        ``INVALID_ARGUMENT BAD_REQUEST`` (:mod:`rpckit.decodeguard`). A SendMessage request
        is read by :mod:`broker.frontends.v1.sendwire` (its bodies not copied), the others by
        the generated code; a PullMessage answer is sent as the bytes
        :mod:`broker.frontends.v1.pullwire` wrote (its messages copied once)."""
        return decodeguard.add_servicer(
            server,
            pb_grpc.add_BrokerServicer_to_server,
            self,
            {"SendMessage": parse_send_request},
            serializers={"PullMessage": serialize_response},
        )

    # ------------------------------------------------------------------ domain -> protobuf

    def _message_pb(self, found: Found) -> pb.Message:
        return message_pb(
            found.message,
            self.applied.offset_msg_id(found.position),
            found.queue_offset,
            found.position,
        )

    def _result_pb(self, r: SendResult) -> pb.SendResult:
        return pb.SendResult(
            msg_id=r.uniq_id,
            offset_msg_id=self.applied.offset_msg_id(r.position),
            queue_id=r.queue_id,
            queue_offset=r.queue_offset,
            commitlog_position=r.position,
            duplicate=r.duplicate,
        )

    def _pull_answer(self, r: PullResult) -> PullAnswer:
        wire = encode_pull_response(r, self.node.self_id, self.applied.offset_msg_id_prefix)
        return PullAnswer(wire)

    # ------------------------------------------------------------------ messages

    @_rpc
    async def SendMessage(
        self, request: SendWire | pb.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendMessageResponse:
        """``request`` as the port parses it (:func:`parse_send_request`), or a protobuf
        message (a caller in this process)."""
        if isinstance(request, SendWire):
            messages = request.messages
        else:
            messages = tuple(outgoing_of(m) for m in request.messages)
        send = SendRequest(request.topic, messages)
        results = await self.leader_ops.run(send, self._caller(context))
        return pb.SendMessageResponse(
            packed_msg_ids=[r.uniq_id for r in results],
            packed_queue_ids=[r.queue_id for r in results],
            packed_queue_offsets=[r.queue_offset for r in results],
            packed_positions=[r.position for r in results],
            packed_duplicates=[r.duplicate for r in results],
            offset_msg_id_prefix=self.applied.offset_msg_id_prefix,
        )

    @_rpc
    # The answer is not a PullMessageResponse but its bytes (pullwire.serialize_response).
    async def PullMessage(  # type: ignore[override]
        self, request: pb.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> PullAnswer:
        """The answer as its wire bytes (:mod:`broker.frontends.v1.pullwire`): the messages
        are copied once on their way to gRPC."""
        owner, unbounded = self._caller(context)
        query = PullQuery(
            request.topic,
            request.queue_id,
            request.queue_offset,
            request.max_msgs,
            request.subscription,
            request.suspend_timeout_ms,
            request.no_suspend,
            owner,
            unbounded,
        )
        return self._pull_answer(await self.puller.pull(query, context.peer()))

    @_rpc
    async def QueryMessageByKey(
        self, request: pb.QueryMessageByKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.QueryMessageByKeyResponse:
        found = self.lookups.by_key(
            request.topic,
            request.key,
            request.max_num,
            request.begin_timestamp_ms,
            request.end_timestamp_ms,
        )
        return pb.QueryMessageByKeyResponse(messages=[self._message_pb(f) for f in found])

    @_rpc
    async def ViewMessage(
        self, request: pb.ViewMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.ViewMessageResponse:
        which = request.WhichOneof("id")
        if which == "offset_msg_id":
            found = self.lookups.by_offset_msg_id(request.offset_msg_id)
        elif which == "msg_id":
            found = self.lookups.by_uniq_id(request.msg_id, request.topic)
        else:
            raise InvalidRequestError("give offset_msg_id or msg_id")
        return pb.ViewMessageResponse(message=self._message_pb(found))

    @_rpc
    async def ConsumerSendMsgBack(
        self, request: pb.ConsumerSendMsgBackRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConsumerSendMsgBackResponse:
        results = await self.retries.send_back(
            request.consumer_group,
            [SendBackItem(m.commitlog_position, m.msg_id) for m in request.messages],
            request.delay_level,
            request.max_reconsume_times if request.HasField("max_reconsume_times") else None,
            owner=self._caller(context),
        )
        return pb.ConsumerSendMsgBackResponse(
            results=[
                pb.SendBackResult(
                    topic=r.topic,
                    dead_lettered=r.dead_lettered,
                    result=self._result_pb(r.stored),
                    deliver_at_ms=r.deliver_at_ms,
                )
                for r in results
            ]
        )

    # ------------------------------------------------------------------ POP consumption

    def _popped_pb(self, r: Received) -> pb.PoppedMessage:
        return pb.PoppedMessage(
            message=self._message_pb(Found(r.message, r.position, r.queue_offset)),
            receipt_handle=r.receipt_handle,
            delivery_attempt=r.attempt,
        )

    @_rpc
    async def PopMessage(
        self, request: pb.PopMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.PopMessageResponse:
        query = ReceiveRequest(
            request.group,
            request.topic,
            request.queue_id,
            request.max_msgs,
            request.invisible_ms,
            request.subscription,
            request.poll_timeout_ms,
        )
        received = await self.leader_ops.run(query, self._caller(context))
        return pb.PopMessageResponse(messages=[self._popped_pb(r) for r in received])

    @_rpc
    async def AckPop(
        self, request: pb.AckPopRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckPopResponse:
        owner = self._caller(context)
        group, topic, handles = request.group, request.topic, tuple(request.receipt_handles)
        if request.renew_ms:
            renew = RenewRequest(group, topic, handles, request.renew_ms)
            renewed = await self.leader_ops.run(renew, owner)
            return pb.AckPopResponse(codes=renewed)
        if request.dead_letter:
            if len(handles) != 1:
                raise InvalidRequestError("a dead-letter forward names one receipt handle")
            await self.leader_ops.run(DeadLetterRequest(group, topic, handles[0]), owner)
            return pb.AckPopResponse(codes=[""])
        codes = await self.leader_ops.run(AckRequest(group, topic, handles), owner)
        return pb.AckPopResponse(codes=codes)

    @_rpc
    async def ChangeInvisibleTime(
        self, request: pb.ChangeInvisibleTimeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChangeInvisibleTimeResponse:
        change = ChangeInvisibleRequest(
            request.group,
            request.topic,
            request.receipt_handle,
            request.invisible_ms,
            request.backoff_floor,
        )
        changed = await self.leader_ops.run(change, self._caller(context))
        return pb.ChangeInvisibleTimeResponse(message=self._popped_pb(changed))

    @_rpc
    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndTransactionResponse:
        end = EndTransactionRequest(
            request.topic, request.msg_id, request.transaction_id, request.commit
        )
        outcome = await self.leader_ops.run(end, self._caller(context))
        return pb.EndTransactionResponse(outcome=outcome)

    # ------------------------------------------------------------------ subscription groups

    @_rpc
    async def UpdateSubscriptionGroup(
        self, request: pb.UpdateSubscriptionGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateSubscriptionGroupResponse:
        group = subgroup_of_pb(request.config, self.subgroups.default_attempts)
        owner, unbounded = self._caller(context)
        applied = await self.subgroups.update(group, request.create_only, owner, unbounded)
        return pb.UpdateSubscriptionGroupResponse(config=subgroup_pb(applied))

    def _caller(self, context: grpc.aio.ServicerContext) -> tuple[str, bool]:
        """The user the node's guard admitted this call for, and whether it is a Super user
        (("", False) without users: nobody to hold to a quota)."""
        return owner_of(self.guard, context)

    @_rpc
    async def DeleteSubscriptionGroup(
        self, request: pb.DeleteSubscriptionGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSubscriptionGroupResponse:
        await self.subgroups.delete(request.group)
        return pb.DeleteSubscriptionGroupResponse()

    @_rpc
    async def ListSubscriptionGroups(
        self, request: pb.ListSubscriptionGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSubscriptionGroupsResponse:
        return pb.ListSubscriptionGroupsResponse(
            groups=[subgroup_pb(g) for g in self.subgroups.list()]
        )

    # ------------------------------------------------------------------ offsets

    @_rpc
    async def UpdateConsumerOffset(
        self, request: pb.UpdateConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateConsumerOffsetResponse:
        await self.offsets.commit(
            request.consumer_group,
            request.topic,
            request.queue_id,
            request.queue_offset,
            sync=request.sync,
            owner=self._caller(context),
        )
        return pb.UpdateConsumerOffsetResponse()

    @_rpc
    async def QueryConsumerOffset(
        self, request: pb.QueryConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.QueryConsumerOffsetResponse:
        offset = self.offsets.committed(request.consumer_group, request.topic, request.queue_id)
        return pb.QueryConsumerOffsetResponse(queue_offset=offset)

    @_rpc
    async def ResetConsumerOffset(
        self, request: pb.ResetConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResetConsumerOffsetResponse:
        target = request.WhichOneof("target")
        offsets = await self.offsets.reset(
            request.consumer_group,
            request.topic,
            request.queue_id,
            queue_offset=request.queue_offset if target == "queue_offset" else None,
            timestamp_ms=request.timestamp_ms if target == "timestamp_ms" else None,
            owner=self._caller(context),
        )
        return pb.ResetConsumerOffsetResponse(
            offsets=[pb.QueueOffset(queue_id=q, queue_offset=v) for q, v in offsets.items()]
        )

    @_rpc
    async def SearchOffset(
        self, request: pb.SearchOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchOffsetResponse:
        offset = self.offsets.search(request.topic, request.queue_id, request.timestamp_ms)
        return pb.SearchOffsetResponse(queue_offset=offset)

    @_rpc
    async def GetQueueOffsets(
        self, request: pb.GetQueueOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueOffsetsResponse:
        low, high = self.offsets.queue_range(request.topic, request.queue_id)
        return pb.GetQueueOffsetsResponse(min_offset=low, max_offset=high)

    @_rpc
    async def GetConsumerLag(
        self, request: pb.GetConsumerLagRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetConsumerLagResponse:
        lags = self.offsets.lag(request.consumer_group, request.topic)
        return pb.GetConsumerLagResponse(
            queues=[
                pb.QueueLag(
                    queue_id=q.queue_id,
                    min_offset=q.min_offset,
                    max_offset=q.max_offset,
                    committed_offset=q.committed,
                    lag=q.lag,
                )
                for q in lags
            ]
        )

    # ------------------------------------------------------------------ topics

    @_rpc
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicResponse:
        t = request.topic
        topic = await self.topics.upsert(
            t.topic_name,
            t.read_queue_nums,
            t.write_queue_nums,
            t.perm,
            t.message_type,
            self._caller(context),
        )
        return pb.CreateTopicResponse(topic=_topic_pb(topic))

    @_rpc
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicResponse:
        await self.topics.delete(request.topic)
        return pb.DeleteTopicResponse()

    @_rpc
    async def GetTopic(
        self, request: pb.GetTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTopicResponse:
        return pb.GetTopicResponse(topic=_topic_pb(self.topics.get(request.topic)))

    @_rpc
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(topics=[_topic_pb(t) for t in self.topics.listed()])

    # ------------------------------------------------------------------ consumers

    @_rpc
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        self.consumers.heartbeat(
            request.consumer_group,
            request.client_id,
            [(s.topic, s.expression) for s in request.subscriptions],
            [(q.topic, q.queue_id) for q in request.locked_queues],
            self._caller(context),
            (peer_address(context.peer()), request.language, request.client_version),
        )
        return pb.HeartbeatResponse()

    @_rpc
    async def UnregisterConsumer(
        self, request: pb.UnregisterConsumerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterConsumerResponse:
        removed = self.consumers.unregister(
            request.consumer_group, request.client_id, self._caller(context)
        )
        return pb.UnregisterConsumerResponse(removed=removed)

    @_rpc
    async def GetConsumerList(
        self, request: pb.GetConsumerListRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetConsumerListResponse:
        if not request.with_connections:
            return pb.GetConsumerListResponse(
                client_ids=self.consumers.clients(request.consumer_group)
            )
        live = self.consumers.connections(request.consumer_group)
        v2 = self.consumers.v2_connections(request.consumer_group)
        return pb.GetConsumerListResponse(
            # The rebalancing ids: v1 consumers only (a RocketMQ 5 consumer never pulls the
            # queues a v1 consumer would allocate to it).
            client_ids=[c.client_id for c, _, _ in live],
            connections=[_connection_pb(c, age_ms, held) for c, age_ms, held in live]
            + [_connection_pb(c, age_ms) for c, age_ms in v2],
        )

    # ------------------------------------------------------------------ producers

    @_rpc
    async def ProducerHeartbeat(
        self, request: pb.ProducerHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProducerHeartbeatResponse:
        check_producer_topics(request.topics)
        self.producers.heartbeat(
            request.producer_group,
            request.client_id,
            (peer_address(context.peer()), request.language, request.client_version),
            self._caller(context),
        )
        return pb.ProducerHeartbeatResponse()

    @_rpc
    async def UnregisterProducer(
        self, request: pb.UnregisterProducerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterProducerResponse:
        check_producer_topics(request.topics)
        removed = self.producers.unregister(
            request.producer_group, request.client_id, self._caller(context)
        )
        return pb.UnregisterProducerResponse(removed=removed)

    @_rpc
    async def GetProducerConnections(
        self, request: pb.GetProducerConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetProducerConnectionsResponse:
        if bool(request.producer_group) != bool(request.topic):
            raise InvalidRequestError(
                "name both producer_group and topic (mqadmin producerConnection -g -t), or"
                " neither (every producer of the node)"
            )
        if request.topic:
            validate_topic(request.topic)
        live, truncated = self.producers.connections(request.producer_group)
        return pb.GetProducerConnectionsResponse(
            producers=[
                pb.ProducerConnection(producer_group=c.group, connection=_connection_pb(c, age_ms))
                for c, age_ms in live
            ],
            truncated=truncated,
        )

    @_rpc
    async def GetBrokerConfig(
        self, request: pb.GetBrokerConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetBrokerConfigResponse:
        values, sources = self.live_config.view() if self.live_config else ({}, {})
        return pb.GetBrokerConfigResponse(node_id=self.node.self_id, config=values, source=sources)

    @_rpc
    async def UpdateBrokerConfig(
        self, request: pb.UpdateBrokerConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateBrokerConfigResponse:
        if self.live_config is None:
            raise InvalidRequestError("this node runs without a broker.conf")
        value, index = await self.live_config.update(request.key, request.value, request.clear)
        return pb.UpdateBrokerConfigResponse(key=request.key, value=value, index=index)

    @_rpc
    async def GetBrokerRuntimeInfo(
        self, request: pb.GetBrokerRuntimeInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetBrokerRuntimeInfoResponse:
        now_ms = max(int(time.time() * 1000), self.boot_ms)  # a clock stepped back: 0 uptime
        info = runtime_info(self.node, self.boot_ms, now_ms)
        return pb.GetBrokerRuntimeInfoResponse(node_id=self.node.self_id, info=info)

    @_rpc
    async def ListConsumerGroups(
        self, request: pb.ListConsumerGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConsumerGroupsResponse:
        groups, truncated = self.consumers.listed()
        return pb.ListConsumerGroupsResponse(
            groups=[
                pb.ConsumerGroupInfo(
                    consumer_group=g.group,
                    topics=g.topics,
                    online_clients=g.online_clients,
                    online_v2_clients=g.online_v2_clients,
                )
                for g in groups
            ],
            truncated=truncated,
        )

    @_rpc
    async def LockBatchMQ(
        self, request: pb.LockBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.LockBatchResponse:
        queues = [(q.topic, q.queue_id) for q in request.queues]
        group, client_id = request.consumer_group, request.client_id
        locked = self.consumers.lock(group, client_id, queues, self._caller(context))
        return pb.LockBatchResponse(locked=[pb.QueueRef(topic=t, queue_id=q) for t, q in locked])

    @_rpc
    async def UnlockBatchMQ(
        self, request: pb.UnlockBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnlockBatchResponse:
        queues = [(q.topic, q.queue_id) for q in request.queues]
        released = self.consumers.unlock(
            request.consumer_group, request.client_id, queues, self._caller(context)
        )
        return pb.UnlockBatchResponse(
            unlocked=[pb.QueueRef(topic=t, queue_id=q) for t, q in released]
        )

    # ------------------------------------------------------------------ users and ACLs

    @_rpc
    async def CreateUser(
        self, request: pb.CreateUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateUserResponse:
        r = request
        user = await self.auth.create_user(r.username, r.password, r.user_type, r.user_status)
        return pb.CreateUserResponse(user=_user_pb(user))

    @_rpc
    async def UpdateUser(
        self, request: pb.UpdateUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateUserResponse:
        r = request
        user = await self.auth.update_user(r.username, r.password, r.user_type, r.user_status)
        return pb.UpdateUserResponse(user=_user_pb(user))

    @_rpc
    async def DeleteUser(
        self, request: pb.DeleteUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteUserResponse:
        await self.auth.delete_user(request.username)
        return pb.DeleteUserResponse()

    @_rpc
    async def GetUser(
        self, request: pb.GetUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetUserResponse:
        return pb.GetUserResponse(user=_user_pb(self.auth.get_user(request.username)))

    @_rpc
    async def ListUser(
        self, request: pb.ListUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListUserResponse:
        return pb.ListUserResponse(
            users=[_user_pb(u) for u in self.auth.list_users(request.filter)]
        )

    async def _put_acl(self, r: pb.CreateAclRequest | pb.UpdateAclRequest, update: bool) -> pb.Acl:
        rules = await self.auth.put_acl(
            r.subject, r.resources, r.actions, r.decision, r.source_ips, update=update
        )
        return _acl_pb(r.subject, rules)

    @_rpc
    async def CreateAcl(
        self, request: pb.CreateAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateAclResponse:
        return pb.CreateAclResponse(acl=await self._put_acl(request, update=False))

    @_rpc
    async def UpdateAcl(
        self, request: pb.UpdateAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateAclResponse:
        return pb.UpdateAclResponse(acl=await self._put_acl(request, update=True))

    @_rpc
    async def DeleteAcl(
        self, request: pb.DeleteAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteAclResponse:
        await self.auth.delete_acl(request.subject, request.resources)
        return pb.DeleteAclResponse()

    @_rpc
    async def GetAcl(
        self, request: pb.GetAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAclResponse:
        return pb.GetAclResponse(acl=_acl_pb(request.subject, self.auth.get_acl(request.subject)))

    @_rpc
    async def ListAcl(
        self, request: pb.ListAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAclResponse:
        found = self.auth.list_acls(request.subject_filter, request.resource_filter)
        return pb.ListAclResponse(acls=[_acl_pb(s, rules) for s, rules in found])

    @_rpc
    async def ExportUsers(
        self, request: pb.ExportUsersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExportUsersResponse:
        users = self.auth.export_users(request.username)
        return pb.ExportUsersResponse(users=[_sealed_pb(u) for u in users])

    @_rpc
    async def ImportUsers(
        self, request: pb.ImportUsersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ImportUsersResponse:
        users = [
            User(u.username, u.sealed_secret, u.user_type, u.user_status) for u in request.users
        ]
        done = await self.auth.import_users(users)
        return pb.ImportUsersResponse(
            created=done.created, updated=done.updated, unchanged=done.unchanged
        )


def _sealed_pb(u: User) -> pb.SealedUser:
    return pb.SealedUser(
        username=u.username,
        sealed_secret=u.sealed_secret,
        user_type=u.user_type,
        user_status=u.status,
    )


def _user_pb(u: UserView) -> pb.User:
    return pb.User(username=u.username, user_type=u.user_type, user_status=u.status)


def _acl_pb(subject: str, rules: Sequence[Rule]) -> pb.Acl:
    return pb.Acl(
        subject=subject,
        rules=[
            pb.AclRule(
                resource=str(r.resource),
                actions=r.actions,
                decision=r.decision,
                source_ips=r.source_ips,
            )
            for r in rules
        ],
    )


def _topic_pb(t: TopicConfig) -> pb.TopicConfig:
    return pb.TopicConfig(
        topic_name=t.name,
        read_queue_nums=t.read_queue_nums,
        write_queue_nums=t.write_queue_nums,
        perm=t.perm,
        message_type=t.message_type,
    )


def subgroup_pb(g: SubGroup) -> pb.SubscriptionGroup:
    b = g.backoff
    return pb.SubscriptionGroup(
        group=g.name,
        consume_message_orderly=g.fifo,
        max_delivery_attempts=g.max_attempts,
        backoff_type=b.kind,
        customized_backoff_ms=b.steps_ms,
        exponential_initial_ms=b.initial_ms,
        exponential_max_ms=b.max_ms,
        exponential_multiplier=b.multiplier_milli / 1000,
    )


def subgroup_of_pb(c: pb.SubscriptionGroup, default_attempts: int) -> SubGroup:
    """A request's config; fields left out take the defaults (checked by the admin)."""
    kind = c.backoff_type
    if not kind:
        backoff = Backoff()  # RocketMQ's default retry policy
    elif kind == BACKOFF_CUSTOMIZED:
        backoff = Backoff(kind, tuple(c.customized_backoff_ms))  # checked: 1 to 32 steps
    else:
        multiplier = c.exponential_multiplier or 1.0
        if not math.isfinite(multiplier) or not 0 < multiplier <= MAX_MULTIPLIER_MILLI / 1000:
            raise InvalidRequestError(f"exponential multiplier {multiplier} outside (0, 10]")
        backoff = Backoff(
            kind, (), c.exponential_initial_ms, c.exponential_max_ms, round(multiplier * 1000)
        )
    attempts = c.max_delivery_attempts or default_attempts
    return SubGroup(c.group, c.consume_message_orderly, attempts, backoff)


def _connection_pb(
    c: LiveClient, age_ms: int, held: Sequence[tuple[str, int]] = ()
) -> pb.ClientConnection:
    info = c.info
    return pb.ClientConnection(
        client_id=c.client_id,
        address=info.address,
        language=info.language,
        version=info.version,
        last_heartbeat_age_ms=age_ms,
        protocol=info.protocol,
        subscriptions=[pb.Subscription(topic=t, expression=e) for t, e in info.subscriptions],
        subscriptions_truncated=info.subscriptions_truncated,
        locked_queues=[pb.QueueRef(topic=t, queue_id=q) for t, q in held],
    )
