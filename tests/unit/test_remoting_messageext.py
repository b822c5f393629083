"""RocketMQ's MessageExt layout as the broker's remoting front end writes it, against a vector
built by hand from the published layout (the field order of RocketMQ's ``MessageDecoder`` and of
ali-ons's ``lib/message/message_decoder.js``)."""

from __future__ import annotations

import zlib

import pytest

from broker.frontends.remoting.messageext import (
    MAX_PROPERTIES_BYTES,
    MessageExtError,
    decode_properties,
    encode_message_ext,
    encode_properties,
    host_bytes,
    offset_msg_id,
)
from msgcodec import Message

UNIQ = "7F000001300C18B4AAC2000000000001"


def _msg(**kw: object) -> Message:
    fields: dict[str, object] = {
        "topic": "T",
        "queue_id": 2,
        "body": b"hi",
        "tags": "A",
        "keys": ("k1", "k2"),
        "properties": {},
        "born_host": "10.0.0.1:4242",
        "born_timestamp_ms": 0x0102030405,
        "store_timestamp_ms": 0x0A0B0C0D0E,
        "producer_group": "G",
        "uniq_id": UNIQ,
        "reconsume_times": 3,
        "flag": 7,
        "sys_flag": 0x30 | 0x2,  # the v6 host bits are cleared on the wire
    }
    fields.update(kw)
    return Message(**fields)  # type: ignore[arg-type]


def test_the_layout_byte_by_byte() -> None:
    store = host_bytes("192.168.1.9:9876")
    raw = encode_message_ext(_msg(), queue_offset=5, position=0x1122334455, store_host=store)
    props = f"TAGS\x01A\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01{UNIQ}\x02".encode()
    crc = zlib.crc32(b"hi")
    expected = b"".join(
        [
            bytes.fromhex("DAA320A7"),
            crc.to_bytes(4, "big"),
            bytes.fromhex("00000002"),  # queue id
            bytes.fromhex("00000007"),  # flag
            bytes.fromhex("0000000000000005"),  # queue offset
            bytes.fromhex("0000001122334455"),  # physical offset
            bytes.fromhex("00000002"),  # sys flag without 0x30
            bytes.fromhex("0000000102030405"),  # born timestamp
            bytes([10, 0, 0, 1]) + (4242).to_bytes(4, "big"),  # born host
            bytes.fromhex("0000000A0B0C0D0E"),  # store timestamp
            bytes([192, 168, 1, 9]) + (9876).to_bytes(4, "big"),  # store host
            bytes.fromhex("00000003"),  # reconsume times
            bytes(8),  # prepared transaction offset
            bytes.fromhex("00000002") + b"hi",  # body
            b"\x01T",  # topic
            len(props).to_bytes(2, "big") + props,
        ]
    )
    assert raw[4:] == expected
    assert int.from_bytes(raw[:4], "big") == len(raw) == 4 + len(expected)


def test_a_crc_with_the_high_bit_is_written_as_java_signs_it() -> None:
    assert any(zlib.crc32(c) >= 1 << 31 for c in (b"a", b"b", b"c"))
    for candidate in (b"a", b"b", b"c", b"hello", b"xyz", b"raftmq"):
        raw = encode_message_ext(_msg(body=candidate), 0, 0, host_bytes("1.2.3.4:5"))
        assert raw[8:12] == zlib.crc32(candidate).to_bytes(4, "big")


def test_the_offset_msg_id_is_store_host_and_position() -> None:
    store = host_bytes("127.0.0.1:10911")
    assert offset_msg_id(store, 0x2A) == "7F00000100002A9F000000000000002A"


@pytest.mark.parametrize("host", ["", "example.com:80", "::1", "[::1]:80", "1.2.3.4:70000"])
def test_a_host_that_is_not_ipv4_is_zero(host: str) -> None:
    assert host_bytes(host) == bytes(8)


def test_an_address_without_port_has_port_zero() -> None:
    assert host_bytes("1.2.3.4") == bytes([1, 2, 3, 4, 0, 0, 0, 0])


def test_properties_round_trip_and_skip_items_without_a_name() -> None:
    props = {"a": "1", "b": ""}
    text = encode_properties(props)
    assert text == "a\x011\x02b\x01\x02"
    assert decode_properties(text) == props
    assert decode_properties("noseparator\x02\x01x\x02c\x01d") == {"c": "d"}


def test_properties_too_large_for_the_layout_are_refused() -> None:
    msg = _msg(properties={"p": "v" * MAX_PROPERTIES_BYTES})
    with pytest.raises(MessageExtError, match="more than 32767"):
        encode_message_ext(msg, 0, 0, host_bytes("1.2.3.4:5"))
