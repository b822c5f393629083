"""raftmq client: NameServer routing, producer, pull and push consumers (docs/CLIENT.md).

Depends only on the generated protos (``raftmq.*.v1``), grpc, ``google.rpc.Status``
(googleapis-common-protos, to read the structured error), the neutral packages ``msgcodec``,
``mqcli`` and ``mqsecurity`` (TLS channels and request signatures: every client takes a
``security=mqsecurity.channels.ClientSecurity``) and the stdlib.
"""

from client.admin import MQAdmin
from client.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
)
from client.consumer import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    PullConsumer,
    PullResult,
    PushConsumer,
)
from client.errors import MQClientError
from client.message import Message, MessageExt, MessageQueue, SendResult
from client.producer import (
    MessageQueueSelector,
    Producer,
    SelectMessageQueueByHash,
)

__all__ = [
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueConsistentHash",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "MQAdmin",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "SelectMessageQueueByHash",
    "SendResult",
]
