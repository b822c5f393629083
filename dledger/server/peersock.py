"""The peer socket: the Raft message stream (``DLedgerPeer.Stream``'s traffic) over a plain
TCP connection of the event loop's own, mutual TLS when the group is secure.

Why: every gRPC completion costs a process a hand-off from grpc.aio's poller thread (a futex,
a byte written to a socketpair, an epoll_wait, a read; docs/PERFORMANCE.md "Peer sockets
(issue 36)"). Here a message to a peer is one ``send`` (an append: one ``writev`` of its
head and its entries' shared encoding) from the event loop and a message from a peer one
``recv`` into the connection's buffer, handled in ``buffer_updated``, with nothing between.

One connection per direction per peer pair, as with the gRPC stream: the sender's link opens
it (:class:`dledger.server.transport.PeerLink`), the receiver only reads it and writes a small
liveness frame back every second. The wire (docs/FORMAT.md "Peer socket"):

- every frame is a 4-byte big-endian length and that many bytes;
- the link's first frame is a hello: magic ``RMQP``, the protocol version (u16), the group
  and the sender's id (each a u8 length and UTF-8); the receiver answers with one frame:
  magic ``RMQA``, its version (u16), a code (u8: 0 accepted, 1 refused, 2 version not
  spoken) and the reason (UTF-8) when refused, then closes a refused connection;
- then the link's frames are ``PeerMessage`` bytes exactly as the gRPC stream carries them
  (dledger.server.peerwire), the receiver's are ``PeerAck`` (the messages received so far).

Who may send is decided exactly as for the gRPC stream: under mutual TLS by the certificate
(dledger.server.members.stream_sender, refusals counted in mqsecurity.refusals), in plaintext
by the hello's group and id (as peer_service's ``_claimed_sender``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from google.protobuf.message import DecodeError
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.log import DLedgerError
from dledger.server import peerwire
from dledger.server.convert import echo
from dledger.server.members import (
    FROM_HEADER,
    GROUP_HEADER,
    AcceptedPeers,
    Refused,
    claimed_sender_refusal,
    stream_sender,
)
from mqsecurity.errors import CertificateError
from mqsecurity.refusals import REFUSALS, TLS_HANDSHAKE
from mqsecurity.tls import TlsFiles, read_pem

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

# The socket protocol versions this release speaks (the hello's and PeerSocketInfo's
# max_version). A link sends min(its highest, the member's highest); below MIN: not spoken.
MIN_PROTOCOL_VERSION = 1
MAX_PROTOCOL_VERSION = 1
HELLO_MAGIC = b"RMQP"
ANSWER_MAGIC = b"RMQA"
ANSWER_ACCEPTED = 0
ANSWER_REFUSED = 1
ANSWER_VERSION = 2  # the hello's version is not spoken here: the link uses the gRPC stream
# Every frame starts with its length, 4 bytes big-endian.
FRAME_HEADER = struct.Struct(">I")
# A hello is magic, version, two names of at most 255 bytes: well under this.
HELLO_MAX_BYTES = 4 + 2 + 2 * (1 + 255)
# An answer's reason is cut to this many bytes (a refusal names what was wrong, briefly).
ANSWER_REASON_MAX_BYTES = 512
# Frames towards a link (an answer, PeerAcks) are never larger than this.
LINK_FRAME_MAX_BYTES = 4 + 2 + 1 + ANSWER_REASON_MAX_BYTES
# Seconds a connection may take from accept (or connect) to an answered hello; the TLS
# handshake has the same bound.
HANDSHAKE_TIMEOUT_S = 3.0
# The receiver writes a PeerAck this often; a link that heard nothing (no answer, no PeerAck)
# for LIVENESS_TIMEOUT_S closes and reconnects: its peer is paused (SIGSTOP) or gone.
LIVENESS_INTERVAL_S = 1.0
LIVENESS_TIMEOUT_S = 3.0
# Bytes a link lets the kernel's and asyncio's buffers hold towards a slow peer; above it new
# messages are dropped and counted (as a full queue drops them): Raft resends what matters,
# and a paused peer must not pin memory. Eight maximal append batches of 4 MiB.
WRITE_HIGH_WATER_BYTES = 32 << 20
# After the TLS handshake's deadline, how long a connection's check for a handshake that
# never finished waits more (the deadline's own abort runs first).
TLS_CHECK_SLACK_S = 0.5
# Connections that have not yet sent an accepted hello, at most: more are closed at once (a
# flood of idle connections costs a few descriptors, not the process).
MAX_PENDING_CONNECTIONS = 32
# TCP keepalive on the receiver's connections, so that a link whose host vanished is noticed:
# seconds idle before the first probe, seconds between probes, probes unanswered.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 2
KEEPALIVE_PROBES = 3

# Drop reasons (keys of DLedgerNode.dropped(), beside peer_service.DROP_STREAM_REFUSED, which a
# refused hello in plaintext counts as the gRPC stream's refusal does).
DROP_SOCKET_BAD_FRAME = "socket_bad_frame"
DROP_SOCKET_HANDSHAKE = "socket_handshake"
DROP_SOCKET_OVERFLOW = "socket_overflow"


class FrameError(DLedgerError):
    """Bytes that are no valid frame of the peer socket; the connection is closed."""


class FrameReader:
    """Frames out of a byte stream read in arbitrary pieces; each at most ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        assert max_bytes > 0
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes, in order; FrameError for a length over the bound."""
        buf = self._buf
        if not buf and len(data) >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(data)
            if size == len(data) - FRAME_HEADER.size and size <= self.max_bytes:
                return [data[FRAME_HEADER.size :]]  # one whole frame: the common case
        buf += data
        out: list[bytes] = []
        start = 0
        while len(buf) - start >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(buf, start)
            if size > self.max_bytes:
                raise FrameError(f"a frame of {size} bytes is over {self.max_bytes}")
            end = start + FRAME_HEADER.size + size
            if len(buf) < end:
                break
            out.append(bytes(buf[start + FRAME_HEADER.size : end]))
            start = end
        if start:
            del buf[:start]
        return out

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


def frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload


def frame_start(payload_size: int, head: bytes) -> bytes:
    """A frame's length and the first bytes of its payload, ``head``; the payload's other
    ``payload_size - len(head)`` bytes are written after it, as they are."""
    assert len(head) <= payload_size <= 0xFFFFFFFF
    return FRAME_HEADER.pack(payload_size) + head


# An accepted connection's read buffer: the kernel reads straight into it (a frame's bytes
# are copied by nobody else), as many frames per read as fit. A frame larger than the buffer
# gets a larger one, up to four frames of its size so that it is not moved at every read.
READ_BUFFER_BYTES = 256 << 10
# A read goes into at least this much room; less left at the buffer's end moves the unread
# part (a frame's start) to the front of a fresh buffer first.
READ_ROOM_MIN_BYTES = 64 << 10
# A grown buffer is kept for the next frames up to this size; a larger one (a frame near the
# 80 MiB bound) is let go once its frame is handled: between frames a connection keeps at
# most two buffers of this size (the one read into and the spare its next move reuses).
READ_BUFFER_KEEP_MAX_BYTES = 8 << 20


class FrameBuffer:
    """Frames read in place, for an ``asyncio.BufferedProtocol``: the next read goes into
    ``get_buffer()``'s view, ``filled(n)`` records it, ``next_frame()`` hands out each frame
    it completed as a view of the buffer. A frame's view is valid until the next
    ``get_buffer()`` (then its bytes may be moved or overwritten): who keeps something of it
    copies it. Each frame is at most ``max_bytes`` (settable between frames)."""

    def __init__(self, max_bytes: int) -> None:
        assert max_bytes > 0
        self.max_bytes = max_bytes
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._spare = bytearray()  # the buffer before the last move, reused by the next
        self._start = 0  # the first byte not handed out
        self._end = 0  # the first byte not read

    def get_buffer(self) -> memoryview:
        """Where the next read goes: the rest of a buffer with room for the frame begun."""
        pending = self._end - self._start
        if pending == 0:
            self._start = self._end = 0
            if len(self._buf) > READ_BUFFER_KEEP_MAX_BYTES:
                self._buf = bytearray(READ_BUFFER_BYTES)
        need = FRAME_HEADER.size
        if pending >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(self._buf, self._start)
            need += size  # within max_bytes: next_frame refused a larger one
        if len(self._buf) - self._start < max(need, READ_ROOM_MIN_BYTES):
            self._move(need, pending)
        return memoryview(self._buf)[self._end :]

    def _move(self, need: int, pending: int) -> None:
        """The unread bytes to the front of a buffer of room for ``need`` bytes."""
        size = max(READ_BUFFER_BYTES, need, min(4 * need, READ_BUFFER_KEEP_MAX_BYTES))
        spare = self._spare
        if not size <= len(spare) <= max(size, READ_BUFFER_KEEP_MAX_BYTES):
            spare = bytearray(size)
        spare[:pending] = memoryview(self._buf)[self._start : self._end]
        old = self._buf
        self._buf, self._start, self._end = spare, 0, pending
        self._spare = old if len(old) <= READ_BUFFER_KEEP_MAX_BYTES else bytearray()

    def filled(self, nbytes: int) -> None:
        """``nbytes`` were read into the view ``get_buffer()`` gave."""
        assert 0 <= nbytes <= len(self._buf) - self._end
        self._end += nbytes

    def next_frame(self) -> memoryview | None:
        """The next whole frame's payload; None until more is read; FrameError for a length
        over ``max_bytes`` (as soon as the length is read)."""
        start = self._start
        if self._end - start < FRAME_HEADER.size:
            return None
        (size,) = FRAME_HEADER.unpack_from(self._buf, start)
        if size > self.max_bytes:
            raise FrameError(f"a frame of {size} bytes is over {self.max_bytes}")
        stop = start + FRAME_HEADER.size + size
        if stop > self._end:
            return None
        self._start = stop
        return memoryview(self._buf)[start + FRAME_HEADER.size : stop]

    @property
    def pending_bytes(self) -> int:
        return self._end - self._start


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    group: str
    from_id: str


def _name(text: str) -> bytes:
    raw = text.encode()
    assert len(raw) <= 255, text
    return bytes((len(raw),)) + raw


def encode_hello(version: int, group: str, from_id: str) -> bytes:
    return HELLO_MAGIC + struct.pack(">H", version) + _name(group) + _name(from_id)


def decode_hello(payload: bytes) -> Hello:
    """FrameError for anything but a whole, well-formed hello."""
    if len(payload) < 8 or payload[:4] != HELLO_MAGIC:
        raise FrameError("not a peer socket hello (wrong magic)")
    (version,) = struct.unpack_from(">H", payload, 4)
    names: list[str] = []
    at = 6
    for what in ("group", "from"):
        if at >= len(payload):
            raise FrameError(f"the hello ends before its {what}")
        size = payload[at]
        raw = payload[at + 1 : at + 1 + size]
        if len(raw) != size:
            raise FrameError(f"the hello's {what} is cut short")
        try:
            names.append(raw.decode())
        except UnicodeDecodeError:
            raise FrameError(f"the hello's {what} is not UTF-8") from None
        at += 1 + size
    if at != len(payload):
        raise FrameError(f"{len(payload) - at} bytes after the hello")
    return Hello(version, names[0], names[1])


@dataclass(frozen=True, slots=True)
class Answer:
    version: int
    code: int
    reason: str


def encode_answer(code: int, reason: str = "") -> bytes:
    raw = reason.encode()[:ANSWER_REASON_MAX_BYTES]
    return ANSWER_MAGIC + struct.pack(">HB", MAX_PROTOCOL_VERSION, code) + raw


def decode_answer(payload: bytes) -> Answer:
    if len(payload) < 7 or payload[:4] != ANSWER_MAGIC:
        raise FrameError("not a peer socket answer (wrong magic)")
    version, code = struct.unpack_from(">HB", payload, 4)
    if code not in (ANSWER_ACCEPTED, ANSWER_REFUSED, ANSWER_VERSION):
        raise FrameError(f"unknown answer code {code}")
    return Answer(version, code, payload[7:].decode("utf-8", "replace"))


# ---------------------------------------------------------------------- TLS


def _load_context(context: ssl.SSLContext, files: TlsFiles) -> ssl.SSLContext:
    """``context`` with the member certificate and key and the members' CA loaded."""
    if files.cert_path is None or files.key_path is None or files.ca_path is None:
        raise CertificateError("the peer socket needs a member certificate, its key and the CA")
    files.check_private_key()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_path, files.key_path)
        context.load_verify_locations(cadata=read_pem(files.ca_path, "CA").decode("ascii"))
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise CertificateError(f"peer socket TLS files: {exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """Mutual TLS of the receiving side: only a certificate the members' CA signed gets in."""
    return _load_context(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), files)


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """The link's side: presents this member's certificate, checks the peer's against the CA
    and the address dialled (as the gRPC channel does)."""
    return _load_context(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), files)


