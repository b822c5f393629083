"""RocketMQ remoting frames (remoting/protocol.py): both serialize types round trip, every limit
is refused with a clear FrameError, partial frames wait, and junk never raises anything else."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import protocol as P
from remoting.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    FrameError,
    RemotingCommand,
    encode_frame,
)


def _frame(header: bytes, body: bytes = b"", serialize_type: int = SERIALIZE_JSON) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + (
        header + body
    )


def _json_frame(header: object, body: bytes = b"") -> bytes:
    return _frame(json.dumps(header).encode(), body)


def _decode_one(data: bytes) -> RemotingCommand:
    commands = FrameDecoder().feed(data)
    assert len(commands) == 1
    return commands[0]


_text = st.text(max_size=40)
_fields = st.dictionaries(st.text(min_size=1, max_size=20), _text, max_size=8)


@st.composite
def commands(draw: st.DrawFn) -> RemotingCommand:
    serialize_type = draw(st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))
    small = serialize_type == SERIALIZE_ROCKETMQ
    low, high = (P.INT16_MIN, P.INT16_MAX) if small else (P.INT32_MIN, P.INT32_MAX)
    return RemotingCommand(
        code=draw(st.integers(low, high)),
        opaque=draw(st.integers(P.INT32_MIN, P.INT32_MAX)),
        flag=draw(st.integers(P.INT32_MIN, P.INT32_MAX)),
        remark=draw(st.none() | _text),
        ext_fields=draw(_fields),
        body=draw(st.binary(max_size=200)),
        language=draw(st.sampled_from(sorted(P.LANGUAGE_CODES))),
        version=draw(st.integers(low, high)),
        serialize_type=serialize_type,
    )


@settings(max_examples=200, deadline=None)
@given(commands())
def test_both_serialize_types_round_trip(cmd: RemotingCommand) -> None:
    back = _decode_one(encode_frame(cmd))
    # An empty remark is "none" in the ROCKETMQ header (length 0).
    if cmd.serialize_type == SERIALIZE_ROCKETMQ and cmd.remark == "":
        assert back.remark is None
        back = RemotingCommand(**{**_as_dict(back), "remark": ""})
    assert back == cmd


def _as_dict(cmd: RemotingCommand) -> dict[str, object]:
    return {name: getattr(cmd, name) for name in RemotingCommand.__dataclass_fields__}


@settings(max_examples=100, deadline=None)
@given(st.lists(commands(), min_size=1, max_size=4), st.integers(1, 7))
def test_a_stream_fed_in_pieces_gives_every_command_once(
    cmds: list[RemotingCommand], step: int
) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for at in range(0, len(stream), step):
        out += decoder.feed(stream[at : at + step])
    assert [c.opaque for c in out] == [c.opaque for c in cmds]
    assert [c.body for c in out] == [c.body for c in cmds]
    assert decoder.buffered_bytes == 0


def test_a_frame_fed_byte_by_byte_completes_at_its_last_byte() -> None:
    frame = encode_frame(RemotingCommand(code=105, opaque=7, ext_fields={"topic": "t"}))
    decoder = FrameDecoder()
    for byte in frame[:-1]:
        assert decoder.feed(bytes([byte])) == []
    (cmd,) = decoder.feed(frame[-1:])
    assert (cmd.code, cmd.opaque, dict(cmd.ext_fields)) == (105, 7, {"topic": "t"})


def test_the_node_client_header_is_read_as_rocketmq_reads_it() -> None:
    """ali-ons sends numbers and booleans in extFields, no serializeTypeCurrentRPC, and a
    header length with a zero type byte."""
    header = {
        "code": 310,
        "language": "JAVA",
        "opaque": 3,
        "flag": 0,
        "version": 121,
        "extFields": {"a": "t", "b": 4, "e": 0, "z": False, "n": None},
    }
    cmd = _decode_one(_json_frame(header, b"body"))
    assert dict(cmd.ext_fields) == {"a": "t", "b": "4", "e": "0", "z": "false"}
    assert (cmd.code, cmd.language, cmd.version, cmd.body) == (310, "JAVA", 121, b"body")
    assert not cmd.is_response and not cmd.is_oneway


def test_response_keeps_the_opaque_and_serialize_type() -> None:
    request = RemotingCommand(
        code=105, opaque=99, flag=FLAG_ONEWAY, serialize_type=SERIALIZE_ROCKETMQ
    )
    answer = request.response(17, "no topic", {"k": "v"}, b"x")
    assert (answer.opaque, answer.serialize_type, answer.flag) == (99, 1, FLAG_RESPONSE)
    assert answer.is_response and not answer.is_oneway
    assert (answer.code, answer.remark, dict(answer.ext_fields), answer.body) == (
        17,
        "no topic",
        {"k": "v"},
        b"x",
    )


def test_ext_fields_are_read_only() -> None:
    fields = {"a": "1"}
    cmd = RemotingCommand(code=1, opaque=1, ext_fields=fields)
    fields["b"] = "2"
    assert dict(cmd.ext_fields) == {"a": "1"}
    with pytest.raises(TypeError):
        cmd.ext_fields["c"] = "3"  # type: ignore[index]


# ------------------------------------------------------------------------------ refusals


def _refused(data: bytes, match: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match=match):
        decoder.feed(data)
    with pytest.raises(FrameError, match=match):  # poisoned: the stream cannot resync
        decoder.feed(encode_frame(RemotingCommand(code=1, opaque=1)))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (struct.pack(">i", P.MAX_FRAME_BYTES), "over 16777216"),
        (struct.pack(">i", -1), "under the 4"),
        (struct.pack(">i", 3), "under the 4"),
        (struct.pack(">iI", 10, (2 << 24) | 2), "serialize type 2"),
        (struct.pack(">iI", 10, 7), "does not fit"),
        (struct.pack(">iI", P.MAX_HEADER_BYTES + 100, P.MAX_HEADER_BYTES + 1), "header of"),
    ],
)
def test_bad_frame_fields_are_refused_at_once(data: bytes, match: str) -> None:
    _refused(data, match)


def test_an_oversized_length_is_refused_before_the_frame_arrives() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="over"):
        decoder.feed(struct.pack(">i", 1 << 30))
    assert decoder.buffered_bytes == 0


_OK = {"code": 1, "opaque": 1, "flag": 0, "language": "JAVA", "version": 1}


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ([1, 2], "not an object"),
        ({"opaque": 1}, "no 'code'"),
        ({**_OK, "code": True}, "'code' is bool"),
        ({**_OK, "code": 1.5}, "'code' is float"),
        ({**_OK, "code": "1"}, "'code' is str"),
        ({**_OK, "code": 1 << 31}, "'code'.*outside"),
        ({**_OK, "opaque": 1 << 40}, "'opaque'.*outside"),
        ({**_OK, "flag": None}, "'flag' is NoneType"),
        ({**_OK, "version": False}, "'version' is bool"),
        ({**_OK, "remark": 5}, "'remark' is int"),
        ({**_OK, "remark": "x" * (P.MAX_REMARK_BYTES + 1)}, "remark is over"),
        ({**_OK, "language": 0}, "'language' is int"),
        ({**_OK, "language": "L" * 17}, "language must be"),
        ({**_OK, "extFields": []}, "'extFields' is list"),
        ({**_OK, "extFields": {"a": 1.5}}, "is float"),
        ({**_OK, "extFields": {"a": {"b": "c"}}}, "is dict"),
        ({**_OK, "extFields": {"a": 1 << 64}}, "int64"),
        ({**_OK, "extFields": {"": "v"}}, "key is empty"),
        ({**_OK, "extFields": {"k" * (P.MAX_EXT_KEY_BYTES + 1): "v"}}, "key.*over 128"),
        ({**_OK, "extFields": {"k": "v" * (P.MAX_EXT_VALUE_BYTES + 1)}}, "value.*over"),
        ({**_OK, "extFields": {f"k{i}": "v" for i in range(P.MAX_EXT_FIELDS + 1)}}, "65 ext"),
        ({**_OK, "extFields": {"k": "\ud800"}}, "lone surrogate"),
        ({**_OK, "serializeTypeCurrentRPC": "XML"}, "serializeTypeCurrentRPC"),
    ],
)
def test_bad_json_headers_are_refused(header: object, match: str) -> None:
    _refused(_json_frame(header), match)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\xff\xfe", "not valid JSON"),
        (b'{"code": 1, "code": 2}', "repeats the key 'code'"),
        (b'{"code": NaN}', "NaN"),
        (b'{"code": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
        (b'{"code": 1' + b"1" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_malformed_json_is_refused(raw: bytes, match: str) -> None:
    if len(raw) > P.MAX_HEADER_BYTES:
        raw = raw[: P.MAX_HEADER_BYTES]
    _refused(_frame(raw), match)


def _binary(
    fixed: bytes = struct.pack(">hbhii", 10, 0, 1, 5, 0),
    remark: bytes = struct.pack(">i", 0),
    fields: bytes = struct.pack(">i", 0),
) -> bytes:
    return _frame(fixed + remark + fields, serialize_type=SERIALIZE_ROCKETMQ)


def _field(key: bytes, value: bytes) -> bytes:
    return struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value


def _table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_frame(b"\x00" * 5, serialize_type=SERIALIZE_ROCKETMQ), "ends inside the fields"),
        (_binary(fixed=struct.pack(">hbhii", 10, 99, 1, 5, 0)), "language code 99"),
        (_binary(remark=struct.pack(">i", -1)), "remark of -1"),
        (_binary(remark=struct.pack(">i", P.MAX_REMARK_BYTES + 1)), "remark of"),
        (_binary(remark=struct.pack(">i", 10) + b"abc"), "ends inside remark|extFields"),
        (_binary(remark=struct.pack(">i", 2) + b"\xff\xff"), "remark is not UTF-8"),
        (_binary(fields=struct.pack(">i", 100)), "exceeds the header"),
        (_binary(fields=struct.pack(">i", -4)), "exceeds the header"),
        (_binary(fields=struct.pack(">i", 7) + _field(b"k", b"v")), "ends inside a value"),
        (_binary(fields=_table(_field(b"k", b"v"), _field(b"k", b"w"))), "repeat the key"),
        (_binary(fields=_table(_field(b"", b"v"))), "key is empty"),
        (_binary(fields=_table(struct.pack(">h", -2))), "key of -2"),
        (_binary(fields=_table(_field(b"k" * 129, b"v"))), "key of 129"),
        (_binary(fields=_table(struct.pack(">h", 1) + b"k" + struct.pack(">i", 9))), "ends"),
        (_binary(fields=_table(_field(b"k", b"\xc3"))), "value is not UTF-8"),
        (
            _binary(fields=_table(*(_field(b"k%d" % i, b"") for i in range(65)))),
            "more than 64",
        ),
        (_binary(fields=struct.pack(">i", 0) + b"x"), "1 bytes after its fields"),
    ],
)
def test_bad_rocketmq_headers_are_refused(data: bytes, match: str) -> None:
    _refused(data, match)


@pytest.mark.parametrize(
    ("cmd", "match"),
    [
        (RemotingCommand(code=1 << 20, opaque=1, serialize_type=SERIALIZE_ROCKETMQ), "code"),
        (RemotingCommand(code=1, opaque=1, version=1 << 16, serialize_type=1), "version"),
        (RemotingCommand(code=1, opaque=1, language="NODE", serialize_type=1), "no ROCKETMQ"),
        (RemotingCommand(code=1, opaque=1 << 31), "opaque"),
        (RemotingCommand(code=1, opaque=1, serialize_type=2), "serialize type 2"),
        (RemotingCommand(code=1, opaque=1, body=b"x" * P.MAX_FRAME_BYTES), "frame of"),
        (RemotingCommand(code=1, opaque=1, ext_fields={"k": 1}), "must be strings"),  # type: ignore[dict-item]
    ],
)
def test_encoding_refuses_what_decoding_would(cmd: RemotingCommand, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        encode_frame(cmd)


def test_a_node_language_name_is_kept_in_json() -> None:
    cmd = RemotingCommand(code=1, opaque=1, language="NODE")
    assert _decode_one(encode_frame(cmd)).language == "NODE"


# ---------------------------------------------------------------------------------- fuzz


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([None, SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))
def test_random_bytes_raise_nothing_but_frame_error(data: bytes, framed: int | None) -> None:
    """Raw junk, and junk headers inside well-formed frames of either serialize type."""
    decoder = FrameDecoder()
    with contextlib.suppress(FrameError):
        decoder.feed(data if framed is None else _frame(data, serialize_type=framed))


@settings(max_examples=500, deadline=None)
@given(commands(), st.data())
def test_mutated_frames_raise_nothing_but_frame_error(
    cmd: RemotingCommand, data: st.DataObject
) -> None:
    frame = bytearray(encode_frame(cmd))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    with contextlib.suppress(FrameError):
        FrameDecoder().feed(bytes(frame))
