"""The stored message codec: the one implementation of the message and batch layout that the
broker, the client and the tools import (docs/FORMAT.md, "Broker: Message", "Batch" and
"Message ids").

The Raft log (``dledger``) holds entries whose bodies are opaque bytes; the broker puts a batch
of messages encoded here in one entry body, every member reads them back here when it applies
the entry, and a client decodes the stored bytes of a raw pull here. This package depends on
neither ``broker`` nor ``client`` (nor on gRPC): stdlib and ``crc32c`` only.

- :mod:`msgcodec.layout`: limits, magic numbers, structs, :class:`Message`, the tag hash;
- :mod:`msgcodec.encode`: the careful encoders and the send path's fast batch encoder;
- :mod:`msgcodec.decode`: the fast and the careful decoder, batch framing, the dispatch scan;
- :mod:`msgcodec.ids`: uniq ids and offsetMsgIds;
- :mod:`msgcodec.errors`: the codec's errors (:class:`CodecError` and its subclasses, each
  with a stable ``code``), which every user maps to its own at its boundary.

A message's *queue offset* is not stored: it is assigned when a committed entry is applied
(the ConsumeQueue's next offset), identically on every member. Its commitlog *position* is the
entry body's position plus the message's offset inside the batch (``encode_batch`` returns the
offsets).
"""

from msgcodec.decode import (
    DispatchInfo,
    DispatchRow,
    MessageRow,
    batch_count,
    check_message,
    decode_batch,
    decode_message,
    decode_row,
    decode_rows,
    is_batch,
    iter_batch,
    iter_dispatch,
    read_dispatch,
    scan_dispatch,
)
from msgcodec.encode import (
    MessageFields,
    encode_batch,
    encode_batch_fields,
    encode_message,
    message_from_fields,
    uniq_id_to_bytes,
    validate_topic,
)
from msgcodec.errors import (
    CodecError,
    CorruptMessageError,
    InvalidMessageError,
    InvalidMessageIdError,
    InvalidTopicError,
    MessageBodyEmptyError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)
from msgcodec.ids import (
    OFFSET_MSG_ID_PREFIX_CHARS,
    OffsetMsgId,
    UniqIdGenerator,
    UniqIdInfo,
    decode_offset_msg_id,
    encode_offset_msg_id,
    local_ipv4,
    parse_uniq_id,
)
from msgcodec.layout import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BATCH_VERSION,
    DEFAULT_MAX_MESSAGE_SIZE_BYTES,
    KEY_SEPARATOR,
    MAX_BORN_HOST_BYTES,
    MAX_PRODUCER_GROUP_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_LENGTH,
    MESSAGE_CRC_END,
    MESSAGE_FIXED,
    MESSAGE_FIXED_AFTER_CRC,
    MESSAGE_FIXED_SIZE,
    MESSAGE_HEAD,
    MESSAGE_MAGIC,
    MESSAGE_VERSION,
    MIN_MESSAGE_SIZE,
    MSG_ID_HEX_CHARS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    STORE_TIMESTAMP_AT,
    TOPIC_CHARACTERS,
    TOPIC_PATTERN,
    UNIQ_ID_BYTES,
    Buffer,
    Message,
    crc32c,
    java_string_hash,
    tags_hash,
)

__all__ = [
    "BATCH_HEADER",
    "BATCH_HEADER_SIZE",
    "BATCH_MAGIC",
    "BATCH_VERSION",
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "KEY_SEPARATOR",
    "MAX_BORN_HOST_BYTES",
    "MAX_PRODUCER_GROUP_BYTES",
    "MAX_PROPERTIES_BYTES",
    "MAX_TOPIC_LENGTH",
    "MESSAGE_CRC_END",
    "MESSAGE_FIXED",
    "MESSAGE_FIXED_AFTER_CRC",
    "MESSAGE_FIXED_SIZE",
    "MESSAGE_HEAD",
    "MESSAGE_MAGIC",
    "MESSAGE_VERSION",
    "MIN_MESSAGE_SIZE",
    "MSG_ID_HEX_CHARS",
    "NAME_VALUE_SEPARATOR",
    "OFFSET_MSG_ID_PREFIX_CHARS",
    "PROPERTY_SEPARATOR",
    "STORE_TIMESTAMP_AT",
    "TOPIC_CHARACTERS",
    "TOPIC_PATTERN",
    "UNIQ_ID_BYTES",
    "Buffer",
    "CodecError",
    "CorruptMessageError",
    "DispatchInfo",
    "DispatchRow",
    "InvalidMessageError",
    "InvalidMessageIdError",
    "InvalidTopicError",
    "Message",
    "MessageBodyEmptyError",
    "MessageFields",
    "MessageRow",
    "MessageTooLargeError",
    "OffsetMsgId",
    "PropertiesTooLargeError",
    "UniqIdGenerator",
    "UniqIdInfo",
    "batch_count",
    "check_message",
    "crc32c",
    "decode_batch",
    "decode_message",
    "decode_offset_msg_id",
    "decode_row",
    "decode_rows",
    "encode_batch",
    "encode_batch_fields",
    "encode_message",
    "encode_offset_msg_id",
    "is_batch",
    "iter_batch",
    "iter_dispatch",
    "java_string_hash",
    "local_ipv4",
    "message_from_fields",
    "parse_uniq_id",
    "read_dispatch",
    "scan_dispatch",
    "tags_hash",
    "uniq_id_to_bytes",
    "validate_topic",
]
