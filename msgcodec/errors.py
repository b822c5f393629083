"""The codec's exception hierarchy.

Every error the codec raises on purpose is a :class:`CodecError`. ``code`` is a stable,
machine-readable string; a package that uses the codec maps these classes to its own errors at
its boundary (the broker to the :class:`~broker.state.errors.BrokerError` of the same code, the
client to ``BAD_RESPONSE``), so no error of this package crosses a wire as itself.
"""

from __future__ import annotations

from mqerrors import codes as E


class CodecError(Exception):
    """Root of every error raised by ``msgcodec``. ``code`` is stable and machine readable."""

    code = E.CODEC_ERROR


class InvalidMessageError(CodecError):
    """A message field is out of its allowed range or has a forbidden character."""

    code = E.INVALID_MESSAGE


class InvalidTopicError(InvalidMessageError):
    """A topic name is empty, too long, or uses a character outside ``[%|a-zA-Z0-9_-]``."""

    code = E.INVALID_TOPIC


class MessageBodyEmptyError(InvalidMessageError):
    """A message has an empty body (RocketMQ rejects those too)."""

    code = E.MESSAGE_BODY_EMPTY


class MessageTooLargeError(InvalidMessageError):
    """A message body is larger than ``maxMessageSize``."""

    code = E.MESSAGE_TOO_LARGE


class PropertiesTooLargeError(InvalidMessageError):
    """A message's properties (user and system: tags, keys, group) are too large."""

    code = E.PROPERTIES_TOO_LARGE


class InvalidMessageIdError(CodecError):
    """A message id (uniq id or offsetMsgId) is not 32 hex characters or is malformed."""

    code = E.INVALID_MESSAGE_ID


class CorruptMessageError(CodecError):
    """Encoded message bytes fail a check (magic, size, CRC, field bounds).

    ``offset`` is the byte offset of the bad message (or batch header) relative to the buffer
    handed to the decoder; the caller adds its file/position context. ``reason`` is the
    detail without the offset.
    """

    code = E.CORRUPT_MESSAGE

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset
