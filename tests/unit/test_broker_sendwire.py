"""The v1 port's SendMessage parser against the protobuf runtime's (broker.frontends.v1.sendwire).

For every encoding the runtime accepts the hand parser must give the same send (topic and each
message's fields, as ``outgoing_of`` reads them from the runtime's message), its bodies views
into the request's bytes; what the runtime refuses it must refuse."""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.leaderops import SendRequest
from broker.components.sending import OutgoingMessage
from broker.frontends.internal.codec import call_pb, outgoing_of
from broker.frontends.v1.sendwire import (
    DEPTH_LIMIT,
    IN_PLACE_MIN_MESSAGE_BYTES,
    SendWire,
    WireFormatError,
    parse_send_request,
)
from broker.frontends.v1.service import BrokerServicer
from msgcodec import message_from_fields


def _runtime(data: bytes) -> tuple[str, list[OutgoingMessage]] | None:
    try:
        r = pb.SendMessageRequest.FromString(data)
    except Exception:
        return None
    return r.topic, [outgoing_of(m) for m in r.messages]


def _ours(data: bytes, in_place_min_bytes: int = 0) -> tuple[str, list[OutgoingMessage]] | None:
    """The hand parser's answer (every message read by hand unless told otherwise)."""
    try:
        w = parse_send_request(data, in_place_min_bytes)
    except WireFormatError:
        return None
    if in_place_min_bytes == 0:
        for m in w.messages:
            assert isinstance(m.body, memoryview)
            assert m.body.obj is data  # a view into the request, not a copy
    return w.topic, [m._replace(body=bytes(m.body)) for m in w.messages]


def _same(data: bytes) -> bool:
    """Both parsers agree on ``data`` (by hand, and as the port chooses); True when valid."""
    expected = _runtime(data)
    assert _ours(data) == expected, data
    assert _ours(data, IN_PLACE_MIN_MESSAGE_BYTES) == expected, data
    return expected is not None


# ------------------------------------------------------------------ a hand encoder for tests


def _varint(n: int, extra: int = 0) -> bytes:
    """``n`` as a varint, padded with up to ``extra`` continuation bytes (valid, not minimal:
    ten bytes at most)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    for _ in range(min(extra, 10 - len(out))):
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


text = st.text(max_size=12)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def unknown_field(draw: Any) -> bytes:
    """A field the schema does not have (or a known number with another wire type)."""
    number = draw(st.one_of(st.integers(18, 2**29 - 1), st.integers(1, 17)))
    # A known number as length-delimited could be a string field (UTF-8 checked): not here.
    wire = draw(st.sampled_from([0, 1, 2, 3, 5] if number > 17 else [0, 1, 3, 5]))
    if wire == 0:
        return _key(number, 0) + _varint(draw(st.integers(0, 2**64 - 1)))
    if wire == 1:
        return _key(number, 1) + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return _key(number, 5) + draw(st.binary(min_size=4, max_size=4))
    if wire == 2:
        return _len_field(number, draw(st.binary(max_size=8)))
    inner = _key(1, 0) + _varint(draw(st.integers(0, 300)))
    return _key(number, 3) + inner + _key(number, 4)


@st.composite
def message_fields(draw: Any) -> list[bytes]:
    """A ``Message``'s fields, each encoded on its own (any may repeat or be missing)."""
    pad = st.integers(0, 3)
    choices = [
        lambda: _len_field(1, draw(text).encode()),
        lambda: _key(2, 0) + _varint(draw(i32), draw(pad)),
        lambda: _len_field(3, draw(text).encode()),
        lambda: _len_field(4, draw(text).encode()),
        lambda: _len_field(
            5,
            b"".join(
                draw(
                    st.lists(
                        st.sampled_from(
                            [
                                _len_field(1, draw(text).encode()),
                                _len_field(2, draw(text).encode()),
                                _key(3, 0) + b"\x01",
                            ]
                        ),
                        max_size=3,
                    )
                )
            ),
        ),
        lambda: _len_field(6, draw(st.binary(max_size=64))),
        lambda: _len_field(7, draw(text).encode()),
        lambda: _key(8, 0) + _varint(draw(i64), draw(pad)),
        lambda: _key(9, 0) + _varint(draw(i64)),
        lambda: _len_field(10, draw(text).encode()),
        lambda: _len_field(11, draw(text).encode()),
        lambda: _len_field(12, draw(text).encode()),
        lambda: _key(13, 0) + _varint(draw(i64)),
        lambda: _key(14, 0) + _varint(draw(i64)),
        lambda: _key(15, 0) + _varint(draw(i32)),
        lambda: _key(16, 0) + _varint(draw(st.integers(0, 2**64 - 1))),
        lambda: _key(17, 0) + _varint(draw(i32)),
        lambda: draw(unknown_field()),
    ]
    picks = draw(st.lists(st.integers(0, len(choices) - 1), max_size=12))
    return [choices[i]() for i in picks]