def peer_certificate_pem(transport: asyncio.BaseTransport) -> list[bytes]:
    """The certificate the other end presented, PEM, as gRPC's auth context lists it."""
    obj = transport.get_extra_info("ssl_object")
    der = obj.getpeercert(binary_form=True) if obj is not None else None
    return [ssl.DER_cert_to_PEM_cert(der).encode("ascii")] if der else []


# ---------------------------------------------------------------------- receiving side


class PeerSocketServer:
    """The receiving side of one node: accepts links, checks who they are, hands their
    messages to the node (``on_peer_message``, as the gRPC stream's servicer does)."""

    def __init__(self, node: DLedgerNode, max_frame_bytes: int) -> None:
        self.node = node
        # A message frame's bound: the gRPC stream's message bound (transport).
        self.max_frame_bytes = max_frame_bytes
        self._server: asyncio.AbstractServer | None = None
        self.ssl = server_context(node.cfg.tls) if node.cfg.tls is not None else None
        self.pending = 0
        # The accepted connection of each sender: a newer one replaces it (one per direction).
        self.by_sender: dict[str, _Inbound] = {}
        self.port = 0

    async def bind(self, host: str, port: int) -> None:
        """Listen (not serving yet: ``serve`` starts that once the node can take messages)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accepted,
            host,
            port,
            ssl=self.ssl,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.ssl is not None else None,
            reuse_address=True,
            start_serving=False,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def _accepted(self) -> _Inbound:
        conn = _Inbound(self)
        if self.ssl is not None:
            # With TLS the protocol is made at accept and connected only once the handshake
            # succeeded; asyncio reports no failed handshake, so one that never connected by
            # the deadline is counted as the peer port's failed handshakes are.
            loop = asyncio.get_running_loop()
            loop.call_later(HANDSHAKE_TIMEOUT_S + TLS_CHECK_SLACK_S, self._check_made, conn)
        return conn

    def _check_made(self, conn: _Inbound) -> None:
        if not conn.made and self._server is not None:
            REFUSALS.count(
                TLS_HANDSHAKE,
                f"node={self.node.cfg.self_id} peer socket: TLS handshake failed or too slow",
            )

    async def serve(self) -> None:
        assert self._server is not None
        await self._server.start_serving()

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.by_sender.values()):
            conn.close()
        self.by_sender.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), HANDSHAKE_TIMEOUT_S)
        self._server = None

    def check_sender(self, hello: Hello, transport: asyncio.BaseTransport) -> str | Refused:
        """The member on the other end, or why it is refused: the gRPC stream's checks."""
        node = self.node
        cfg = node.cfg
        if cfg.tls is not None:
            sender = stream_sender(
                {"x509_pem_cert": peer_certificate_pem(transport)},
                ((GROUP_HEADER, hello.group), (FROM_HEADER, hello.from_id)),
                cfg.group,
                cfg.self_id,
                AcceptedPeers(node),
            )
            if isinstance(sender, Refused):
                where = transport.get_extra_info("peername")
                REFUSALS.count(
                    sender.reason, f"node={cfg.self_id} socket={where} {sender.failure.detail}"
                )
            return sender
        refused = claimed_sender_refusal(node, hello.group, hello.from_id)
        return hello.from_id if refused is None else refused


