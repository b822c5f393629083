"""The broker's exception hierarchy.

Every error the broker raises on purpose is a :class:`BrokerError`. ``code`` is a stable,
machine-readable string (the gRPC layer maps codes to status codes in one place); the
message is for humans and may change. The message codec's errors (``msgcodec.errors``) have
broker subclasses here of the same code, which ``broker.state.message`` raises in their place.
"""

from __future__ import annotations

from mqerrors import codes as E
from msgcodec import errors as codec


class BrokerError(Exception):
    """Root of every error raised by ``broker``. ``code`` is stable and machine readable."""

    code = E.BROKER_ERROR


class ConfigError(BrokerError, ValueError):
    """A configuration the broker refuses to start with. Also a ValueError: value parsers'
    callers catch that."""

    code = E.CONFIG_ERROR


class FormatTooNewError(BrokerError):
    """A broker file (``config/snapshot.json``, a key index file) has a format version newer
    than this release reads. Not a :class:`CorruptStoreError`: the derived stores are neither
    deleted nor rebuilt; the node stops, naming the file and both versions."""

    code = E.FORMAT_TOO_NEW


class InvalidMessageError(codec.InvalidMessageError, BrokerError):
    """A message field is out of its allowed range or has a forbidden character."""


class InvalidTopicError(codec.InvalidTopicError, InvalidMessageError):
    """A topic name is empty, too long, or uses a character outside ``[%|a-zA-Z0-9_-]``."""


class MessageBodyEmptyError(codec.MessageBodyEmptyError, InvalidMessageError):
    """A message has an empty body (RocketMQ rejects those too)."""


class MessageTooLargeError(codec.MessageTooLargeError, InvalidMessageError):
    """A message body is larger than ``maxMessageSize``."""


class PropertiesTooLargeError(codec.PropertiesTooLargeError, InvalidMessageError):
    """A message's properties (user and system: tags, keys, group) are too large."""


class InvalidMessageIdError(codec.InvalidMessageIdError, BrokerError):
    """A message id (uniq id or offsetMsgId) is not 32 hex characters or is malformed."""


class CorruptMessageError(codec.CorruptMessageError, BrokerError):
    """Encoded message bytes fail a check (magic, size, CRC, field bounds); ``offset`` and
    ``reason`` as in :class:`msgcodec.errors.CorruptMessageError`."""


# The broker's class for each error of the message codec: ``broker.state.message`` raises these in
# place of the codec's, so that every error the broker raises is a BrokerError. Each is a
# subclass of the codec's class (first, so that it has its code) and of the broker's.
CODEC_ERRORS: dict[type[codec.CodecError], type[BrokerError]] = {
    codec.InvalidMessageError: InvalidMessageError,
    codec.InvalidTopicError: InvalidTopicError,
    codec.MessageBodyEmptyError: MessageBodyEmptyError,
    codec.MessageTooLargeError: MessageTooLargeError,
    codec.PropertiesTooLargeError: PropertiesTooLargeError,
    codec.InvalidMessageIdError: InvalidMessageIdError,
    codec.CorruptMessageError: CorruptMessageError,
}


class CorruptStoreError(BrokerError):
    """A broker store file (ConsumeQueue, index) fails a check. Carries path and offset."""

    code = E.CORRUPT_STORE

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.offset = offset


class OffsetOutOfRangeError(BrokerError):
    """A queue offset is outside ``[min_offset, max_offset]`` of its ConsumeQueue."""

    code = E.OFFSET_OUT_OF_RANGE

    def __init__(self, message: str, *, min_offset: int, max_offset: int) -> None:
        super().__init__(message)
        self.min_offset = min_offset
        self.max_offset = max_offset


class PositionOrderError(BrokerError):
    """A store was asked to append a commitlog position below one it already holds.

    ConsumeQueues and the key index are built in commitlog order; replaying entries means
    ``truncate_after_position`` first.
    """

    code = E.POSITION_ORDER


class DerivedStateError(BrokerError):
    """A ConsumeQueue record read does not match the commitlog and could not be rebuilt in
    place (broker.state.derived): this node rebuilds its derived state at its next start; another
    member (or this one then) serves the read. Retryable: nothing is lost."""

    code = E.DERIVED_STATE_DAMAGED


class QueueStoreClosedError(BrokerError):
    """An operation on a consume queue or index store that was closed (named apart from
    dledger's ``StoreClosedError`` of the log store)."""

    code = E.STORE_CLOSED


class FeatureLevelTooLowError(BrokerError):
    """The group's feature level is below the one that introduces a record the request would
    propose (broker/state/features.py): a member may run a release that does not apply it."""

    code = E.FEATURE_LEVEL_UNSUPPORTED


class InvalidRequestError(BrokerError):
    """A request field is missing or out of range (queue nums, perm, batch size, ...)."""

    code = E.INVALID_REQUEST


class QueueIdOutOfRangeError(InvalidRequestError):
    """A queue id is not below the topic's write (send) or read (pull) queue count."""

    code = E.QUEUE_ID_OUT_OF_RANGE


class TopicNotFoundError(BrokerError):
    """The topic does not exist (and ``autoCreateTopicEnable`` is off)."""

    code = E.TOPIC_NOT_FOUND


class NoPermissionError(BrokerError):
    """The topic's perm forbids the operation (send without PERM_WRITE, pull without READ)."""

    code = E.NO_PERMISSION


class ClientIdTakenError(NoPermissionError):
    """A heartbeat naming a consumer (group and client id) that another user's heartbeats
    registered and keep alive: refused, as the RocketMQ 5 port refuses such a ``Settings``."""

    code = E.CLIENT_ID_TAKEN


class MessageNotFoundError(BrokerError):
    """No stored message has the id or position asked for."""

    code = E.MESSAGE_NOT_FOUND


class SystemTopicError(NoPermissionError):
    """A public RPC tried to create, delete or write a system topic (``SCHEDULE_TOPIC_XXXX``,
    ``%RETRY%*``, ``%DLQ%*``): only the broker itself writes those (retries through
    ``ConsumerSendMsgBack``)."""

    code = E.SYSTEM_TOPIC


class ResourceExhaustedError(BrokerError):
    """A bounded table of the broker is full (gRPC ``RESOURCE_EXHAUSTED``); the subclass's code
    names the table. Retry later, or use fewer of the resource."""

    code = E.RESOURCE_EXHAUSTED


class QuotaExceededError(ResourceExhaustedError):
    """One user holds its share of a table every user shares (a ``broker.conf`` quota key,
    ``...PerUser``): the message starts with ``quota <key>:``. Other users are still served."""

    code = E.RESOURCE_EXHAUSTED

    def __init__(self, key: str, text: str) -> None:
        super().__init__(f"quota {key}: {text}")
        self.key = key


class TooManyConsumersError(ResourceExhaustedError):
    """The node tracks as many consumers (per group or in total) as it may."""

    code = E.TOO_MANY_CONSUMERS


class TooManyLocksError(ResourceExhaustedError):
    """The queue lock table (per client or in total) is full."""

    code = E.TOO_MANY_LOCKS


class TooManyLongPollsError(ResourceExhaustedError):
    """As many pulls wait for messages (per connection or in total) as the node holds."""

    code = E.TOO_MANY_LONG_POLLS


class TooManyPendingOffsetsError(ResourceExhaustedError):
    """The leader's buffer of not yet committed consumer offsets is full."""

    code = E.TOO_MANY_PENDING_OFFSETS
