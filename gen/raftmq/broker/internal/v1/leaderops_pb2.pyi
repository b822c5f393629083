from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outgoing(_message.Message):
    __slots__ = ("topic", "queue_id", "tags", "keys", "properties", "body", "born_host", "born_timestamp_ms", "producer_group", "msg_id", "reconsume_times", "flag", "sys_flag")
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
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
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
    producer_group: str
    msg_id: str
    reconsume_times: int
    flag: int
    sys_flag: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., tags: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., born_host: _Optional[str] = ..., born_timestamp_ms: _Optional[int] = ..., producer_group: _Optional[str] = ..., msg_id: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., flag: _Optional[int] = ..., sys_flag: _Optional[int] = ...) -> None: ...

class Send(_message.Message):
    __slots__ = ("topic", "messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: _containers.RepeatedCompositeFieldContainer[Outgoing]
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Outgoing, _Mapping]]] = ...) -> None: ...

class Receive(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "batch_size", "invisible_ms", "subscription", "poll_timeout_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    POLL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    batch_size: int
    invisible_ms: int
    subscription: str
    poll_timeout_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., batch_size: _Optional[int] = ..., invisible_ms: _Optional[int] = ..., subscription: _Optional[str] = ..., poll_timeout_ms: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("group", "topic", "receipt_handles")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class Renew(_message.Message):
    __slots__ = ("group", "topic", "receipt_handles", "invisible_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    invisible_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., invisible_ms: _Optional[int] = ...) -> None: ...

class ChangeInvisible(_message.Message):
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

class DeadLetter(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class EndTransaction(_message.Message):
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

class CreateGroup(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class RemotingProof(_message.Message):
    __slots__ = ("access_key", "signature", "signed")
    ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    access_key: str
    signature: str
    signed: bytes
    def __init__(self, access_key: _Optional[str] = ..., signature: _Optional[str] = ..., signed: _Optional[bytes] = ...) -> None: ...

class LeaderCall(_message.Message):
    __slots__ = ("remoting", "send", "receive", "ack", "renew", "change_invisible", "dead_letter", "end_transaction", "create_group")
    REMOTING_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    CREATE_GROUP_FIELD_NUMBER: _ClassVar[int]
    remoting: RemotingProof
    send: Send
    receive: Receive
    ack: Ack
    renew: Renew
    change_invisible: ChangeInvisible
    dead_letter: DeadLetter
    end_transaction: EndTransaction
    create_group: CreateGroup
    def __init__(self, remoting: _Optional[_Union[RemotingProof, _Mapping]] = ..., send: _Optional[_Union[Send, _Mapping]] = ..., receive: _Optional[_Union[Receive, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., renew: _Optional[_Union[Renew, _Mapping]] = ..., change_invisible: _Optional[_Union[ChangeInvisible, _Mapping]] = ..., dead_letter: _Optional[_Union[DeadLetter, _Mapping]] = ..., end_transaction: _Optional[_Union[EndTransaction, _Mapping]] = ..., create_group: _Optional[_Union[CreateGroup, _Mapping]] = ...) -> None: ...

class Stored(_message.Message):
    __slots__ = ("msg_id", "queue_id", "queue_offset", "duplicate", "position", "topic", "store_timestamp_ms")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    queue_id: int
    queue_offset: int
    duplicate: bool
    position: int
    topic: str
    store_timestamp_ms: int
    def __init__(self, msg_id: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., duplicate: _Optional[bool] = ..., position: _Optional[int] = ..., topic: _Optional[str] = ..., store_timestamp_ms: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("stored", "queue_id", "queue_offset", "position", "attempt", "receipt_handle")
    STORED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    stored: bytes
    queue_id: int
    queue_offset: int
    position: int
    attempt: int
    receipt_handle: str
    def __init__(self, stored: _Optional[bytes] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., position: _Optional[int] = ..., attempt: _Optional[int] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class SendAnswer(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: _containers.RepeatedCompositeFieldContainer[Stored]
    def __init__(self, stored: _Optional[_Iterable[_Union[Stored, _Mapping]]] = ...) -> None: ...

class Deliveries(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class HandleCodes(_message.Message):
    __slots__ = ("codes",)
    CODES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, codes: _Optional[_Iterable[str]] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    def __init__(self, outcome: _Optional[str] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaderAnswer(_message.Message):
    __slots__ = ("sent", "received", "codes", "changed", "outcome", "done")
    SENT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    sent: SendAnswer
    received: Deliveries
    codes: HandleCodes
    changed: Delivery
    outcome: Outcome
    done: Done
    def __init__(self, sent: _Optional[_Union[SendAnswer, _Mapping]] = ..., received: _Optional[_Union[Deliveries, _Mapping]] = ..., codes: _Optional[_Union[HandleCodes, _Mapping]] = ..., changed: _Optional[_Union[Delivery, _Mapping]] = ..., outcome: _Optional[_Union[Outcome, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...