class _Inbound(asyncio.BufferedProtocol):
    """One accepted connection: a hello first, then the sender's messages. Reads go straight
    into the connection's FrameBuffer; an append of IN_PLACE_MIN_PAYLOAD_BYTES or more is
    read from it in place (dledger.server.peerwire.decode_append: its bodies' one copy),
    every other message by the protobuf runtime."""

    def __init__(self, server: PeerSocketServer) -> None:
        self.server = server
        self.node = server.node
        self.sender = ""
        self.received = 0
        self._transport: asyncio.Transport | None = None
        self._frames = FrameBuffer(HELLO_MAX_BYTES)
        self._timer: asyncio.TimerHandle | None = None
        self._counted_pending = False
        self.made = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are no subclasses of asyncio.Transport, but are one.)
        self._transport = transport = cast(asyncio.Transport, transport)
        self.made = True
        if self.server.pending >= MAX_PENDING_CONNECTIONS:
            where = transport.get_extra_info("peername")
            self.node.note_drop(DROP_SOCKET_OVERFLOW, f"peer={where}")
            transport.abort()
            return
        self.server.pending += 1
        self._counted_pending = True
        _keepalive(transport.get_extra_info("socket"))
        self._start_hello_deadline()

    def _start_hello_deadline(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_late)

    def _handshake_late(self) -> None:
        self._timer = None
        if not self.sender:
            self._drop(DROP_SOCKET_HANDSHAKE, "no hello within the handshake deadline")

    def _unpend(self) -> None:
        if self._counted_pending:
            self._counted_pending = False
            self.server.pending -= 1

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        frames = self._frames
        frames.filled(nbytes)
        transport = self._transport
        while transport is not None and not transport.is_closing():
            try:
                payload = frames.next_frame()
            except FrameError as exc:
                self._drop(DROP_SOCKET_BAD_FRAME, str(exc))
                return
            if payload is None:
                return
            if not self.sender:
                self._on_hello(bytes(payload))
            else:
                self._on_message(payload)

    def _on_message(self, payload: memoryview) -> None:
        if len(payload) >= peerwire.IN_PLACE_MIN_PAYLOAD_BYTES:
            m = peerwire.decode_append(payload)
            if m is not None:
                self.received += 1
                self.node.on_peer_core_message(self.sender, m)
                return
        try:
            pm = pb.PeerMessage.FromString(bytes(payload))
        except DecodeError:
            self._drop(DROP_SOCKET_BAD_FRAME, "a frame that is no PeerMessage")
            return
        self.received += 1
        self.node.on_peer_message(self.sender, pm)

    def _on_hello(self, payload: bytes) -> bool:
        """Whether the hello is accepted (else the connection is closing)."""
        transport = self._transport
        assert transport is not None
        try:
            hello = decode_hello(payload)
        except FrameError as exc:
            self._drop(DROP_SOCKET_HANDSHAKE, str(exc))
            return False
        if not MIN_PROTOCOL_VERSION <= hello.version <= MAX_PROTOCOL_VERSION:
            why = f"version {hello.version} is not spoken here (up to {MAX_PROTOCOL_VERSION})"
            self._refuse(ANSWER_VERSION, why)
            return False
        sender = self.server.check_sender(hello, transport)
        if isinstance(sender, Refused):
            self._refuse(ANSWER_REFUSED, sender.failure.detail)
            return False
        self._unpend()
        self.sender = sender
        self._frames.max_bytes = self.server.max_frame_bytes
        old = self.server.by_sender.get(sender)
        self.server.by_sender[sender] = self
        if old is not None:
            old.close()  # a link that reconnected: its old connection is dead or dying
        transport.write(frame(encode_answer(ANSWER_ACCEPTED)))
        self._schedule_ack()
        return True

    def _schedule_ack(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(LIVENESS_INTERVAL_S, self._ack)

    def _ack(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            self._timer = None
            return
        transport.write(frame(pb.PeerAck(received=self.received).SerializeToString()))
        self._schedule_ack()

    def _refuse(self, code: int, reason: str) -> None:
        transport = self._transport
        assert transport is not None
        transport.write(frame(encode_answer(code, reason)))
        transport.close()  # after the answer is written

    def _drop(self, reason: str, detail: str) -> None:
        transport = self._transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        self.node.note_drop(reason, f"socket peer={peer} from={echo(self.sender)}: {detail}")
        transport.abort()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._unpend()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.sender and self.server.by_sender.get(self.sender) is self:
            del self.server.by_sender[self.sender]
        self._transport = None


def _keepalive(sock: socket.socket | None) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


# ---------------------------------------------------------------------- sending side


class SocketRefused(DLedgerError):
    """The member refused the link's hello (the reason is the member's answer)."""


class VersionNotSpoken(DLedgerError):
    """The member speaks no version the link does: the link uses the gRPC stream."""


class Outbound(asyncio.Protocol):
    """A link's connection: writes its messages, reads the member's answer and PeerAcks."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.answered: asyncio.Future[Answer] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.heard_at = loop.time()
        self.acked = 0
        self._reader = FrameReader(LINK_FRAME_MAX_BYTES)
        self.problem = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.heard_at = self._loop.time()
        try:
            for payload in self._reader.feed(data):
                self._on_frame(payload)
        except (FrameError, DecodeError) as exc:
            self.abort(f"bad frame from the member: {exc}")

    def _on_frame(self, payload: bytes) -> None:
        if not self.answered.done():
            self.answered.set_result(decode_answer(payload))
            return
        self.acked = pb.PeerAck.FromString(payload).received

    def abort(self, problem: str) -> None:
        self.problem = self.problem or problem
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.problem:
            self.problem = str(exc) or type(exc).__name__
        if not self.answered.done():
            self.answered.set_exception(ConnectionError(self.problem or "closed before answering"))
        if not self.closed.done():
            self.closed.set_result(None)

    def write_buffered(self) -> int:
        transport = self.transport
        if transport is None or transport.is_closing():
            return WRITE_HIGH_WATER_BYTES + 1
        return transport.get_write_buffer_size()


async def connect(
    host: str,
    port: int,
    hello: bytes,
    context: ssl.SSLContext | None,
    server_name: str | None = None,
) -> Outbound:
    """An accepted connection to a member's socket; SocketRefused, VersionNotSpoken, OSError
    or TimeoutError otherwise (the connection then closed)."""
    loop = asyncio.get_running_loop()
    conn = Outbound()
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            await loop.create_connection(
                lambda: conn,
                host,
                port,
                ssl=context,
                server_hostname=(server_name or host) if context is not None else None,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context is not None else None,
            )
            assert conn.transport is not None
            if conn.closed.done():
                raise ConnectionError(conn.problem or "closed at once")
            conn.transport.write(frame(hello))
            answer = await conn.answered
    except BaseException:
        if conn.transport is not None:
            conn.transport.abort()
        raise
    if answer.code == ANSWER_ACCEPTED:
        return conn
    assert conn.transport is not None
    conn.transport.abort()
    if answer.code == ANSWER_VERSION:
        raise VersionNotSpoken(answer.reason)
    raise SocketRefused(answer.reason)
