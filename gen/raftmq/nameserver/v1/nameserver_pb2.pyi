from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BrokerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BROKER_ROLE_UNSPECIFIED: _ClassVar[BrokerRole]
    LEADER: _ClassVar[BrokerRole]
    FOLLOWER: _ClassVar[BrokerRole]
    CANDIDATE: _ClassVar[BrokerRole]
    PRE_CANDIDATE: _ClassVar[BrokerRole]
BROKER_ROLE_UNSPECIFIED: BrokerRole
LEADER: BrokerRole
FOLLOWER: BrokerRole
CANDIDATE: BrokerRole
PRE_CANDIDATE: BrokerRole

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

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "node_id", "role", "client_addr", "term", "topics", "heartbeat_period_ms", "rmq5_addr", "release", "supported_feature_level", "feature_level", "remoting_addr")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    RMQ5_ADDR_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    REMOTING_ADDR_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    node_id: str
    role: BrokerRole
    client_addr: str
    term: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    heartbeat_period_ms: int
    rmq5_addr: str
    release: str
    supported_feature_level: int
    feature_level: int
    remoting_addr: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., node_id: _Optional[str] = ..., role: _Optional[_Union[BrokerRole, str]] = ..., client_addr: _Optional[str] = ..., term: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ..., heartbeat_period_ms: _Optional[int] = ..., rmq5_addr: _Optional[str] = ..., release: _Optional[str] = ..., supported_feature_level: _Optional[int] = ..., feature_level: _Optional[int] = ..., remoting_addr: _Optional[str] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("broker_expired_time_ms",)
    BROKER_EXPIRED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    broker_expired_time_ms: int
    def __init__(self, broker_expired_time_ms: _Optional[int] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "broker_name", "node_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    node_id: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class GetRouteInfoByTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class NodeAddr(_message.Message):
    __slots__ = ("node_id", "addr")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    addr: str
    def __init__(self, node_id: _Optional[str] = ..., addr: _Optional[str] = ...) -> None: ...

class GroupRoute(_message.Message):
    __slots__ = ("cluster", "broker_name", "read_queue_nums", "write_queue_nums", "perm", "leader_id", "leader_addr", "leader_term", "followers", "message_type", "rmq5_addrs")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    LEADER_TERM_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RMQ5_ADDRS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    leader_id: str
    leader_addr: str
    leader_term: int
    followers: _containers.RepeatedCompositeFieldContainer[NodeAddr]
    message_type: str
    rmq5_addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., leader_id: _Optional[str] = ..., leader_addr: _Optional[str] = ..., leader_term: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[NodeAddr, _Mapping]]] = ..., message_type: _Optional[str] = ..., rmq5_addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class GetRouteInfoByTopicResponse(_message.Message):
    __slots__ = ("topic", "groups")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupRoute]
    def __init__(self, topic: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupRoute, _Mapping]]] = ...) -> None: ...

class GetClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("node_id", "role", "client_addr", "term", "last_heartbeat_age_ms", "heartbeat_period_ms", "topic_count", "release", "supported_feature_level", "feature_level")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: BrokerRole
    client_addr: str
    term: int
    last_heartbeat_age_ms: int
    heartbeat_period_ms: int
    topic_count: int
    release: str
    supported_feature_level: int
    feature_level: int
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[_Union[BrokerRole, str]] = ..., client_addr: _Optional[str] = ..., term: _Optional[int] = ..., last_heartbeat_age_ms: _Optional[int] = ..., heartbeat_period_ms: _Optional[int] = ..., topic_count: _Optional[int] = ..., release: _Optional[str] = ..., supported_feature_level: _Optional[int] = ..., feature_level: _Optional[int] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("broker_name", "leader_id", "members")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    leader_id: str
    members: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    def __init__(self, broker_name: _Optional[str] = ..., leader_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ...) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("name", "groups")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, name: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class GetClusterInfoResponse(_message.Message):
    __slots__ = ("clusters", "refusals")
    class RefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterInfo]
    refusals: _containers.ScalarMap[str, int]
    def __init__(self, clusters: _Optional[_Iterable[_Union[ClusterInfo, _Mapping]]] = ..., refusals: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GetAllTopicListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAllTopicListResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...
