"""broker/state/message.py: the broker's names for the codec (msgcodec), raising the broker's
errors.

The codec itself is tested in test_msgcodec.py; here, that every codec error reaches broker
code as a BrokerError of the same code (the apply path skips a bad record only on a
BrokerError, the gRPC layer maps codes), and that nothing else changes on the way.
"""

from __future__ import annotations

import inspect

import pytest

import msgcodec
from broker.state import errors
from broker.state import message as bm
from broker.state.errors import BrokerError

GOOD = msgcodec.Message(topic="T", queue_id=0, body=b"x", uniq_id="A" * 32)


def test_every_codec_error_has_a_broker_class_of_the_same_code() -> None:
    raised = {
        cls
        for cls in vars(msgcodec.errors).values()
        if inspect.isclass(cls) and issubclass(cls, msgcodec.CodecError)
    } - {msgcodec.CodecError}
    assert set(errors.CODEC_ERRORS) == raised
    for codec_cls, broker_cls in errors.CODEC_ERRORS.items():
        assert issubclass(broker_cls, BrokerError)
        assert issubclass(broker_cls, codec_cls)
        assert broker_cls.code == codec_cls.code
        assert broker_cls.__name__ == codec_cls.__name__
        assert getattr(errors, broker_cls.__name__) is broker_cls


def _broken_batch() -> bytes:
    body = bytearray(msgcodec.encode_batch([GOOD])[0])
    body[-1] ^= 1
    return bytes(body)


CALLS = [
    (lambda: bm.validate_topic("a b"), errors.InvalidTopicError),
    (lambda: bm.uniq_id_to_bytes("xyz"), errors.InvalidMessageIdError),
    (
        lambda: bm.encode_message(msgcodec.Message(topic="T", queue_id=0, body=b"")),
        errors.MessageBodyEmptyError,
    ),
    (lambda: bm.encode_batch([GOOD], 0), errors.MessageTooLargeError),
    (
        lambda: bm.encode_batch_fields("T", [], 0, lambda: "A" * 32),
        errors.InvalidMessageError,
    ),
    (lambda: bm.decode_message(msgcodec.encode_message(GOOD)[:-1]), errors.CorruptMessageError),
    (lambda: bm.decode_batch(_broken_batch()), errors.CorruptMessageError),
    (lambda: bm.check_message(b"\0" * 100, 7), errors.CorruptMessageError),
    (lambda: bm.read_dispatch(b"junk"), errors.CorruptMessageError),
    (lambda: bm.batch_count(b"junk"), errors.CorruptMessageError),
    (lambda: bm.scan_dispatch(b"RMBT" + b"\0" * 20), errors.CorruptMessageError),
    (lambda: bm.encode_offset_msg_id("::1", 1, 1), errors.InvalidMessageIdError),
    (lambda: bm.decode_offset_msg_id("G" * 32), errors.InvalidMessageIdError),
    (lambda: bm.parse_uniq_id("short"), errors.InvalidMessageIdError),
    (lambda: bm.UniqIdGenerator(ip="not an ip"), errors.InvalidMessageIdError),
]


@pytest.mark.parametrize(("call", "expected"), CALLS)
def test_codec_errors_reach_the_broker_as_broker_errors(
    call: object, expected: type[BrokerError]
) -> None:
    assert callable(call)
    with pytest.raises(BrokerError) as info:
        call()
    assert type(info.value) is expected
    assert isinstance(info.value, msgcodec.CodecError)


def test_corrupt_message_keeps_its_reason_and_offset() -> None:
    body, offsets = msgcodec.encode_batch([GOOD, GOOD])
    bad = bytearray(body)
    bad[offsets[1] + 3] = 1  # the second message's size (low byte): below the minimum
    with pytest.raises(msgcodec.CorruptMessageError) as codec_info:
        msgcodec.scan_dispatch(bytes(bad))
    with pytest.raises(errors.CorruptMessageError) as broker_info:
        bm.scan_dispatch(bytes(bad))
    assert (broker_info.value.reason, broker_info.value.offset) == (
        codec_info.value.reason,
        codec_info.value.offset,
    )
    assert str(broker_info.value) == str(codec_info.value)


def test_results_are_the_codecs() -> None:
    body, offsets = bm.encode_batch([GOOD])
    assert (body, offsets) == msgcodec.encode_batch([GOOD])
    assert bm.decode_message(body, offsets[0]) == GOOD
    assert bm.scan_dispatch(body) == msgcodec.scan_dispatch(body)
    assert bm.Message is msgcodec.Message and bm.MESSAGE_HEAD is msgcodec.MESSAGE_HEAD
    gen = bm.UniqIdGenerator(ip="10.0.0.1")
    assert isinstance(gen, msgcodec.UniqIdGenerator)
    assert msgcodec.parse_uniq_id(gen.next_id()).ip == "10.0.0.1"
