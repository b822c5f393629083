"""The broker's view of the stored message codec (:mod:`msgcodec`).

The layout, the encoders, the decoders and the message ids live in ``msgcodec``, which the
client and the tools import too; docs/FORMAT.md documents every byte. This module gives the
broker the names it uses, with one difference: where the codec raises one of its errors
(:class:`msgcodec.CodecError`), these raise the broker's class of the same code
(:data:`broker.state.errors.CODEC_ERRORS`), so that every error the broker raises is a
:class:`~broker.state.errors.BrokerError` (the apply path skips a record that breaks a rule on every
member alike, the gRPC layer maps codes in one place). Nothing else is added: a call costs one
Python frame more than the codec's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import msgcodec
from broker.state.errors import CODEC_ERRORS, BrokerError
from msgcodec import (
    BATCH_HEADER_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE_BYTES,
    MAX_TOPIC_LENGTH,
    MESSAGE_HEAD,
    Buffer,
    DispatchInfo,
    DispatchRow,
    Message,
    MessageFields,
    is_batch,
    message_from_fields,
    tags_hash,
)

__all__ = [
    "BATCH_HEADER_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "MAX_TOPIC_LENGTH",
    "MESSAGE_HEAD",
    "DispatchInfo",
    "DispatchRow",
    "Message",
    "MessageFields",
    "UniqIdGenerator",
    "batch_count",
    "broker_error",
    "check_message",
    "decode_batch",
    "decode_message",
    "decode_offset_msg_id",
    "encode_batch",
    "encode_batch_fields",
    "encode_message",
    "encode_offset_msg_id",
    "is_batch",
    "message_from_fields",
    "parse_uniq_id",
    "read_dispatch",
    "scan_dispatch",
    "tags_hash",
    "uniq_id_to_bytes",
    "validate_topic",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def broker_error(exc: msgcodec.CodecError) -> BrokerError:
    """The broker's error for a codec error: same class name, code and detail."""
    cls = CODEC_ERRORS[type(exc)]
    if isinstance(exc, msgcodec.CorruptMessageError):
        return cls(exc.reason, exc.offset)
    return cls(*exc.args)


def _raising_broker_errors(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` of the codec, raising :func:`broker_error` of what it raises."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except msgcodec.CodecError as exc:
            raise broker_error(exc) from None

    return call


validate_topic = _raising_broker_errors(msgcodec.validate_topic)
uniq_id_to_bytes = _raising_broker_errors(msgcodec.uniq_id_to_bytes)
encode_message = _raising_broker_errors(msgcodec.encode_message)
encode_batch = _raising_broker_errors(msgcodec.encode_batch)
encode_batch_fields = _raising_broker_errors(msgcodec.encode_batch_fields)
decode_batch = _raising_broker_errors(msgcodec.decode_batch)
read_dispatch = _raising_broker_errors(msgcodec.read_dispatch)
batch_count = _raising_broker_errors(msgcodec.batch_count)
scan_dispatch = _raising_broker_errors(msgcodec.scan_dispatch)
encode_offset_msg_id = _raising_broker_errors(msgcodec.encode_offset_msg_id)
decode_offset_msg_id = _raising_broker_errors(msgcodec.decode_offset_msg_id)
parse_uniq_id = _raising_broker_errors(msgcodec.parse_uniq_id)


# The two called once per message read (raw pulls, lookups): written out, without the
# generic wrapper's argument packing.


def check_message(raw: Buffer, position: int = 0) -> None:
    """:func:`msgcodec.check_message`."""
    try:
        msgcodec.check_message(raw, position)
    except msgcodec.CodecError as exc:
        raise broker_error(exc) from None


def decode_message(buf: Buffer, offset: int = 0, *, verify_crc: bool = True) -> Message:
    """:func:`msgcodec.decode_message`."""
    try:
        return msgcodec.decode_message(buf, offset, verify_crc=verify_crc)
    except msgcodec.CodecError as exc:
        raise broker_error(exc) from None


class UniqIdGenerator(msgcodec.UniqIdGenerator):
    """:class:`msgcodec.UniqIdGenerator`; a bad ``ip`` raises the broker's
    :class:`~broker.state.errors.InvalidMessageIdError`."""

    __init__ = _raising_broker_errors(msgcodec.UniqIdGenerator.__init__)
