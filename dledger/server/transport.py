"""Peer transport: one long-lived connection per peer, fed from a bounded queue: the peer's
socket (dledger.server.peersock) when it offers one, else the gRPC stream
(``DLedgerPeer.Stream``); a link asks which (``DLedgerPeer.PeerSocket``) each time it connects.

Raft tolerates lost messages, so the transport never blocks the node: when a peer is slow,
paused or gone, its queue fills and further messages to it are dropped (and counted). A
broken stream is reopened with capped exponential back-off. Keepalive pings (the stream) or the
peer's liveness frames (the socket) detect a peer that vanished without closing its socket
(SIGSTOP, cable pulled) within a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import AppendRequest, Message
from dledger.server import peersock, peerwire
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_aio_channel
from prockit.fatal import spawn

logger = logging.getLogger(__name__)

# Messages queued per peer before new ones are dropped. Each is at most one append batch
# (max_append_batch_bytes), so this bounds the memory a dead peer can pin.
PEER_QUEUE_MAX_MESSAGES = 256
# At most this many queued messages share one stream write (PeerBatch). Their total size is
# bounded by the queue's: each is at most one append batch.
PEER_BATCH_MAX_MESSAGES = 64
# Reconnect back-off bounds after a failed stream.
RECONNECT_MIN_MS = 20
RECONNECT_MAX_MS = 1000
# Largest gRPC message either side accepts: an append batch of max_append_batch_bytes plus
# one maximum-size entry (64 MiB, the store's limit) must fit.
MAX_GRPC_MESSAGE_BYTES = 80 << 20
# The peer stream's full method name (dledger.proto, service DLedgerPeer).
STREAM_METHOD = "/raftmq.dledger.v1.DLedgerPeer/Stream"
# Where a link asks whether the peer offers its socket (dledger.server.peersock).
PEER_SOCKET_METHOD = "/raftmq.dledger.v1.DLedgerPeer/PeerSocket"
# Seconds a link waits for that answer (the call waits for the channel to be ready: a peer
# that is down is asked again after the back-off).
PEER_SOCKET_ASK_TIMEOUT_S = 5.0

# Failures of a link's calls that only mean the peer is down or slow (no warning logged).
_QUIET_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_MIN_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
]

SERVER_OPTIONS: list[tuple[str, int]] = [
    # Without this, gRPC binds with SO_REUSEPORT and a second process on the same port
    # "succeeds" and steals half the connections; we want a clear "port in use" instead.
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
]


@dataclass(slots=True)
class LinkStats:
    sent: int = 0
    batches: int = 0  # writes that carried more than one message
    dropped: int = 0
    reconnects: int = 0
    # Which transport carries the link now: "socket" (dledger.server.peersock), "stream"
    # (the gRPC stream) or "" while it connects.
    carrier: str = ""


class PeerLink:
    """The outbound half of the conversation with one peer. With ``security.tls`` the stream
    speaks mutual TLS and this node's member certificate is what identifies it to the peer."""

    def __init__(
        self,
        group: str,
        self_id: str,
        self_client_addr: str,
        peer_id: str,
        addr: str,
        security: ClientSecurity = PLAINTEXT,
        use_socket: bool = True,
        entries: peerwire.EntriesCache | None = None,
    ):
        """``use_socket``: use the peer's socket when it offers one (else the gRPC stream
        only); ``entries``: the encodings of appends' entries this link shares with the
        node's other links (each follower's append of the same entries reuses one)."""
        self.peer_id = peer_id
        self.addr = addr
        self._security = security
        self.stats = LinkStats()
        self._group = group
        self._metadata = (
            ("x-raftmq-group", group),
            ("x-raftmq-from", self_id),
            # Informational only: receivers use their configured addresses for redirects.
            ("x-raftmq-client-addr", self_client_addr),
        )
        self._queue: asyncio.Queue[Message] = asyncio.Queue(PEER_QUEUE_MAX_MESSAGES)
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._self_id = self_id
        self._use_socket = use_socket
        self._entries = entries if entries is not None else peerwire.EntriesCache()
        # The peer socket connection while the link uses one (send writes to it directly).
        self._conn: peersock.Outbound | None = None

    def start(self) -> None:
        assert self._task is None
        # Fail fast: _run handles every failure of a stream itself; anything else that escapes
        # it (a bug) ends the process rather than leaving this peer silently unserved.
        self._task = spawn(self._run(), f"peer-{self.peer_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None

    def send(self, m: Message) -> None:
        """Queue ``m`` for the stream, in order; dropped (and counted) when the queue is full.
        Which messages to send, and when, is the Raft core's business (commit notices are
        coalesced there, dledger.core). On a peer socket the message is written at once
        (one send), unless the connection's buffers hold over WRITE_HIGH_WATER_BYTES already:
        then it is dropped and counted too."""
        conn = self._conn
        if conn is not None:
            if conn.closed.done() or conn.write_buffered() > peersock.WRITE_HIGH_WATER_BYTES:
                # Closed (the link reconnects once it sees it; uvloop raises on a write to a
                # closed transport) or a peer that stopped reading: dropped, as Raft allows.
                self.stats.dropped += 1
                return
            self._write(conn, m)
            return
        try:
            self._queue.put_nowait(m)
        except asyncio.QueueFull:
            self.stats.dropped += 1

    async def _messages(self) -> AsyncIterator[bytes]:
        """Core messages become ``PeerMessage`` wire bytes here, as they are written (each
        exactly once; an append's bodies copied once, dledger.server.peerwire)."""
        queue = self._queue
        group = self._group
        entries = self._entries

        def encode(m: Message, group: str) -> bytes:
            return peerwire.encode(m, group, entries)

        while True:
            m = await queue.get()
            if queue.empty():
                self.stats.sent += 1
                yield encode(m, group)
                continue
            # What queued while the previous write was in flight goes out in one write.
            wires = [encode(m, group)]
            while not queue.empty() and len(wires) < PEER_BATCH_MAX_MESSAGES:
                wires.append(encode(queue.get_nowait(), group))
            self.stats.sent += len(wires)
            self.stats.batches += 1
            yield peerwire.encode_batch(wires)

    def _write(self, conn: peersock.Outbound, m: Message) -> None:
        """One frame of ``m``. An append's entries are not copied for it: their shared
        encoding (peerwire.SharedEntries) follows this follower's head in one ``writelines``,
        which uvloop hands the kernel as one ``writev`` of the bodies themselves; under TLS
        (each part its own record) the entries go joined, once for every follower."""
        transport = conn.transport
        assert transport is not None
        if isinstance(m, AppendRequest) and m.entries:
            shared = self._entries.get(m.entries)
            head = peerwire.append_head(m, self._group, shared.size)
            first = peersock.frame_start(len(head) + shared.size, head)
            if self._security.tls is None:
                transport.writelines((first, *shared.parts))
            else:
                transport.writelines((first, shared.joined()))
        else:
            transport.write(peersock.frame(peerwire.encode(m, self._group)))
        self.stats.sent += 1

    async def _run(self) -> None:
        backoff_ms = RECONNECT_MIN_MS
        while True:
            try:
                if self._channel is None:
                    self._channel = open_aio_channel(self.addr, self._security, CHANNEL_OPTIONS)
                port, version = await self._offered_socket()
                if port and await self._run_socket(port, version):
                    backoff_ms = RECONNECT_MIN_MS
                else:
                    await self._run_stream()
                    backoff_ms = RECONNECT_MIN_MS
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _QUIET_CODES:
                    logger.warning(
                        "peer=%s addr=%s stream_failed code=%s detail=%s",
                        self.peer_id,
                        self.addr,
                        exc.code().name,
                        exc.details(),
                    )
            except (OSError, TimeoutError, peersock.SocketRefused) as exc:
                logger.warning(
                    "peer=%s addr=%s socket_failed %s: %s",
                    self.peer_id,
                    self.addr,
                    type(exc).__name__,
                    exc,
                )
            except Exception:
                logger.exception("peer=%s addr=%s stream_crashed", self.peer_id, self.addr)
            self.stats.carrier = ""
            self.stats.reconnects += 1
            # Whatever queued up while the peer was unreachable is stale by now: Raft will
            # resend what matters (heartbeats carry the commit index, probes find the match).
            while not self._queue.empty():
                self._queue.get_nowait()
                self.stats.dropped += 1
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(RECONNECT_MAX_MS, backoff_ms * 2)

    async def _offered_socket(self) -> tuple[int, int]:
        """The peer's socket port and the protocol version to speak; (0, 0) when the link
        uses the gRPC stream (turned off here, not offered there, or an older release that
        answers UNIMPLEMENTED)."""
        if not self._use_socket:
            return 0, 0
        assert self._channel is not None
        ask = self._channel.unary_unary(
            PEER_SOCKET_METHOD,
            request_serializer=pb.PeerSocketRequest.SerializeToString,
            response_deserializer=pb.PeerSocketInfo.FromString,
        )
        request = pb.PeerSocketRequest(group=self._group, max_version=peersock.MAX_PROTOCOL_VERSION)
        try:
            info = await ask(
                request,
                metadata=self._metadata,
                timeout=PEER_SOCKET_ASK_TIMEOUT_S,
                wait_for_ready=True,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return 0, 0
            raise
        version = min(peersock.MAX_PROTOCOL_VERSION, info.max_version)
        if not 0 < info.port <= 65535 or version < peersock.MIN_PROTOCOL_VERSION:
            return 0, 0
        return info.port, version

    async def _run_socket(self, port: int, version: int) -> bool:
        """Carry the link on the peer's socket until the connection ends; False when the peer
        speaks no version of this release (the caller uses the gRPC stream)."""
        host = self.addr.rpartition(":")[0].strip("[]")
        tls = self._security.tls
        try:
            conn = await peersock.connect(
                host,
                port,
                peersock.encode_hello(version, self._group, self._self_id),
                peersock.client_context(tls) if tls is not None else None,
                self._security.server_name,
            )
        except peersock.VersionNotSpoken as exc:
            logger.info("peer=%s addr=%s socket_version %s", self.peer_id, self.addr, exc)
            return False
        self.stats.carrier = "socket"
        try:
            while not self._queue.empty():  # what queued while connecting, in order
                self._write(conn, self._queue.get_nowait())
            self._conn = conn
            await self._watch(conn)
        finally:
            self._conn = None
            if conn.transport is not None:
                conn.transport.abort()
        logger.info(
            "peer=%s addr=%s socket_closed %s",
            self.peer_id,
            self.addr,
            conn.problem or "by the peer",
        )
        return True

    async def _watch(self, conn: peersock.Outbound) -> None:
        """Until ``conn`` closes, or the peer is silent for LIVENESS_TIMEOUT_S (paused, gone:
        the peer writes a PeerAck every LIVENESS_INTERVAL_S)."""
        loop = asyncio.get_running_loop()
        while not conn.closed.done():
            await asyncio.wait([conn.closed], timeout=peersock.LIVENESS_INTERVAL_S)
            silent_s = loop.time() - conn.heard_at
            if silent_s > peersock.LIVENESS_TIMEOUT_S:
                conn.abort(f"nothing heard for {silent_s:.1f} s")

    async def _run_stream(self) -> None:
        """Carry the link on the gRPC stream until it ends."""
        assert self._channel is not None
        stream = _stream_of_wire_bytes(self._channel)
        self.stats.carrier = "stream"
        # wait_for_ready: while the peer is unreachable the call waits for the channel
        # instead of failing fast. Failing fast consumed (and lost) a queued message
        # per attempt while gRPC's reconnect backoff ran, which kept the link to a
        # restarted peer mute for seconds: a follower's vote replies never reached a
        # restarted candidate, and failovers after a restart took 3 s instead of 0.7 s.
        # What queues meanwhile is bounded by PEER_QUEUE_MAX_MESSAGES.
        call = stream(self._messages(), metadata=self._metadata, wait_for_ready=True)
        await call


def _wire_bytes(request: bytes) -> bytes:
    """The peer stream's request serializer: the messages are encoded already."""
    return request


def _stream_of_wire_bytes(channel: grpc.aio.Channel) -> grpc.aio.StreamUnaryMultiCallable:
    """``DLedgerPeer.Stream`` (as the generated stub names it) taking ``PeerMessage`` wire
    bytes (``_messages``) instead of protobuf objects to serialize."""
    return channel.stream_unary(
        STREAM_METHOD, request_serializer=_wire_bytes, response_deserializer=pb.PeerAck.FromString
    )


class PeerTransport:
    """All outbound links of one node."""

    def __init__(
        self,
        group: str,
        self_id: str,
        self_client_addr: str,
        peers: dict[str, str],
        security: ClientSecurity = PLAINTEXT,
        resolve: Callable[[str], str] | None = None,
        use_socket: bool = True,
    ) -> None:
        """``resolve`` (peer id -> address, "" when unknown) opens a link on the first message
        to a peer without one (a member this node learnt of after start); ``use_socket``: the
        links use a peer's socket when it offers one (dledger.server.peersock)."""
        self._link_args = (group, self_id, self_client_addr)
        self._use_socket = use_socket
        self._resolve = resolve
        self._security = security
        self._started = False
        # One encoding of an append's entries for all links (peerwire.EntriesCache).
        self.entries = peerwire.EntriesCache()
        self.links: dict[str, PeerLink] = {}
        for pid, addr in peers.items():
            if pid != self_id:
                self.ensure(pid, addr)

    def start(self) -> None:
        self._started = True
        for link in self.links.values():
            link.start()

    def ensure(self, peer_id: str, addr: str) -> None:
        """A link to ``peer_id`` at ``addr`` (a new member; a member whose address changed
        gets a new link)."""
        link = self.links.get(peer_id)
        if link is not None and link.addr == addr:
            return
        if link is not None:
            spawn(link.stop(), f"peer-stop-{peer_id}")
        group, self_id, client_addr = self._link_args
        link = PeerLink(
            group,
            self_id,
            client_addr,
            peer_id,
            addr,
            self._security,
            self._use_socket,
            self.entries,
        )
        self.links[peer_id] = link
        if self._started:
            link.start()
        logger.info("peer=%s addr=%s link_opened", peer_id, addr)

    def drop(self, peer_id: str) -> None:
        """Close the link to a member that left the group."""
        link = self.links.pop(peer_id, None)
        if link is not None:
            spawn(link.stop(), f"peer-stop-{peer_id}")
            logger.info("peer=%s addr=%s link_closed", peer_id, link.addr)

    async def stop(self) -> None:
        await asyncio.gather(*(link.stop() for link in self.links.values()))

    def send(self, m: Message) -> None:
        link = self.links.get(m.to_id)
        if link is None and self._resolve is not None:
            addr = self._resolve(m.to_id)
            if addr:
                self.ensure(m.to_id, addr)
                link = self.links[m.to_id]
        if link is None:
            logger.warning("drop message to unknown peer=%s", m.to_id)
            return
        link.send(m)


MessageHandler = Callable[[str, str, Message], None]