@st.composite
def request_bytes(draw: Any) -> bytes:
    """A valid ``SendMessageRequest`` encoding, fields in any order, some repeated."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["topic", "message", "unknown"]))
        if kind == "topic":
            parts.append(_len_field(1, draw(text).encode()))
        elif kind == "message":
            parts.append(_len_field(2, b"".join(draw(message_fields()))))
        else:
            parts.append(draw(unknown_field()))
    return b"".join(parts)


messages = st.builds(
    pb.Message,
    topic=text,
    queue_id=i32,
    tags=text,
    keys=st.lists(text, max_size=3),
    properties=st.dictionaries(text, text, max_size=3),
    body=st.binary(max_size=64),
    born_host=text,
    born_timestamp_ms=i64,
    store_timestamp_ms=i64,
    producer_group=text,
    msg_id=text,
    offset_msg_id=text,
    queue_offset=i64,
    commitlog_position=i64,
    reconsume_times=i32,
    flag=i32,
    sys_flag=i32,
)


# ------------------------------------------------------------------ properties


@settings(max_examples=300, deadline=None)
@given(topic=text, msgs=st.lists(messages, max_size=4))
def test_the_runtimes_own_encoding_parses_the_same(topic: str, msgs: list[pb.Message]) -> None:
    data = pb.SendMessageRequest(topic=topic, messages=msgs).SerializeToString()
    assert _same(data)


@settings(max_examples=500, deadline=None)
@given(data=request_bytes())
def test_every_valid_encoding_parses_the_same(data: bytes) -> None:
    """Fields in any order, repeated, non-minimal varints, unknown fields of every wire type,
    known numbers with other wire types, map entries with missing or extra fields."""
    assert _same(data)


@settings(max_examples=1000, deadline=None)
@given(
    data=request_bytes(),
    edits=st.lists(
        st.tuples(st.integers(0, 2**16), st.integers(0, 255), st.booleans()), max_size=4
    ),
    cut=st.integers(0, 2**16),
)
def test_mutated_encodings_are_refused_where_the_runtime_refuses_them(
    data: bytes, edits: list[tuple[int, int, bool]], cut: int
) -> None:
    buf = bytearray(data)
    for at, value, insert in edits:
        at = at % (len(buf) + 1)
        if insert or at == len(buf):
            buf.insert(at, value)
        else:
            buf[at] = value
    if cut < len(buf):
        del buf[cut:]
    _same(bytes(buf))


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=40))
def test_random_bytes_are_judged_as_the_runtime_judges_them(junk: bytes) -> None:
    _same(junk)


@pytest.mark.parametrize(
    "data",
    [
        b"\x0c",  # an end-group without its start
        b"\x1b\x08\x01\x24",  # a group ended by another field's end
        b"\x1b\x08\x01",  # a group never ended
        b"\x00\x01",  # field number 0
        b"\x0e",  # wire type 6
        b"\x0f",  # wire type 7
        b"\x8a\x80\x80\x80\x80\x00\x01a",  # a six-byte tag
        b"\x8a\x80\x80\x80\x00\x01a",  # a five-byte tag (valid)
        b"\xfa\xff\xff\xff\x1f\x00",  # the largest field number (valid)
        b"\xfa\xff\xff\xff\x3f\x00",  # a tag above 32 bits
        b"\x0a\x01\xff",  # a topic that is not UTF-8
        b"\x0a\x03\xed\xa0\x80",  # a UTF-16 surrogate in UTF-8 form
        b"\x0a\x02\xc0\x80",  # an overlong UTF-8 sequence
        b"\x22\x01\xff",  # not UTF-8 in an unknown field (valid)
        b"\x12\x0b\x10" + b"\xff" * 9 + b"\x7f",  # a ten-byte varint (valid)
        b"\x12\x0c\x10" + b"\xff" * 10 + b"\x01",  # an eleven-byte varint
        b"\x12\x06\x10\x80\x80\x80\x80\x10",  # an int32 above 32 bits (truncated)
        b"\x0a\x05ab",  # a length past the end
        b"\x0a\xff\xff\xff\xff\x0f",  # a length of 4 GiB
        b"\x12\x04\x2a\x02\x12\x00",  # a map entry without its key
        b"\x12\x05\x2a\x03\x12\x01\xff",  # a map value that is not UTF-8
        b"\x12\x03\x62\x01\xff",  # offset_msg_id (dropped) not UTF-8
        b"\x1d\x00\x00",  # a fixed32 cut short
        b"\x19\x00\x00\x00\x00\x00\x00\x00",  # a fixed64 cut short
        b"\x12\x02\x30\x01",  # the body as a varint: an unknown field
        b"\x12\x02\x32\x00",  # an empty body
    ],
)
def test_edge_cases(data: bytes) -> None:
    _same(data)


def _groups(n: int) -> bytes:
    return b"\x1b" * n + b"\x1c" * n  # n groups of field 3 nested


@pytest.mark.parametrize("n", [DEPTH_LIMIT - 2, DEPTH_LIMIT - 1, DEPTH_LIMIT, DEPTH_LIMIT + 1])
def test_nesting_is_limited_where_the_runtime_limits_it(n: int) -> None:
    """Groups at the top, in a message and in a map entry count against the same limit."""
    top = _groups(n)
    in_message = _len_field(2, _groups(n))
    in_entry = _len_field(2, _len_field(5, _groups(n)))
    valid = [_same(top), _same(in_message), _same(in_entry)]
    assert valid == [n <= DEPTH_LIMIT, n <= DEPTH_LIMIT - 1, n <= DEPTH_LIMIT - 2]


def test_a_large_message_makes_every_body_a_view_of_the_request() -> None:
    body = bytes(range(256)) * (IN_PLACE_MIN_MESSAGE_BYTES // 256)
    data = pb.SendMessageRequest(
        topic="T", messages=[pb.Message(body=body, queue_id=3), pb.Message(body=b"x")]
    ).SerializeToString()
    w = parse_send_request(data)
    assert w.topic == "T"
    first, second = (m.body for m in w.messages)
    assert isinstance(first, memoryview) and first.obj is data and first == body
    assert isinstance(second, memoryview) and second.obj is data and bytes(second) == b"x"
    assert w.messages[0].queue_id == 3


def test_small_messages_are_parsed_by_the_runtime() -> None:
    """Below IN_PLACE_MIN_MESSAGE_BYTES the runtime's C parser costs less than the copies."""
    body = b"y" * (IN_PLACE_MIN_MESSAGE_BYTES - 64)
    data = pb.SendMessageRequest(topic="T", messages=[pb.Message(body=body)]).SerializeToString()
    (m,) = parse_send_request(data).messages
    assert isinstance(m.body, bytes) and m.body == body


