from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PULL_STATUS_UNSPECIFIED: _ClassVar[PullStatus]
    FOUND: _ClassVar[PullStatus]
    NO_NEW_MSG: _ClassVar[PullStatus]
    NO_MATCHED_MSG: _ClassVar[PullStatus]
    OFFSET_ILLEGAL: _ClassVar[PullStatus]
PULL_STATUS_UNSPECIFIED: PullStatus
FOUND: PullStatus
NO_NEW_MSG: PullStatus
NO_MATCHED_MSG: PullStatus
OFFSET_ILLEGAL: PullStatus

class Message(_message.Message):
    __slots__ = ("topic", "queue_id", "tags", "keys", "properties", "body", "born_host", "born_timestamp_ms", "store_timestamp_ms", "producer_group", "msg_id", "offset_msg_id", "queue_offset", "commitlog_position", "reconsume_times", "flag", "sys_flag")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_POSITION_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    tags: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    body: bytes
    born_host: str
    born_timestamp_ms: int
    store_timestamp_ms: int
    producer_group: str
    msg_id: str
    offset_msg_id: str
    queue_offset: int
    commitlog_position: int
    reconsume_times: int
    flag: int
    sys_flag: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., tags: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., born_host: _Optional[str] = ..., born_timestamp_ms: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., producer_group: _Optional[str] = ..., msg_id: _Optional[str] = ..., offset_msg_id: _Optional[str] = ..., queue_offset: _Optional[int] = ..., commitlog_position: _Optional[int] = ..., reconsume_times: _Optional[int] = ..., flag: _Optional[int] = ..., sys_flag: _Optional[int] = ...) -> None: ...

class SendMessageRequest(_message.Message):
    __slots__ = ("topic", "messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("msg_id", "offset_msg_id", "queue_id", "queue_offset", "commitlog_position", "duplicate")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_POSITION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    commitlog_position: int
    duplicate: bool
    def __init__(self, msg_id: _Optional[str] = ..., offset_msg_id: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commitlog_position: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SendMessageResponse(_message.Message):
    __slots__ = ("packed_msg_ids", "packed_queue_ids", "packed_queue_offsets", "packed_positions", "packed_duplicates", "offset_msg_id_prefix")
    PACKED_MSG_IDS_FIELD_NUMBER: _ClassVar[int]
    PACKED_QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    PACKED_QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PACKED_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    PACKED_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    packed_msg_ids: _containers.RepeatedScalarFieldContainer[str]
    packed_queue_ids: _containers.RepeatedScalarFieldContainer[int]
    packed_queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    packed_positions: _containers.RepeatedScalarFieldContainer[int]
    packed_duplicates: _containers.RepeatedScalarFieldContainer[bool]
    offset_msg_id_prefix: str
    def __init__(self, packed_msg_ids: _Optional[_Iterable[str]] = ..., packed_queue_ids: _Optional[_Iterable[int]] = ..., packed_queue_offsets: _Optional[_Iterable[int]] = ..., packed_positions: _Optional[_Iterable[int]] = ..., packed_duplicates: _Optional[_Iterable[bool]] = ..., offset_msg_id_prefix: _Optional[str] = ...) -> None: ...

class PullMessageRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "queue_offset", "max_msgs", "subscription", "suspend_timeout_ms", "no_suspend")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MSGS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    NO_SUSPEND_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msgs: int
    subscription: str
    suspend_timeout_ms: int
    no_suspend: bool
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., max_msgs: _Optional[int] = ..., subscription: _Optional[str] = ..., suspend_timeout_ms: _Optional[int] = ..., no_suspend: _Optional[bool] = ...) -> None: ...

class PullMessageResponse(_message.Message):
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "suggest_pull_from_follower", "node_id", "raw_messages", "raw_queue_offsets", "raw_positions", "offset_msg_id_prefix")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEGIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SUGGEST_PULL_FROM_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAW_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RAW_QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    RAW_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_pull_from_follower: bool
    node_id: str
    raw_messages: bytes
    raw_queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    raw_positions: _containers.RepeatedScalarFieldContainer[int]
    offset_msg_id_prefix: str
    def __init__(self, status: _Optional[_Union[PullStatus, str]] = ..., next_begin_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., suggest_pull_from_follower: _Optional[bool] = ..., node_id: _Optional[str] = ..., raw_messages: _Optional[bytes] = ..., raw_queue_offsets: _Optional[_Iterable[int]] = ..., raw_positions: _Optional[_Iterable[int]] = ..., offset_msg_id_prefix: _Optional[str] = ...) -> None: ...

class UpdateConsumerOffsetRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "queue_offset", "sync")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    sync: bool
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., sync: _Optional[bool] = ...) -> None: ...

class UpdateConsumerOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryConsumerOffsetRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class QueryConsumerOffsetResponse(_message.Message):
    __slots__ = ("queue_offset",)
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_offset: int
    def __init__(self, queue_offset: _Optional[int] = ...) -> None: ...

class ResetConsumerOffsetRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "queue_offset", "timestamp_ms")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    timestamp_ms: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("queue_id", "queue_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    queue_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ...) -> None: ...

class ResetConsumerOffsetResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ...) -> None: ...

class SearchOffsetRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class SearchOffsetResponse(_message.Message):
    __slots__ = ("queue_offset",)
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_offset: int
    def __init__(self, queue_offset: _Optional[int] = ...) -> None: ...

class GetQueueOffsetsRequest(_message.Message):
    __slots__ = ("topic", "queue_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class GetQueueOffsetsResponse(_message.Message):
    __slots__ = ("min_offset", "max_offset")
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    max_offset: int
    def __init__(self, min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("topic_name", "read_queue_nums", "write_queue_nums", "perm", "message_type")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: str
    def __init__(self, topic_name: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., message_type: _Optional[str] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicConfig
    def __init__(self, topic: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicConfig
    def __init__(self, topic: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class GetTopicResponse(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: TopicConfig
    def __init__(self, topic: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ...) -> None: ...

class QueryMessageByKeyRequest(_message.Message):
    __slots__ = ("topic", "key", "max_num", "begin_timestamp_ms", "end_timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    max_num: int
    begin_timestamp_ms: int
    end_timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., max_num: _Optional[int] = ..., begin_timestamp_ms: _Optional[int] = ..., end_timestamp_ms: _Optional[int] = ...) -> None: ...

class QueryMessageByKeyResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class ViewMessageRequest(_message.Message):
    __slots__ = ("offset_msg_id", "msg_id", "topic")
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    offset_msg_id: str
    msg_id: str
    topic: str
    def __init__(self, offset_msg_id: _Optional[str] = ..., msg_id: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class ViewMessageResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: Message
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("topic", "expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    expression: str
    def __init__(self, topic: _Optional[str] = ..., expression: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "consumer_group", "subscriptions", "locked_queues", "language", "client_version")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LOCKED_QUEUES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    consumer_group: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    locked_queues: _containers.RepeatedCompositeFieldContainer[QueueRef]
    language: str
    client_version: str
    def __init__(self, client_id: _Optional[str] = ..., consumer_group: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., locked_queues: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ..., language: _Optional[str] = ..., client_version: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProducerHeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "producer_group", "language", "client_version", "topics")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    producer_group: str
    language: str
    client_version: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., producer_group: _Optional[str] = ..., language: _Optional[str] = ..., client_version: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ...) -> None: ...

class ProducerHeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterProducerRequest(_message.Message):
    __slots__ = ("client_id", "producer_group", "topics")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    producer_group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., producer_group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ...) -> None: ...

class UnregisterProducerResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class ClientConnection(_message.Message):
    __slots__ = ("client_id", "address", "language", "version", "last_heartbeat_age_ms", "protocol", "subscriptions", "subscriptions_truncated", "locked_queues")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LOCKED_QUEUES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    address: str
    language: str
    version: str
    last_heartbeat_age_ms: int
    protocol: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    subscriptions_truncated: bool
    locked_queues: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, client_id: _Optional[str] = ..., address: _Optional[str] = ..., language: _Optional[str] = ..., version: _Optional[str] = ..., last_heartbeat_age_ms: _Optional[int] = ..., protocol: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., subscriptions_truncated: _Optional[bool] = ..., locked_queues: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class GetProducerConnectionsRequest(_message.Message):
    __slots__ = ("producer_group", "topic")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    topic: str
    def __init__(self, producer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class ProducerConnection(_message.Message):
    __slots__ = ("producer_group", "connection")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    connection: ClientConnection
    def __init__(self, producer_group: _Optional[str] = ..., connection: _Optional[_Union[ClientConnection, _Mapping]] = ...) -> None: ...

class GetProducerConnectionsResponse(_message.Message):
    __slots__ = ("producers", "truncated")
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    producers: _containers.RepeatedCompositeFieldContainer[ProducerConnection]
    truncated: bool
    def __init__(self, producers: _Optional[_Iterable[_Union[ProducerConnection, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class UnregisterConsumerRequest(_message.Message):
    __slots__ = ("client_id", "consumer_group")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    consumer_group: str
    def __init__(self, client_id: _Optional[str] = ..., consumer_group: _Optional[str] = ...) -> None: ...

class UnregisterConsumerResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class QueueRef(_message.Message):
    __slots__ = ("topic", "queue_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class LockBatchRequest(_message.Message):
    __slots__ = ("consumer_group", "client_id", "queues")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    client_id: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, consumer_group: _Optional[str] = ..., client_id: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class LockBatchResponse(_message.Message):
    __slots__ = ("locked",)
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    locked: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, locked: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class UnlockBatchRequest(_message.Message):
    __slots__ = ("consumer_group", "client_id", "queues")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    client_id: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, consumer_group: _Optional[str] = ..., client_id: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class UnlockBatchResponse(_message.Message):
    __slots__ = ("unlocked",)
    UNLOCKED_FIELD_NUMBER: _ClassVar[int]
    unlocked: _containers.RepeatedCompositeFieldContainer[QueueRef]
    def __init__(self, unlocked: _Optional[_Iterable[_Union[QueueRef, _Mapping]]] = ...) -> None: ...

class ConsumerSendMsgBackRequest(_message.Message):
    __slots__ = ("consumer_group", "messages", "delay_level", "max_reconsume_times")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    messages: _containers.RepeatedCompositeFieldContainer[SendBackItem]
    delay_level: int
    max_reconsume_times: int
    def __init__(self, consumer_group: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[SendBackItem, _Mapping]]] = ..., delay_level: _Optional[int] = ..., max_reconsume_times: _Optional[int] = ...) -> None: ...

class SendBackItem(_message.Message):
    __slots__ = ("commitlog_position", "msg_id")
    COMMITLOG_POSITION_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    commitlog_position: int
    msg_id: str
    def __init__(self, commitlog_position: _Optional[int] = ..., msg_id: _Optional[str] = ...) -> None: ...

class SendBackResult(_message.Message):
    __slots__ = ("topic", "dead_lettered", "result", "deliver_at_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    dead_lettered: bool
    result: SendResult
    deliver_at_ms: int
    def __init__(self, topic: _Optional[str] = ..., dead_lettered: _Optional[bool] = ..., result: _Optional[_Union[SendResult, _Mapping]] = ..., deliver_at_ms: _Optional[int] = ...) -> None: ...

class ConsumerSendMsgBackResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendBackResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendBackResult, _Mapping]]] = ...) -> None: ...

class GetConsumerLagRequest(_message.Message):
    __slots__ = ("consumer_group", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueLag(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset", "committed_offset", "lag")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    committed_offset: int
    lag: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., committed_offset: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class GetConsumerLagResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueLag]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueLag, _Mapping]]] = ...) -> None: ...

class ListConsumerGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConsumerGroupInfo(_message.Message):
    __slots__ = ("consumer_group", "topics", "online_clients", "online_v2_clients")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ONLINE_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    ONLINE_V2_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    online_clients: int
    online_v2_clients: int
    def __init__(self, consumer_group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., online_clients: _Optional[int] = ..., online_v2_clients: _Optional[int] = ...) -> None: ...

class ListConsumerGroupsResponse(_message.Message):
    __slots__ = ("groups", "truncated")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroupInfo]
    truncated: bool
    def __init__(self, groups: _Optional[_Iterable[_Union[ConsumerGroupInfo, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class GetConsumerListRequest(_message.Message):
    __slots__ = ("consumer_group", "with_connections")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    WITH_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    with_connections: bool
    def __init__(self, consumer_group: _Optional[str] = ..., with_connections: _Optional[bool] = ...) -> None: ...

class GetConsumerListResponse(_message.Message):
    __slots__ = ("client_ids", "connections")
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    connections: _containers.RepeatedCompositeFieldContainer[ClientConnection]
    def __init__(self, client_ids: _Optional[_Iterable[str]] = ..., connections: _Optional[_Iterable[_Union[ClientConnection, _Mapping]]] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("username", "user_type", "user_status")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    username: str
    user_type: str
    user_status: str
    def __init__(self, username: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ...) -> None: ...

class CreateUserRequest(_message.Message):
    __slots__ = ("username", "password", "user_type", "user_status")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    user_type: str
    user_status: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ...) -> None: ...

class CreateUserResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class UpdateUserRequest(_message.Message):
    __slots__ = ("username", "password", "user_type", "user_status")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    user_type: str
    user_status: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ...) -> None: ...

class UpdateUserResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class DeleteUserRequest(_message.Message):
    __slots__ = ("username",)
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    username: str
    def __init__(self, username: _Optional[str] = ...) -> None: ...

class DeleteUserResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetUserRequest(_message.Message):
    __slots__ = ("username",)
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    username: str
    def __init__(self, username: _Optional[str] = ...) -> None: ...

class GetUserResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class ListUserRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: str
    def __init__(self, filter: _Optional[str] = ...) -> None: ...

class ListUserResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class AclRule(_message.Message):
    __slots__ = ("resource", "actions", "decision", "source_ips")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ..., source_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class Acl(_message.Message):
    __slots__ = ("subject", "rules")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    rules: _containers.RepeatedCompositeFieldContainer[AclRule]
    def __init__(self, subject: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[AclRule, _Mapping]]] = ...) -> None: ...

class CreateAclRequest(_message.Message):
    __slots__ = ("subject", "resources", "actions", "decision", "source_ips")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    actions: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ..., actions: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ..., source_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateAclResponse(_message.Message):
    __slots__ = ("acl",)
    ACL_FIELD_NUMBER: _ClassVar[int]
    acl: Acl
    def __init__(self, acl: _Optional[_Union[Acl, _Mapping]] = ...) -> None: ...

class UpdateAclRequest(_message.Message):
    __slots__ = ("subject", "resources", "actions", "decision", "source_ips")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    actions: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ..., actions: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ..., source_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateAclResponse(_message.Message):
    __slots__ = ("acl",)
    ACL_FIELD_NUMBER: _ClassVar[int]
    acl: Acl
    def __init__(self, acl: _Optional[_Union[Acl, _Mapping]] = ...) -> None: ...

class DeleteAclRequest(_message.Message):
    __slots__ = ("subject", "resources")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteAclResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAclRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class GetAclResponse(_message.Message):
    __slots__ = ("acl",)
    ACL_FIELD_NUMBER: _ClassVar[int]
    acl: Acl
    def __init__(self, acl: _Optional[_Union[Acl, _Mapping]] = ...) -> None: ...

class ListAclRequest(_message.Message):
    __slots__ = ("subject_filter", "resource_filter")
    SUBJECT_FILTER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FILTER_FIELD_NUMBER: _ClassVar[int]
    subject_filter: str
    resource_filter: str
    def __init__(self, subject_filter: _Optional[str] = ..., resource_filter: _Optional[str] = ...) -> None: ...

class ListAclResponse(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[Acl]
    def __init__(self, acls: _Optional[_Iterable[_Union[Acl, _Mapping]]] = ...) -> None: ...

class SealedUser(_message.Message):
    __slots__ = ("username", "sealed_secret", "user_type", "user_status")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    SEALED_SECRET_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    username: str
    sealed_secret: str
    user_type: str
    user_status: str
    def __init__(self, username: _Optional[str] = ..., sealed_secret: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ...) -> None: ...

class ExportUsersRequest(_message.Message):
    __slots__ = ("username",)
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    username: str
    def __init__(self, username: _Optional[str] = ...) -> None: ...

class ExportUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[SealedUser]
    def __init__(self, users: _Optional[_Iterable[_Union[SealedUser, _Mapping]]] = ...) -> None: ...

class ImportUsersRequest(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[SealedUser]
    def __init__(self, users: _Optional[_Iterable[_Union[SealedUser, _Mapping]]] = ...) -> None: ...

class ImportUsersResponse(_message.Message):
    __slots__ = ("created", "updated", "unchanged")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    created: _containers.RepeatedScalarFieldContainer[str]
    updated: _containers.RepeatedScalarFieldContainer[str]
    unchanged: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, created: _Optional[_Iterable[str]] = ..., updated: _Optional[_Iterable[str]] = ..., unchanged: _Optional[_Iterable[str]] = ...) -> None: ...

class PopMessageRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "max_msgs", "invisible_ms", "subscription", "poll_timeout_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MSGS_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    POLL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    max_msgs: int
    invisible_ms: int
    subscription: str
    poll_timeout_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., max_msgs: _Optional[int] = ..., invisible_ms: _Optional[int] = ..., subscription: _Optional[str] = ..., poll_timeout_ms: _Optional[int] = ...) -> None: ...

class PoppedMessage(_message.Message):
    __slots__ = ("message", "receipt_handle", "delivery_attempt")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    message: Message
    receipt_handle: str
    delivery_attempt: int
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., delivery_attempt: _Optional[int] = ...) -> None: ...

class PopMessageResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PoppedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[PoppedMessage, _Mapping]]] = ...) -> None: ...

class AckPopRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handles", "dead_letter", "renew_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    RENEW_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    dead_letter: bool
    renew_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., dead_letter: _Optional[bool] = ..., renew_ms: _Optional[int] = ...) -> None: ...

class AckPopResponse(_message.Message):
    __slots__ = ("codes",)
    CODES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, codes: _Optional[_Iterable[str]] = ...) -> None: ...

class ChangeInvisibleTimeRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle", "invisible_ms", "backoff_floor")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FLOOR_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    invisible_ms: int
    backoff_floor: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_ms: _Optional[int] = ..., backoff_floor: _Optional[bool] = ...) -> None: ...

class ChangeInvisibleTimeResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: PoppedMessage
    def __init__(self, message: _Optional[_Union[PoppedMessage, _Mapping]] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("topic", "msg_id", "transaction_id", "commit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    msg_id: str
    transaction_id: str
    commit: bool
    def __init__(self, topic: _Optional[str] = ..., msg_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., commit: _Optional[bool] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    def __init__(self, outcome: _Optional[str] = ...) -> None: ...

class SubscriptionGroup(_message.Message):
    __slots__ = ("group", "consume_message_orderly", "max_delivery_attempts", "backoff_type", "customized_backoff_ms", "exponential_initial_ms", "exponential_max_ms", "exponential_multiplier")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUME_MESSAGE_ORDERLY_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_TYPE_FIELD_NUMBER: _ClassVar[int]
    CUSTOMIZED_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    EXPONENTIAL_INITIAL_MS_FIELD_NUMBER: _ClassVar[int]
    EXPONENTIAL_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPONENTIAL_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    group: str
    consume_message_orderly: bool
    max_delivery_attempts: int
    backoff_type: str
    customized_backoff_ms: _containers.RepeatedScalarFieldContainer[int]
    exponential_initial_ms: int
    exponential_max_ms: int
    exponential_multiplier: float
    def __init__(self, group: _Optional[str] = ..., consume_message_orderly: _Optional[bool] = ..., max_delivery_attempts: _Optional[int] = ..., backoff_type: _Optional[str] = ..., customized_backoff_ms: _Optional[_Iterable[int]] = ..., exponential_initial_ms: _Optional[int] = ..., exponential_max_ms: _Optional[int] = ..., exponential_multiplier: _Optional[float] = ...) -> None: ...

class UpdateSubscriptionGroupRequest(_message.Message):
    __slots__ = ("config", "create_only")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    config: SubscriptionGroup
    create_only: bool
    def __init__(self, config: _Optional[_Union[SubscriptionGroup, _Mapping]] = ..., create_only: _Optional[bool] = ...) -> None: ...

class UpdateSubscriptionGroupResponse(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: SubscriptionGroup
    def __init__(self, config: _Optional[_Union[SubscriptionGroup, _Mapping]] = ...) -> None: ...

class DeleteSubscriptionGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class DeleteSubscriptionGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBrokerConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBrokerConfigResponse(_message.Message):
    __slots__ = ("node_id", "config", "source")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SourceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    config: _containers.ScalarMap[str, str]
    source: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[str] = ..., config: _Optional[_Mapping[str, str]] = ..., source: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateBrokerConfigRequest(_message.Message):
    __slots__ = ("key", "value", "clear")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    clear: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., clear: _Optional[bool] = ...) -> None: ...

class UpdateBrokerConfigResponse(_message.Message):
    __slots__ = ("key", "value", "index")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    index: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class GetBrokerRuntimeInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBrokerRuntimeInfoResponse(_message.Message):
    __slots__ = ("node_id", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    info: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[str] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSubscriptionGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSubscriptionGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[SubscriptionGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[SubscriptionGroup, _Mapping]]] = ...) -> None: ...
