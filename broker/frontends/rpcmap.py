"""What each client-port RPC touches: the (resource, action) pairs a caller needs.

One table for every method of ``raftmq.broker.v1.Broker``, ``raftmq.dledger.v1.DLedgerClient`` and
``raftmq.broker.internal.v1.LeaderOps`` (whose one method needs what the leader operation inside
needs: :data:`LEADER_OP_NEEDS`) (docs/SECURITY.md, "Users and permissions", shows it to users). A
method missing here is refused to everyone but Super users, and ``tests/unit/test_acl_guard.py``
fails when one is missing. :data:`SUPER_ONLY` marks what only Super users may call: raw log access,
leadership, and the user and ACL admin calls (a Normal user with ``Cluster:* All`` must not make
itself Super).

A retry or dead-letter topic (``%RETRY%g``, ``%DLQ%g``) stands for its consumer group: reading
it needs ``Group:g Sub``, as in RocketMQ.

:data:`STORED_MESSAGES` names the calls that act on stored messages by commitlog position: the
caller also needs ``Sub`` on each message's topic (otherwise a group's consumer could copy any
topic's message into its retry topic and read it there). The guard reads those topics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from broker.components.consumers import MAX_LOCK_BATCH, MAX_SUBSCRIPTIONS
from broker.components.producers import MAX_PRODUCER_TOPICS
from broker.components.retry import MAX_SEND_BACK_BATCH
from broker.state.auth.model import (
    CLUSTER,
    CREATE,
    DELETE,
    GET,
    GROUP,
    LIST,
    PUB,
    SUB,
    TOPIC,
    UPDATE,
    Resource,
)
from broker.state.names import DLQ_PREFIX, RETRY_PREFIX

Want = tuple[Resource, str]
# request, cluster name -> the pairs the call needs
Needs = Callable[[Any, str], list[Want]]
SUPER_ONLY = "super-only"

BROKER = "/raftmq.broker.v1.Broker/"
DLEDGER = "/raftmq.dledger.v1.DLedgerClient/"
# The leader operations a member forwards for its client (broker/frontends/internal/): one
# method, whose needs are those of the one operation inside, for the original caller.
LEADER_OPS = "/raftmq.broker.internal.v1.LeaderOps/"
# RocketMQ 5's protocol (broker/frontends/v2/): its requests name topics as ``Resource{name}``.
V2 = "/apache.rocketmq.v2.MessagingService/"
# The pseudo-method of one command on a Telemetry stream: TELEMETRY + the command's field name.
TELEMETRY = V2 + "Telemetry/"
# Distinct topics of one v2 SendMessage matched one by one; a request over the front end's own
# message limit (broker.frontends.v2.service.MAX_SEND_MESSAGES) is refused there before anything
# runs.
MAX_V2_SEND_TOPICS = 1024


def topic(name: str, action: str) -> Want:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return Resource(GROUP, name[len(prefix) :]), action
    return Resource(TOPIC, name), action


def group(name: str, action: str) -> Want:
    return Resource(GROUP, name), action


def cluster(name: str, action: str) -> Want:
    return Resource(CLUSTER, name), action


def _topics_sub(topics: list[str]) -> list[Want]:
    return [topic(t, SUB) for t in dict.fromkeys(topics)]


def _consumer(r: Any, c: str) -> list[Want]:
    return [group(r.consumer_group, SUB), topic(r.topic, SUB)]


def _locks(r: Any, c: str) -> list[Want]:
    if len(r.queues) > MAX_LOCK_BATCH:
        # Refused by the servicer before anything changes: no need to match thousands.
        return [group(r.consumer_group, SUB)]
    return [group(r.consumer_group, SUB), *_topics_sub([q.topic for q in r.queues])]


def _heartbeat(r: Any, c: str) -> list[Want]:
    if len(r.subscriptions) > MAX_SUBSCRIPTIONS or len(r.locked_queues) > MAX_LOCK_BATCH:
        return [group(r.consumer_group, SUB)]  # refused by the servicer, as above
    topics = [s.topic for s in r.subscriptions] + [q.topic for q in r.locked_queues]
    return [group(r.consumer_group, SUB), *_topics_sub(topics)]


def _producer_topics(r: Any, c: str) -> list[Want]:
    # Pub on each topic a producer's heartbeat names (as a RocketMQ 5 producer's Settings);
    # none named, or more than the registry's limit: refused by the servicer, the first asked
    # here (SendMessage's empty topic likewise).
    names = dict.fromkeys(r.topics[:MAX_PRODUCER_TOPICS]) or {"": None}
    return [topic(name, PUB) for name in names]


def _producer_connections(r: Any, c: str) -> list[Want]:
    # A group's producers: rights on the group and the topic (producerConnection -g -t); every
    # producer of the node (the dashboard): the cluster's List right, as ListConsumerGroups.
    if r.producer_group or r.topic:
        return [group(r.producer_group, GET), topic(r.topic, GET)]
    return [cluster(c, LIST)]


def _view(r: Any, c: str) -> list[Want]:
    # By offset id the message may be of any topic: a cluster-wide read.
    if r.WhichOneof("id") == "msg_id" and r.topic:
        return [topic(r.topic, GET)]
    return [cluster(c, GET)]


def _v2_send(r: Any, c: str) -> list[Want]:
    names = dict.fromkeys(m.topic.name for m in r.messages[:MAX_V2_SEND_TOPICS])
    return [topic(name, PUB) for name in names]


def _v2_queue_consumer(r: Any, c: str) -> list[Want]:
    return [group(r.group.name, SUB), topic(r.message_queue.topic.name, SUB)]


def _v2_consumer(r: Any, c: str) -> list[Want]:
    return [group(r.group.name, SUB), topic(r.topic.name, SUB)]


def _pop_consumer(r: Any, c: str) -> list[Want]:
    # A receipt handle names its group and topic; the POP state refuses a request without a
    # topic and a handle that is not the request's pair (INVALID_RECEIPT_HANDLE, the answer of
    # a malformed one), so checking the request's pair covers the handle.
    return [group(r.group, SUB), topic(r.topic, SUB)]


def _update_subgroup(r: Any, c: str) -> list[Want]:
    # Creating a group with the defaults is what a consumer's Settings does (RocketMQ creates
    # subscription groups for their consumers): Sub on the group. Any config: Update.
    return [group(r.config.group, SUB if r.create_only else UPDATE)]


def _authenticated_only(r: Any, c: str) -> list[Want]:
    return []


# A leader operation (raftmq.broker.internal.v1.LeaderCall's ``op``) -> what it needs: what
# the direct call needs (v1's SendMessage, PopMessage, AckPop, ChangeInvisibleTime,
# EndTransaction and UpdateSubscriptionGroup with create_only), so a forward can do nothing its
# caller may not.
LEADER_OP_NEEDS: Mapping[str, Needs] = {
    "send": lambda r, c: [topic(r.topic, PUB)],
    "receive": _pop_consumer,
    "ack": _pop_consumer,
    "renew": _pop_consumer,
    "change_invisible": _pop_consumer,
    "dead_letter": _pop_consumer,
    "end_transaction": lambda r, c: [topic(r.topic, PUB)],
    "create_group": lambda r, c: [group(r.group, SUB)],
}


def _leader_call(r: Any, c: str) -> list[Want]:
    kind = r.WhichOneof("op")
    if kind is None:
        return []  # no operation: refused by the servicer (BAD_REQUEST) before anything runs
    return LEADER_OP_NEEDS[kind](getattr(r, kind), c)


# apache.rocketmq.v2.ClientType.PRODUCER (the stubs are loaded only with a v2 port; the number
# is checked against them in tests/unit/test_rmq5_acl.py).
V2_PRODUCER = 1


def _v2_settings(r: Any, c: str) -> list[Want]:
    """A client's Settings (RocketMQ 5.3): a producer needs Pub on each topic it publishes,
    a consumer Sub on its group and on each topic it subscribes. Over the front end's own limit
    (broker.frontends.v2.service.MAX_SETTINGS_TOPICS, the same number) it is refused there."""
    if r.client_type == V2_PRODUCER:
        names = dict.fromkeys(t.name for t in r.publishing.topics[:MAX_V2_SEND_TOPICS])
        return [topic(name, PUB) for name in names]
    entries = r.subscription.subscriptions[:MAX_V2_SEND_TOPICS]
    return [group(r.subscription.group.name, SUB), *_topics_sub([e.topic.name for e in entries])]


# method path -> the pairs it needs, or SUPER_ONLY
RPC_NEEDS: Mapping[str, Needs | str] = {
    BROKER + "SendMessage": lambda r, c: [topic(r.topic, PUB)],
    BROKER + "PullMessage": _consumer,
    BROKER + "UpdateConsumerOffset": _consumer,
    BROKER + "QueryConsumerOffset": _consumer,
    BROKER + "ResetConsumerOffset": lambda r, c: [group(r.consumer_group, UPDATE)],
    BROKER + "SearchOffset": lambda r, c: [topic(r.topic, SUB)],
    BROKER + "GetQueueOffsets": lambda r, c: [topic(r.topic, SUB)],
    BROKER + "CreateTopic": lambda r, c: [topic(r.topic.topic_name, CREATE)],
    BROKER + "DeleteTopic": lambda r, c: [topic(r.topic, DELETE)],
    BROKER + "GetTopic": lambda r, c: [topic(r.topic, GET)],
    BROKER + "ListTopics": lambda r, c: [cluster(c, LIST)],
    BROKER + "QueryMessageByKey": lambda r, c: [topic(r.topic, GET)],
    BROKER + "ViewMessage": _view,
    BROKER + "Heartbeat": _heartbeat,
    BROKER + "GetConsumerList": lambda r, c: [group(r.consumer_group, SUB)],
    BROKER + "ListConsumerGroups": lambda r, c: [cluster(c, LIST)],
    BROKER + "UnregisterConsumer": lambda r, c: [group(r.consumer_group, SUB)],
    BROKER + "ProducerHeartbeat": _producer_topics,
    BROKER + "UnregisterProducer": _producer_topics,
    BROKER + "GetProducerConnections": _producer_connections,
    BROKER + "LockBatchMQ": _locks,
    BROKER + "UnlockBatchMQ": _locks,
    BROKER + "ConsumerSendMsgBack": lambda r, c: [group(r.consumer_group, SUB)],
    BROKER + "GetConsumerLag": lambda r, c: [group(r.consumer_group, GET), topic(r.topic, GET)],
    BROKER + "PopMessage": _pop_consumer,
    BROKER + "AckPop": _pop_consumer,
    BROKER + "ChangeInvisibleTime": _pop_consumer,
    BROKER + "EndTransaction": lambda r, c: [topic(r.topic, PUB)],
    BROKER + "UpdateSubscriptionGroup": _update_subgroup,
    BROKER + "ListSubscriptionGroups": lambda r, c: [cluster(c, LIST)],
    # a node's own broker.conf (credentials never): what the cluster's operators may read
    BROKER + "GetBrokerConfig": lambda r, c: [cluster(c, GET)],
    BROKER + "GetBrokerRuntimeInfo": lambda r, c: [cluster(c, GET)],
    # a live broker.conf change of the whole group (RocketMQ: the cluster's UPDATE right)
    BROKER + "UpdateBrokerConfig": lambda r, c: [cluster(c, UPDATE)],
    BROKER + "DeleteSubscriptionGroup": lambda r, c: [group(r.group, DELETE)],
    BROKER + "CreateUser": SUPER_ONLY,
    BROKER + "UpdateUser": SUPER_ONLY,
    BROKER + "DeleteUser": SUPER_ONLY,
    BROKER + "GetUser": SUPER_ONLY,
    BROKER + "ListUser": SUPER_ONLY,
    BROKER + "CreateAcl": SUPER_ONLY,
    BROKER + "UpdateAcl": SUPER_ONLY,
    BROKER + "DeleteAcl": SUPER_ONLY,
    BROKER + "GetAcl": SUPER_ONLY,
    BROKER + "ListAcl": SUPER_ONLY,
    BROKER + "ExportUsers": SUPER_ONLY,  # sealed secrets (docs/SECURITY.md "Several groups")
    BROKER + "ImportUsers": SUPER_ONLY,
    DLEDGER + "Append": SUPER_ONLY,
    DLEDGER + "Get": SUPER_ONLY,  # raw entries: every topic's messages
    DLEDGER + "TransferLeadership": SUPER_ONLY,
    DLEDGER + "Metadata": lambda r, c: [cluster(c, GET)],
    DLEDGER + "ListMembers": lambda r, c: [cluster(c, GET)],
    DLEDGER + "ChangeMember": SUPER_ONLY,
    DLEDGER + "SetFeatureLevel": SUPER_ONLY,
    LEADER_OPS + "Call": _leader_call,
    # RocketMQ 5.3's mapping of its gRPC protocol (QueryRoute: see ANY_OF).
    V2 + "QueryRoute": lambda r, c: [topic(r.topic.name, PUB)],
    V2 + "SendMessage": _v2_send,
    V2 + "EndTransaction": lambda r, c: [topic(r.topic.name, PUB)],
    V2 + "RecallMessage": lambda r, c: [topic(r.topic.name, PUB)],
    V2 + "QueryAssignment": _v2_consumer,
    V2 + "ReceiveMessage": _v2_queue_consumer,
    V2 + "AckMessage": _v2_consumer,
    V2 + "ChangeInvisibleDuration": _v2_consumer,
    V2 + "ForwardMessageToDeadLetterQueue": _v2_consumer,
    V2 + "PullMessage": _v2_queue_consumer,
    V2 + "UpdateOffset": _v2_queue_consumer,
    V2 + "GetOffset": _v2_queue_consumer,
    V2 + "QueryOffset": lambda r, c: [topic(r.message_queue.topic.name, SUB)],
    V2 + "SyncLiteSubscription": _v2_consumer,
    V2 + "Heartbeat": _authenticated_only,
    V2 + "Telemetry": _authenticated_only,  # a stream: each command is checked (below)
    V2 + "NotifyClientTermination": _authenticated_only,
    # The commands a client sends on its Telemetry stream, each checked when it arrives
    # (broker.frontends.v2.service): TELEMETRY + the command's field name. Settings registers the
    # client; the others are a client's answers to server commands, which change nothing.
    **{
        TELEMETRY + kind: _authenticated_only
        for kind in (
            "thread_stack_trace",
            "verify_message_result",
            "recover_orphaned_transaction_command",
            "print_thread_stack_trace_command",
            "verify_message_command",
            "reconnect_endpoints_command",
            "notify_unsubscribe_lite_command",
        )
    },
    TELEMETRY + "settings": _v2_settings,
}

# method path -> alternative lists of pairs: the call is allowed when one list is. A v2 route
# lookup is for a producer (Pub) or a consumer (Sub) of the topic, as in RocketMQ 5.3.
ANY_OF: Mapping[str, Callable[[Any, str], list[list[Want]]]] = {
    V2 + "QueryRoute": lambda r, c: [[topic(r.topic.name, PUB)], [topic(r.topic.name, SUB)]],
}


def _send_back_positions(r: Any) -> list[int]:
    if len(r.messages) > MAX_SEND_BACK_BATCH:
        return []  # refused by the servicer before anything changes
    return list(dict.fromkeys(m.commitlog_position for m in r.messages))


# method path -> request -> the commitlog positions of the stored messages it acts on
STORED_MESSAGES: Mapping[str, Callable[[Any], list[int]]] = {
    BROKER + "ConsumerSendMsgBack": _send_back_positions,
}