# The Python functions parse_send_request may run for a request of small messages: the
# request (parse_send_request, _by_runtime, the generator over its messages and SendWire's
# __init__) and each message (outgoing_of, OutgoingMessage's __new__, the generator's step).
# Issue 36 (docs/PERFORMANCE.md "ASYNC_FLUSH at 256 in flight"): a scan of the request's
# fields in Python before the runtime's parser, and a frozen dataclass and the Mapping ABC
# per message, made it 23 calls for one message with two properties and 121 for eight (now 7
# and 35), and 905 for a producer's batch of 64 (a request past IN_PLACE_MIN_MESSAGE_BYTES;
# now 260): ~3.3 us of a leader's CPU per message at 256 in flight.
SMALL_REQUEST_CALLS = 4
SMALL_MESSAGE_CALLS = 4


def _python_calls(fn: Any, *args: Any) -> int:
    """How many Python functions ``fn(*args)`` ran (C functions not counted)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    # A collection during the call runs other objects' finalizers and weakref callbacks in
    # it (a CI run counted 262 against 260): collected first, and not during the count.
    gc.collect()
    gc.disable()
    sys.setprofile(count)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls - 1  # fn itself is the request's first


@pytest.mark.parametrize("n", [1, 8, 64])  # 64 KiB: more than IN_PLACE_MIN_MESSAGE_BYTES
@pytest.mark.parametrize("props", [{}, {"a": "b", "KEYS": "k1"}])
def test_a_small_send_costs_a_bounded_number_of_python_calls(n: int, props: dict[str, str]) -> None:
    """A send's steps per message on the leader (the v1 port parses every SendMessage here):
    a count that must not grow. The runtime parses small requests without a scan in Python."""
    msgs = [
        pb.Message(body=b"x" * 1024, born_host="127.0.0.1", msg_id="A" * 32, properties=props)
        for _ in range(n)
    ]
    data = pb.SendMessageRequest(topic="T", messages=msgs).SerializeToString()
    calls = _python_calls(parse_send_request, data)
    assert calls <= SMALL_REQUEST_CALLS + SMALL_MESSAGE_CALLS * n, calls
    assert [m.properties for m in parse_send_request(data).messages] == [props] * n


def test_a_batch_of_small_messages_is_parsed_by_the_runtime_and_checked_whole() -> None:
    """A request past IN_PLACE_MIN_MESSAGE_BYTES made of small messages goes to the runtime
    after the quick look at its lengths; cut short anywhere, or with another field among
    them, it is still refused or parsed exactly as the runtime does."""
    msgs = [pb.Message(body=bytes([i]) * 1024, queue_id=i) for i in range(32)]
    data = pb.SendMessageRequest(topic="T", messages=msgs).SerializeToString()
    assert len(data) > IN_PLACE_MIN_MESSAGE_BYTES
    w = parse_send_request(data)
    assert [(m.queue_id, m.body) for m in w.messages] == [(i, bytes([i]) * 1024) for i in range(32)]
    assert all(isinstance(m.body, bytes) for m in w.messages)
    for cut in (1, 2, 500, 1030):
        assert _ours(data[:-cut], IN_PLACE_MIN_MESSAGE_BYTES) is None
    for extra in (b"\x18\x01", b"\x12\x80", b"\x12\x80\x80\x01"):
        assert _same(data + extra) is (extra == b"\x18\x01")


def test_only_bytes_are_parsed() -> None:
    with pytest.raises(TypeError):
        parse_send_request(bytearray(b"\x0a\x00"))  # type: ignore[arg-type]


def test_a_viewed_body_is_forwarded_and_stored_carefully_as_bytes() -> None:
    """A follower forwards a send to the leader (``internal.v1``, protobuf: bytes only), and
    delayed or transactional sends build a ``Message`` (bytes): both copy a viewed body."""
    body = b"q" * IN_PLACE_MIN_MESSAGE_BYTES
    data = pb.SendMessageRequest(topic="T", messages=[pb.Message(body=body)]).SerializeToString()
    sent = parse_send_request(data).messages
    assert isinstance(sent[0].body, memoryview)
    call = call_pb(SendRequest("T", sent))
    assert call.send.messages[0].body == body
    stored = message_from_fields("T", sent[0], 1)
    assert isinstance(stored.body, bytes) and stored.body == body


class _Recording(BrokerServicer):
    """The v1 servicer with a SendMessage that records what the port handed it."""

    seen: list[object]

    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.seen.append(request)
        return pb.SendMessageResponse()


def test_the_port_hands_send_message_the_parsed_request() -> None:
    """Registered as the broker registers it: a large request arrives parsed in place, a small
    one parsed by the runtime, both as a SendWire; junk is refused as before."""
    servicer = object.__new__(_Recording)  # register() needs nothing else
    servicer.seen = []
    body = b"v" * IN_PLACE_MIN_MESSAGE_BYTES
    big = pb.SendMessageRequest(topic="T", messages=[pb.Message(body=body)])
    small = pb.SendMessageRequest(topic="T", messages=[pb.Message(body=b"s")])

    async def run() -> None:
        server = grpc.aio.server()
        servicer.register(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                send = ch.unary_unary("/raftmq.broker.v1.Broker/SendMessage")
                await send(big.SerializeToString())
                await send(small.SerializeToString())
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await send(b"\x0a\x05ab")  # a length past the end
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert err.value.details() == (
                    "BAD_REQUEST undecodable raftmq.broker.v1.SendMessageRequest"
                )
        finally:
            await server.stop(None)

    asyncio.run(asyncio.wait_for(run(), 30))
    first, second = servicer.seen
    assert isinstance(first, SendWire) and isinstance(second, SendWire)
    assert isinstance(first.messages[0].body, memoryview) and first.messages[0].body == body
    assert second.messages[0].body == b"s"
