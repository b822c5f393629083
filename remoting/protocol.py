"""RemotingCommand frames: encoding, and a streaming decoder that refuses anything malformed.

A frame (docs/REMOTING.md, "Frames")::

    length L       int32 big-endian: the bytes after this field
    type|H         int32 big-endian: high byte the serialize type (0 JSON, 1 ROCKETMQ),
                   low 3 bytes the header's length H
    header         H bytes, in the serialize type
    body           L - 4 - H bytes

Every field is bounded by a named limit below; a frame over one, or a header that is not the
shape RocketMQ's clients send, raises :class:`FrameError` with one line saying what and where.
The decoder is then poisoned: a byte stream has no resynchronisation point, so the connection
it reads must be closed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

# Serialize types (the high byte of the second int32).
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
SERIALIZE_TYPES = (SERIALIZE_JSON, SERIALIZE_ROCKETMQ)
# The JSON header's name for each serialize type (RocketMQ writes serializeTypeCurrentRPC).
_SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}

# Bits of ``flag``: bit 0 marks a response, bit 1 a oneway request (no response is sent).
FLAG_RESPONSE = 1 << 0
FLAG_ONEWAY = 1 << 1

# RocketMQ's default frame limit (com.rocketmq.remoting.frameMaxLength, 16 MiB), counting the
# whole frame with its length field: a 4 MiB message (maxMessageSize) and its header fit, a
# client cannot make a connection buffer more than this.
MAX_FRAME_BYTES = 16 << 20
# The length field and the serialize type|header length field.
LENGTH_FIELD_BYTES = 4
TYPE_FIELD_BYTES = 4
# Headers carry the custom header fields, a send's message properties among them (RocketMQ
# bounds properties to 32 KiB; JSON escaping may grow them sixfold): 256 KiB holds the largest
# valid header and keeps a header far below the frame.
MAX_HEADER_BYTES = 256 << 10
# The most extFields entries: RocketMQ's largest custom header (a send) has about 15 fields,
# ACL adds 3 (AccessKey, Signature, SecurityToken), namespaces and traces a few more.
MAX_EXT_FIELDS = 64
# A field name: RocketMQ's are Java identifiers of at most 30 characters.
MAX_EXT_KEY_BYTES = 128
# A field value: the largest is a send's properties (32 KiB of UTF-8 at most in RocketMQ).
MAX_EXT_VALUE_BYTES = 64 << 10
# A remark is one line of error text.
MAX_REMARK_BYTES = 16 << 10
# A language name in a JSON header ("JAVA", "CPP", "NODE"...).
MAX_LANGUAGE_CHARS = 16
# ``code`` and ``version`` are int32 in a JSON header (RocketMQ 5's POP codes are 200050 and
# up) and int16 in a ROCKETMQ header: each serialize type refuses what it cannot carry.
INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
# A JSON client may send an extFields value as a number (the Node.js client does): RocketMQ's
# header fields are at most Java longs.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# The version a server's own commands carry: RocketMQ's servers send 0 unless the system
# property rocketmq.remoting.version is set, and clients ignore it in answers.
DEFAULT_VERSION = 0
# The language this package's commands name.
DEFAULT_LANGUAGE = "PYTHON"
# RocketMQ's LanguageCode table: the byte the ROCKETMQ header carries for each language.
LANGUAGE_CODES: Mapping[str, int] = MappingProxyType(
    {
        "JAVA": 0,
        "CPP": 1,
        "DOTNET": 2,
        "PYTHON": 3,
        "DELPHI": 4,
        "ERLANG": 5,
        "RUBY": 6,
        "OTHER": 7,
        "HTTP": 8,
        "GO": 9,
        "PHP": 10,
        "OMS": 11,
        "RUST": 12,
    }
)
_LANGUAGE_NAMES = {code: name for name, code in LANGUAGE_CODES.items()}

# ROCKETMQ header: code int16, language byte, version int16, opaque int32, flag int32.
_FIXED = struct.Struct(">hbhii")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_PREFIX = struct.Struct(">iI")


class FrameError(ValueError):
    """A frame or a command this protocol refuses: one line naming the field and the limit."""


def _empty_fields() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` are the custom header's fields (all strings);
    ``serialize_type`` is the header's encoding on the wire (a response uses its request's)."""

    code: int
    opaque: int
    flag: int = 0
    remark: str | None = None
    ext_fields: Mapping[str, str] = field(default_factory=_empty_fields)
    body: bytes = b""
    language: str = DEFAULT_LANGUAGE
    version: int = DEFAULT_VERSION
    serialize_type: int = SERIALIZE_JSON

    def __post_init__(self) -> None:
        # A read-only copy: a command is a value, shared between tasks.
        object.__setattr__(self, "ext_fields", MappingProxyType(dict(self.ext_fields)))

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY) and not self.is_response

    def response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The answer to this request: same opaque and serialize type, the response flag."""
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields or {},
            body=body,
            serialize_type=self.serialize_type,
        )

    def with_opaque(self, opaque: int) -> RemotingCommand:
        return replace(self, opaque=opaque)


# ---------------------------------------------------------------------------------- checks


def _check_int(name: str, value: object, low: int, high: int) -> int:
    # bool is an int in Python, never in a RocketMQ header.
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError(f"header field {name!r} is {type(value).__name__}, not an integer")
    if not low <= value <= high:
        raise FrameError(f"header field {name!r} = {value} is outside [{low}, {high}]")
    return value


def _utf8_len(name: str, text: str, limit: int) -> int:
    """The UTF-8 length of ``text``, refused over ``limit`` or when not encodable (a lone
    surrogate from a JSON escape)."""
    if len(text) > limit:  # each character is at least one byte
        raise FrameError(f"{name} is over {limit} bytes")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise FrameError(f"{name} is not valid Unicode (a lone surrogate)") from None
    if size > limit:
        raise FrameError(f"{name} is {size} bytes, over {limit}")
    return size


def _check_fields(fields: Mapping[str, str]) -> None:
    if len(fields) > MAX_EXT_FIELDS:
        raise FrameError(f"{len(fields)} extFields, over {MAX_EXT_FIELDS}")
    for key, value in fields.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise FrameError("extFields keys and values must be strings")
        if not key:
            raise FrameError("an extFields key is empty")
        _utf8_len(f"extFields key {key[:32]!r}", key, MAX_EXT_KEY_BYTES)
        _utf8_len(f"extFields value of {key[:32]!r}", value, MAX_EXT_VALUE_BYTES)


def check_command(cmd: RemotingCommand) -> None:
    """Raise FrameError unless ``cmd`` is within every limit (what encode and decode hold)."""
    _check_int("code", cmd.code, INT32_MIN, INT32_MAX)
    _check_int("version", cmd.version, INT32_MIN, INT32_MAX)
    if cmd.serialize_type == SERIALIZE_ROCKETMQ:
        _check_int("code", cmd.code, INT16_MIN, INT16_MAX)
        _check_int("version", cmd.version, INT16_MIN, INT16_MAX)
    _check_int("opaque", cmd.opaque, INT32_MIN, INT32_MAX)
    _check_int("flag", cmd.flag, INT32_MIN, INT32_MAX)
    if cmd.serialize_type not in SERIALIZE_TYPES:
        raise FrameError(f"serialize type {cmd.serialize_type} is neither 0 (JSON) nor 1")
    if not isinstance(cmd.language, str) or not 0 < len(cmd.language) <= MAX_LANGUAGE_CHARS:
        raise FrameError(f"language must be 1 to {MAX_LANGUAGE_CHARS} characters")
    if cmd.serialize_type == SERIALIZE_ROCKETMQ and cmd.language not in LANGUAGE_CODES:
        raise FrameError(f"language {cmd.language[:32]!r} has no ROCKETMQ code")
    if cmd.remark is not None:
        if not isinstance(cmd.remark, str):
            raise FrameError("remark must be a string")
        _utf8_len("remark", cmd.remark, MAX_REMARK_BYTES)
    _check_fields(cmd.ext_fields)
    if not isinstance(cmd.body, bytes | bytearray | memoryview):
        raise FrameError("body must be bytes")


# -------------------------------------------------------------------------------- encoding


def _json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
        "extFields": dict(cmd.ext_fields),
        "serializeTypeCurrentRPC": _SERIALIZE_NAMES[cmd.serialize_type],
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _binary_header(cmd: RemotingCommand) -> bytes:
    parts = [_FIXED.pack(cmd.code, LANGUAGE_CODES[cmd.language], cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode("utf-8")
    parts += [_INT32.pack(len(remark)), remark]
    fields = []
    for key, value in cmd.ext_fields.items():
        k, v = key.encode("utf-8"), value.encode("utf-8")
        fields += [_INT16.pack(len(k)), k, _INT32.pack(len(v)), v]
    table = b"".join(fields)
    parts += [_INT32.pack(len(table)), table]
    return b"".join(parts)


def encode_frame(cmd: RemotingCommand) -> bytes:
    """The frame of ``cmd`` (FrameError when it breaks a limit: nothing is sent)."""
    check_command(cmd)
    header = _json_header(cmd) if cmd.serialize_type == SERIALIZE_JSON else _binary_header(cmd)
    if len(header) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(header)} bytes, over {MAX_HEADER_BYTES}")
    length = TYPE_FIELD_BYTES + len(header) + len(cmd.body)
    if LENGTH_FIELD_BYTES + length > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {LENGTH_FIELD_BYTES + length} bytes, over {MAX_FRAME_BYTES}")
    return b"".join(
        (_PREFIX.pack(length, (cmd.serialize_type << 24) | len(header)), header, bytes(cmd.body))
    )


# -------------------------------------------------------------------------------- decoding


def _no_constant(name: str) -> None:
    raise FrameError(f"JSON header holds {name}, not a number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FrameError(f"JSON header repeats the key {key[:32]!r}")
        out[key] = value
    return out


def _field_text(key: str, value: object) -> str:
    """An extFields value as RocketMQ's JSON reader keeps it: strings as they are, integers and
    booleans as their text (the Node.js client sends queueId, sysFlag... as JSON numbers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise FrameError(f"extFields value of {key[:32]!r} is out of the int64 range")
        return str(value)
    raise FrameError(
        f"extFields value of {key[:32]!r} is {type(value).__name__}, not a string or integer"
    )


def _json_fields(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise FrameError(f"header field 'extFields' is {type(raw).__name__}, not an object")
    if len(raw) > MAX_EXT_FIELDS:
        raise FrameError(f"{len(raw)} extFields, over {MAX_EXT_FIELDS}")
    # A JSON null value is an absent field (a JavaScript client's unset header field).
    return {key: _field_text(key, value) for key, value in raw.items() if value is not None}


def decode_json_header(data: bytes) -> dict[str, Any]:
    """The header fields of a JSON header, typed and bounded (FrameError otherwise)."""
    try:
        header = json.loads(
            data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
        )
    except FrameError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FrameError(f"JSON header is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(header, dict):
        raise FrameError(f"JSON header is {type(header).__name__}, not an object")
    if "code" not in header:
        raise FrameError("JSON header has no 'code'")
    remark = header.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise FrameError(f"header field 'remark' is {type(remark).__name__}, not a string")
    language = header.get("language", "OTHER")
    if not isinstance(language, str):
        raise FrameError(f"header field 'language' is {type(language).__name__}, not a string")
    serialize = header.get("serializeTypeCurrentRPC")
    if serialize is not None and serialize not in _SERIALIZE_NAMES.values():
        raise FrameError("header field 'serializeTypeCurrentRPC' is not JSON or ROCKETMQ")
    return {
        "code": header["code"],
        "opaque": header.get("opaque", 0),
        "flag": header.get("flag", 0),
        "remark": remark,
        "ext_fields": _json_fields(header.get("extFields")),
        "language": language,
        "version": header.get("version", DEFAULT_VERSION),
    }


class _Reader:
    """Bounded reads of a ROCKETMQ header: running out of bytes is a FrameError."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise FrameError(f"ROCKETMQ header ends inside {what}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def int32(self, what: str) -> int:
        value: int = _INT32.unpack(self.take(4, what))[0]
        return value

    def text(self, n: int, limit: int, what: str) -> str:
        if not 0 <= n <= limit:
            raise FrameError(f"{what} of {n} bytes is outside [0, {limit}]")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(f"{what} is not UTF-8") from None


def decode_binary_header(data: bytes) -> dict[str, Any]:
    """The header fields of a ROCKETMQ header (FrameError when malformed or trailing bytes)."""
    r = _Reader(data)
    code, language_code, version, opaque, flag = _FIXED.unpack(r.take(_FIXED.size, "the fields"))
    language = _LANGUAGE_NAMES.get(language_code)
    if language is None:
        raise FrameError(f"language code {language_code} is not in RocketMQ's table")
    remark_len = r.int32("the remark length")
    remark = r.text(remark_len, MAX_REMARK_BYTES, "remark") if remark_len else None
    table_len = r.int32("the extFields length")
    if not 0 <= table_len <= len(data) - r.at:
        raise FrameError(f"extFields length {table_len} exceeds the header's remaining bytes")
    table = _Reader(r.take(table_len, "extFields"))
    fields: dict[str, str] = {}
    while table.at < len(table.data):
        if len(fields) >= MAX_EXT_FIELDS:
            raise FrameError(f"more than {MAX_EXT_FIELDS} extFields")
        key_len: int = _INT16.unpack(table.take(2, "an extFields key length"))[0]
        key = table.text(key_len, MAX_EXT_KEY_BYTES, "an extFields key")
        value = table.text(table.int32("a value length"), MAX_EXT_VALUE_BYTES, "a value")
        if key in fields:
            raise FrameError(f"extFields repeat the key {key[:32]!r}")
        fields[key] = value
    if r.at != len(data):
        raise FrameError(f"ROCKETMQ header has {len(data) - r.at} bytes after its fields")
    return {
        "code": code,
        "opaque": opaque,
        "flag": flag,
        "remark": remark,
        "ext_fields": fields,
        "language": language,
        "version": version,
    }


def decode_command(serialize_type: int, header: bytes, body: bytes) -> RemotingCommand:
    """One command from its header and body (FrameError when malformed)."""
    if serialize_type == SERIALIZE_JSON:
        fields = decode_json_header(header)
    elif serialize_type == SERIALIZE_ROCKETMQ:
        fields = decode_binary_header(header)
    else:
        raise FrameError(f"serialize type {serialize_type} is neither 0 (JSON) nor 1 (ROCKETMQ)")
    # Typed before the dataclass is built, so check_command names the field that is wrong.
    _check_int("code", fields["code"], INT32_MIN, INT32_MAX)
    cmd = RemotingCommand(**fields, body=body, serialize_type=serialize_type)
    check_command(cmd)
    return cmd


class FrameDecoder:
    """Cuts a byte stream into commands. ``feed`` returns the commands completed so far; on a
    malformed frame it raises FrameError, and every later call raises it again (the stream
    cannot be resynchronised). At most one frame (MAX_FRAME_BYTES) is buffered."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._error: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        if self._error is not None:
            raise self._error
        self._buf += data
        out: list[RemotingCommand] = []
        try:
            while (cmd := self._next()) is not None:
                out.append(cmd)
        except FrameError as exc:
            self._error = exc
            self._buf = bytearray()
            raise
        return out

    def _next(self) -> RemotingCommand | None:
        buf = self._buf
        if len(buf) < LENGTH_FIELD_BYTES:
            return None
        length: int = _INT32.unpack_from(buf)[0]
        # Checked before the frame is buffered: a huge length is refused at its first 4 bytes.
        if length < TYPE_FIELD_BYTES:
            raise FrameError(f"frame length {length} is under the {TYPE_FIELD_BYTES} it needs")
        if LENGTH_FIELD_BYTES + length > MAX_FRAME_BYTES:
            raise FrameError(
                f"frame of {LENGTH_FIELD_BYTES + length} bytes, over {MAX_FRAME_BYTES}"
            )
        if len(buf) < LENGTH_FIELD_BYTES + TYPE_FIELD_BYTES:
            return None
        type_and_len: int = _INT32.unpack_from(buf, LENGTH_FIELD_BYTES)[0]
        serialize_type, header_len = (type_and_len >> 24) & 0xFF, type_and_len & 0xFFFFFF
        if serialize_type not in SERIALIZE_TYPES:
            raise FrameError(f"serialize type {serialize_type} is neither 0 (JSON) nor 1")
        if header_len > MAX_HEADER_BYTES:
            raise FrameError(f"header of {header_len} bytes, over {MAX_HEADER_BYTES}")
        if header_len > length - TYPE_FIELD_BYTES:
            raise FrameError(f"header of {header_len} bytes does not fit a frame of {length}")
        end = LENGTH_FIELD_BYTES + length
        if len(buf) < end:
            return None
        start = LENGTH_FIELD_BYTES + TYPE_FIELD_BYTES
        header = bytes(buf[start : start + header_len])
        body = bytes(buf[start + header_len : end])
        del buf[:end]
        return decode_command(serialize_type, header, body)
