"""Hostile requests for the fuzz suite (tests/integration/test_fuzz_services.py): hypothesis
strategies that build any protobuf message of the project's services from its descriptor, with
values chosen to break things, plus raw bytes that do not decode, and the check of an answer.

Every string, integer, bytes and repeated field is drawn from a mix of boundary values (empty,
2^31-1, 2^63-1, 2^64-1, negative), names that look like paths or system topics, unicode,
huge values (1 MiB), valid names of the group under test (so that requests get past the first
check), and plain random values. Sizes are bounded so that one request stays below
:data:`MAX_REQUEST_BYTES` (a large repeated field gets small elements).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor as D
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc import StatusCode as SC
from hypothesis import strategies as st
from raftmq.broker.internal.v1 import leaderops_pb2
from raftmq.broker.v1 import broker_pb2
from raftmq.dledger.v1 import dledger_pb2
from raftmq.nameserver.v1 import nameserver_pb2

from broker.frontends.v2 import stubs as rmq5_stubs
from mqcluster.cluster import LocalCluster
from rpckit.status import read_error

# Names the fuzzed group serves, so that some requests reach past name validation.
FUZZ_TOPIC = "FuzzTarget"
FUZZ_GROUP = "fuzz-cg"
MEMBER_IDS = ("n0", "n1", "n2")
# A huge string or bytes value: far above every documented field limit (names 127-255
# characters, properties 32 KiB, messages 4 MiB by default is the only larger one).
HUGE_BYTES = 1 << 20
# Elements of a repeated field when it is "many": far above any per-request cap on queues,
# subscriptions or messages that a client legitimately sends.
MANY = 5000
# A repeated field with more elements than this gets only small elements.
SMALL_REPEAT = 4
# A generated request stays below this: a few fields of HUGE_BYTES, or MANY small elements
# with at most SMALL_REPEAT - 1 small elements of their own (checked by
# tests/unit/test_fuzz_support.py). Larger ones only test gRPC's own receive limit.
MAX_REQUEST_BYTES = 32 << 20
# Nesting depth of generated messages (PeerBatch holds PeerMessages holding PeerBatches).
MAX_DEPTH = 3
# An answer's detail must be shorter than this (issue 16: details bounded, never the input).
MAX_DETAIL_BYTES = 1024
# A detail starts with a stable machine-readable code: upper case, digits, underscores.
CODE_RE = re.compile(r"^[A-Z][A-Z0-9_]{2,}(?: |$)")
# What gRPC itself answers (not the application) for a request above the server's receive
# limit; the only detail allowed not to start with a code. (An answer above the client's
# limit, "CLIENT: Received message larger than max", is a finding: stock clients fail on it.)
GRPC_TOO_LARGE_RE = re.compile(r"^SERVER: Received message larger than max")

_HUGE_STR = "x" * HUGE_BYTES
HOSTILE_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "a",
    FUZZ_TOPIC,
    FUZZ_GROUP,
    "TopicTest",
    "DefaultCluster",
    "broker-a",
    *MEMBER_IDS,
    "n9",
    "%RETRY%fuzz-cg",
    "%DLQ%fuzz-cg",
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "TBW102",
    "../../../victim",
    "../x",
    "/etc/passwd",
    "a/b",
    ".",
    "..",
    "a\\b",
    "t" * 127,
    "t" * 128,
    "t" * 255,
    "t" * 256,
    "g" * 300,
    "y" * 4096,
    _HUGE_STR,
    "é" * 70_000,
    "\x00",
    "nul\x00byte",
    "ü日本語",
    "\u202eevil",
    "😀" * 64,
    "*",
    "TagA || TagB",
    "||",
    " || ",
    "127.0.0.1:1",
    "127.0.0.1:99999",
    ":",
    "host:",
    "[::1]:10911",
    "%",
    "|",
    "-1",
    "9" * 40,
    "\n\r\t",
    "%s%n%x",
    "' OR 1=1 --",
    "0" * 32,
    "7F0000010000000000000000",
    "C0A8000100002A9F0000000000000000",
)
HOSTILE_BYTES: tuple[bytes, ...] = (
    b"",
    b"x",
    b"\x00" * 16,
    bytes(range(256)),
    b"\xff" * 64,
    b"b" * HUGE_BYTES,
    b"c" * ((4 << 20) + 1),  # maxMessageSize (4 MiB) + 1
)


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted(
        {v for v in (low, low + 1, -1, 0, 1, 2, 7, 15, 16, 17, 18, 19, 255, 256, 1024, 1025,
                     65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**62, 2**63 - 2, 2**63 - 1,
                     2**63, 2**64 - 1, high - 1, high)
         if low <= v <= high}
    )  # fmt: skip
    return st.one_of(
        st.sampled_from(edges), st.integers(0, 20), st.integers(min_value=low, max_value=high)
    )


_INT_RANGES: dict[int, tuple[int, int]] = {
    D.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    D.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    D.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    D.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    D.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    D.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    D.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    D.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    D.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    D.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_INTS = {t: _ints(lo, hi) for t, (lo, hi) in _INT_RANGES.items()}
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)
STRINGS = st.one_of(st.sampled_from(HOSTILE_STRINGS), _TEXT)
SMALL_STRINGS = st.one_of(st.sampled_from([s for s in HOSTILE_STRINGS if len(s) <= 300]), _TEXT)
BYTES = st.one_of(st.sampled_from(HOSTILE_BYTES), st.binary(max_size=64))
SMALL_BYTES = st.one_of(st.sampled_from([b"", b"x", b"\x00" * 16]), st.binary(max_size=32))
REPEAT_COUNTS = st.one_of(st.integers(0, 3), st.sampled_from([0, 1, 64, 300, MANY]))
# Inside an element of a large repeated field: a few elements only, so that one request stays
# within MANY x a few KiB.
SMALL_REPEAT_COUNTS = st.integers(0, SMALL_REPEAT - 1)


def _scalar(fd: D.FieldDescriptor, small: bool) -> st.SearchStrategy[Any]:
    t = fd.type
    if t == D.FieldDescriptor.TYPE_STRING:
        return SMALL_STRINGS if small else STRINGS
    if t == D.FieldDescriptor.TYPE_BYTES:
        return SMALL_BYTES if small else BYTES
    if t == D.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == D.FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known), _INTS[D.FieldDescriptor.TYPE_INT32])
    if t in (D.FieldDescriptor.TYPE_DOUBLE, D.FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    return _INTS[t]


@st.composite
def messages(draw: st.DrawFn, desc: D.Descriptor, depth: int = 0, small: bool = False) -> Message:
    """Any message of type ``desc``: each field set or not, with hostile values."""
    msg = GetMessageClass(desc)()
    oneof_choice = {
        o.name: draw(st.sampled_from([None, *(f.name for f in o.fields)])) for o in desc.oneofs
    }
    for fd in desc.fields:
        if fd.containing_oneof is not None and oneof_choice[fd.containing_oneof.name] != fd.name:
            continue
        is_msg = fd.type == D.FieldDescriptor.TYPE_MESSAGE
        if is_msg and depth >= MAX_DEPTH:
            continue
        if fd.containing_oneof is None and not draw(st.booleans()):
            continue
        target = getattr(msg, fd.name)
        counts = SMALL_REPEAT_COUNTS if small else REPEAT_COUNTS
        if is_msg and fd.message_type.GetOptions().map_entry:
            n = draw(counts)
            key_fd, value_fd = fd.message_type.fields
            k = draw(_scalar(key_fd, small or n > SMALL_REPEAT))
            v = draw(_scalar(value_fd, small or n > SMALL_REPEAT))
            for i in range(n):
                target[f"{k}{i}" if i else k] = v
        elif fd.is_repeated:
            n = draw(counts)
            elem_small = small or n > SMALL_REPEAT
            if n == 0:
                continue
            # A few distinct elements, repeated up to n: cheap to draw, still n on the wire.
            distinct = [
                draw(
                    messages(fd.message_type, depth + 1, elem_small)
                    if is_msg
                    else _scalar(fd, elem_small)
                )
                for _ in range(min(n, SMALL_REPEAT))
            ]
            values = [distinct[i % len(distinct)] for i in range(n)]
            if is_msg:
                for v in values:
                    target.add().CopyFrom(v)
            else:
                target.extend(values)
        elif is_msg:
            target.CopyFrom(draw(messages(fd.message_type, depth + 1, small)))
            if not target.ByteSize():
                target.SetInParent()
        else:
            setattr(msg, fd.name, draw(_scalar(fd, small)))
    return msg


# Raw request bodies that are not valid protobuf (or not valid for most request types).
RAW_HOSTILE: tuple[bytes, ...] = (
    b"\xff",
    b"\xff" * 32,
    b"\x80" * 11,  # a varint that never ends
    b"\x08",  # a field tag with no value
    b"\x0a\xff\xff\xff\xff\x0f",  # a length far past the end
    b"\x0a\x05abc",  # a length past the end
    b"\x0a\x02\xc3\x28",  # field 1 as invalid UTF-8 (string fields must be UTF-8)
    b"\x12\x02\xc3\x28",  # field 2 likewise
    b"\x1a\x02\xc3\x28",  # field 3 likewise
    b"\x0f",  # wire type 7 does not exist
    b"\x0b\x0c",  # a group start/end (deprecated wire types)
    b"\x00",  # field number 0
    b"\x12\x03\x0a\x01\xff",  # a nested message with invalid UTF-8 inside
    b"\x3a\x03\x0a\x01\xff",  # field 7 likewise
)
RAW_BYTES = st.one_of(st.sampled_from(RAW_HOSTILE), st.binary(min_size=1, max_size=128))


@dataclass(frozen=True)
class Rpc:
    """One unary RPC: its path, message types and the statuses its docs allow."""

    service: str
    method: str
    request: D.Descriptor
    response: D.Descriptor
    allowed: frozenset[grpc.StatusCode]

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"

    @property
    def name(self) -> str:
        return f"{self.service.rsplit('.', 1)[-1]}.{self.method}"


# The documented answers (docs/BROKER.md "Errors", docs/CLUSTER.md "Errors",
# docs/NAMESERVER.md "Errors"); RESOURCE_EXHAUSTED also covers gRPC's own refusal of a
# request above the receive limit. Never UNKNOWN, INTERNAL or DATA_LOSS (no stored message is
# corrupt, whatever a client sends).
BROKER_ALLOWED = frozenset(
    {
        SC.OK,
        SC.INVALID_ARGUMENT,
        SC.NOT_FOUND,
        SC.FAILED_PRECONDITION,  # NOT_LEADER
        SC.OUT_OF_RANGE,
        SC.RESOURCE_EXHAUSTED,
        SC.PERMISSION_DENIED,
        SC.UNAVAILABLE,  # NO_QUORUM, LEADERSHIP_LOST, TRANSFER_IN_PROGRESS
        SC.ALREADY_EXISTS,
    }
)
DLEDGER_ALLOWED = frozenset(
    {
        SC.OK,
        SC.INVALID_ARGUMENT,  # PROPOSAL_DROPPED, INVALID_REQUEST
        SC.NOT_FOUND,  # UNKNOWN_GROUP
        SC.FAILED_PRECONDITION,  # NOT_LEADER
        SC.OUT_OF_RANGE,  # LOG_COMPACTED
        SC.RESOURCE_EXHAUSTED,  # BACK_PRESSURE, DISK_FULL
        SC.UNAVAILABLE,  # NO_QUORUM, LEADERSHIP_LOST, TRANSFER_IN_PROGRESS
    }
)
NAMESERVER_ALLOWED = frozenset({SC.OK, SC.INVALID_ARGUMENT, SC.NOT_FOUND, SC.RESOURCE_EXHAUSTED})
# RocketMQ 5's front end answers every outcome in the body's Status (docs/RMQ5.md): gRPC says
# only that a request did not decode or was above the receive limit.
V2_ALLOWED = frozenset({SC.OK, SC.INVALID_ARGUMENT, SC.RESOURCE_EXHAUSTED})
PEER_ALLOWED = frozenset(
    {SC.OK, SC.INVALID_ARGUMENT, SC.PERMISSION_DENIED, SC.RESOURCE_EXHAUSTED, SC.UNAVAILABLE}
)
# DLedgerPeer.Join and InstallSnapshot on a secure group (docs/CLUSTER.md "gRPC services",
# docs/SECURITY.md): besides the stream's answers, a call without a member certificate is
# UNAUTHENTICATED (NO_CERTIFICATE), a membership change the core refuses FAILED_PRECONDITION,
# and a refused transfer FAILED_PRECONDITION (SNAPSHOT_REFUSED).
JOIN_ALLOWED = PEER_ALLOWED | {SC.UNAUTHENTICATED, SC.FAILED_PRECONDITION}
SNAPSHOT_ALLOWED = PEER_ALLOWED | {SC.UNAUTHENTICATED, SC.FAILED_PRECONDITION}
# Statuses a particular RPC may also answer: a long poll may outlast the caller's deadline;
# a leadership transfer that does not finish in time says TRANSFER_TIMEOUT.
EXTRA_ALLOWED: dict[str, frozenset[grpc.StatusCode]] = {
    "Broker.PullMessage": frozenset({SC.DEADLINE_EXCEEDED}),
    "LeaderOps.Call": frozenset({SC.DEADLINE_EXCEEDED}),  # a forwarded receive's long poll
    "DLedgerClient.TransferLeadership": frozenset({SC.DEADLINE_EXCEEDED}),
}


def _rpcs(file_desc: D.FileDescriptor, service: str, allowed: frozenset[SC]) -> list[Rpc]:
    svc = file_desc.services_by_name[service]
    out = []
    for m in svc.methods:
        if m.client_streaming or m.server_streaming:
            continue
        rpc = Rpc(svc.full_name, m.name, m.input_type, m.output_type, allowed)
        extra = EXTRA_ALLOWED.get(rpc.name, frozenset())
        out.append(Rpc(svc.full_name, m.name, m.input_type, m.output_type, allowed | extra))
    return out


BROKER_RPCS = _rpcs(broker_pb2.DESCRIPTOR, "Broker", BROKER_ALLOWED)
DLEDGER_RPCS = _rpcs(dledger_pb2.DESCRIPTOR, "DLedgerClient", DLEDGER_ALLOWED)
NAMESERVER_RPCS = _rpcs(nameserver_pb2.DESCRIPTOR, "NameServer", NAMESERVER_ALLOWED)
# A member's forwards of leader operations (docs/ARCHITECTURE.md): the client port's answers.
LEADER_OPS_RPCS = _rpcs(leaderops_pb2.DESCRIPTOR, "LeaderOps", BROKER_ALLOWED)
V2_RPCS = _rpcs(rmq5_stubs.load()[1].DESCRIPTOR, "MessagingService", V2_ALLOWED)
PEER_STREAM_PATH = "/raftmq.dledger.v1.DLedgerPeer/Stream"
SNAPSHOT_PATH = "/raftmq.dledger.v1.DLedgerPeer/InstallSnapshot"
_PEER_SERVICE = dledger_pb2.DESCRIPTOR.services_by_name["DLedgerPeer"]
_JOIN = _PEER_SERVICE.methods_by_name["Join"]
JOIN_RPC = Rpc(_PEER_SERVICE.full_name, "Join", _JOIN.input_type, _JOIN.output_type, JOIN_ALLOWED)
_HOLDINGS = _PEER_SERVICE.methods_by_name["Holdings"]
_PEER_SOCKET = _PEER_SERVICE.methods_by_name["PeerSocket"]
HOLDINGS_RPC = Rpc(
    _PEER_SERVICE.full_name,
    "Holdings",
    _HOLDINGS.input_type,
    _HOLDINGS.output_type,
    PEER_ALLOWED | {SC.UNAUTHENTICATED},
)
# Where a member offers the peer socket: authenticated and group-checked as Holdings is.
PEER_SOCKET_RPC = Rpc(
    _PEER_SERVICE.full_name,
    "PeerSocket",
    _PEER_SOCKET.input_type,
    _PEER_SOCKET.output_type,
    PEER_ALLOWED | {SC.UNAUTHENTICATED},
)


def summarize(msg: Message | bytes, limit: int = 240) -> str:
    """A short, bounded description of a request, for failure reports."""
    if isinstance(msg, bytes):
        text = f"raw {len(msg)} bytes {msg[:24]!r}"
    else:
        parts = []
        for fd, value in msg.ListFields():
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                first = next(iter(value.items()), None)  # a map: no index 0
                parts.append(f"{fd.name}={{{len(value)} x {str(first)[:40]!r}}}")
            elif fd.is_repeated:
                parts.append(f"{fd.name}=[{len(value)} x {str(value[0])[:40]!r}]")
            elif isinstance(value, str | bytes):
                parts.append(f"{fd.name}=({len(value)}){value[:40]!r}")
            elif isinstance(value, Message):
                parts.append(f"{fd.name}={{{summarize(value, 100)}}}")
            else:
                parts.append(f"{fd.name}={value!r}")
        text = " ".join(parts) or "(empty)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Findings:
    """Answers outside the documented set, by (rpc, status, detail's first word)."""

    seen: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    calls: int = 0
    by_status: dict[str, int] = field(default_factory=dict)

    def check(
        self, rpc_name: str, allowed: frozenset[SC], request: str, code: SC, detail: str
    ) -> None:
        self.calls += 1
        self.by_status[code.name] = self.by_status.get(code.name, 0) + 1
        problems = []
        if code not in allowed:
            problems.append(f"status {code.name} not in the documented set")
        if code is not SC.OK:
            size = len(detail.encode("utf-8", "replace"))
            if size >= MAX_DETAIL_BYTES:
                problems.append(f"detail of {size} bytes")
            if (
                not CODE_RE.match(detail)
                and not (code is SC.RESOURCE_EXHAUSTED and GRPC_TOO_LARGE_RE.match(detail))
                and code is not SC.DEADLINE_EXCEEDED
            ):
                problems.append("detail without a leading CODE")
        for p in problems:
            word = detail.split(" ", 1)[0][:40]
            key = (rpc_name, code.name, f"{p}: {word}")
            examples = self.seen.setdefault(key, [])
            if len(examples) < 2:
                examples.append(f"{request} -> {code.name} {detail[:160]!r}")

    def report(self) -> str:
        lines = [f"{len(self.seen)} kinds of bad answer in {self.calls} calls:"]
        for (rpc, code, what), examples in sorted(self.seen.items()):
            lines.append(f"  {rpc} {code} ({what})")
            lines += [f"      e.g. {e}" for e in examples]
        return "\n".join(lines)


def _serialize(m: Message | bytes) -> bytes:
    return m if isinstance(m, bytes) else m.SerializeToString()


# Prefix of a detail whose status details are missing or disagree with it: it fails CODE_RE,
# so Findings reports it like any detail without a code.
NO_ERROR_INFO = "(no matching ErrorInfo) "


def answered_detail(exc: grpc.RpcError) -> str:
    """The text detail of a failed call, checked against its structured error: a server's
    answer (the text starts with a code) must carry an ErrorInfo of that code in its status
    details; gRPC's own failures (deadline, message too large) carry none."""
    detail = exc.details() or ""
    if not CODE_RE.match(detail):
        return detail
    info = read_error(exc)
    if info is None or info.code != detail.split(" ", 1)[0]:
        return NO_ERROR_INFO + detail
    return detail


def call_unary(
    channel: grpc.Channel,
    rpc: Rpc,
    request: Message | bytes,
    timeout_s: float,
    metadata: Sequence[tuple[str, str]] = (),
) -> tuple[SC, str]:
    """Call ``rpc`` with a message (or raw bytes, unserialized); the status and detail."""
    raw = isinstance(request, bytes)
    stub = channel.unary_unary(
        rpc.path,
        request_serializer=None if raw else _serialize,
        response_deserializer=None,  # the raw answer: its decoding is not under test
    )
    try:
        stub(request, timeout=timeout_s, metadata=tuple(metadata))
    except grpc.RpcError as exc:
        return exc.code(), answered_detail(exc)
    return SC.OK, ""


def call_peer_stream(
    channel: grpc.Channel,
    requests: Sequence[Message | bytes],
    metadata: Sequence[tuple[str, str]],
    timeout_s: float,
    path: str = PEER_STREAM_PATH,
) -> tuple[SC, str]:
    """One client stream of DLedgerPeer (``Stream`` unless ``path`` says another) carrying
    ``requests`` (messages or raw bytes)."""
    stub = channel.stream_unary(
        path,
        request_serializer=_serialize,
        response_deserializer=None,
    )
    try:
        stub(iter(requests), timeout=timeout_s, metadata=tuple(metadata))
    except grpc.RpcError as exc:
        return exc.code(), answered_detail(exc)
    return SC.OK, ""


# ---- raw connections: the peer socket and remoting fuzz tests' client


def raw_exchange(port: int, data: bytes, timeout_s: float) -> bytes | None:
    """Send ``data`` on a fresh connection to ``127.0.0.1:port``, shut our side and read until
    the server closes: what it answered (b"": nothing, or it reset the connection, which a
    server may do to bytes it refuses). None: it held the connection open past ``timeout_s``
    after the sender was done (a finding: a hostile client could pin it)."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout_s) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            return None
    return bytes(received)


def rss_mib(pid: int) -> float:
    """The resident set of process ``pid`` (0 when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return 0.0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def group_rss_mib(cluster: LocalCluster) -> dict[str, float]:
    """Each running node's resident set, by node id."""
    pids = {n.node_id: cluster.pid(n) for n in cluster.nodes}
    return {node_id: rss_mib(pid) for node_id, pid in pids.items() if pid}


def assert_group_survived(
    cluster: LocalCluster, rss_before: dict[str, float], bound_mib: float
) -> None:
    """After fuzzing: no node exited and none grew its resident set by ``bound_mib`` or more
    since ``rss_before`` (:func:`group_rss_mib`)."""
    exited = [e for n in cluster.nodes if (e := cluster.exited(n))]
    assert not exited, exited
    after = group_rss_mib(cluster)
    grown = {k: after[k] - rss_before[k] for k in after if k in rss_before}
    print(f"RSS growth MiB: {grown}")
    assert all(g < bound_mib for g in grown.values()), grown
