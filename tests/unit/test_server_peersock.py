"""The peer socket (dledger.server.peersock): its framing, its hello, who it lets in (the gRPC
stream's checks: a member certificate of this group under TLS, the claimed group and id in
plaintext), bad input from a peer (closed and counted, never a crash), and the link's choice
between the socket and the gRPC stream (an older peer answers PeerSocket UNIMPLEMENTED)."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import uvloop
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import AppendRequest, Message, TimeoutNow
from dledger.log import Entry
from dledger.server import peersock, peerwire
from dledger.server.convert import to_pb
from dledger.server.members import DROP_STREAM_REFUSED
from dledger.server.peersock import (
    ANSWER_ACCEPTED,
    ANSWER_REFUSED,
    ANSWER_VERSION,
    FrameBuffer,
    FrameError,
    FrameReader,
    PeerSocketServer,
    decode_answer,
    decode_hello,
    encode_hello,
    frame,
)
from dledger.server.transport import SERVER_OPTIONS, STREAM_METHOD, PeerLink, PeerTransport
from mqsecurity import pki
from mqsecurity.channels import ClientSecurity
from mqsecurity.refusals import PEER_CERTIFICATE, PEER_IDENTITY, REFUSALS, TLS_HANDSHAKE
from mqsecurity.tls import TlsFiles

GROUP = "g0"
SELF = "n0"
PEER = "n1"
# Bounds of every wait below (the work is local: milliseconds).
WAIT_S = 5.0


# ---------------------------------------------------------------------- framing


def test_frames_split_anywhere_or_merged_come_out_whole_and_in_order() -> None:
    payloads = [b"", b"a", b"bc" * 100, bytes(range(256))]
    stream = b"".join(frame(p) for p in payloads)
    for piece in (1, 2, 3, 5, 7, len(stream)):
        reader = FrameReader(1024)
        got: list[bytes] = []
        for at in range(0, len(stream), piece):
            got += reader.feed(stream[at : at + piece])
        assert got == payloads, piece
        assert reader.pending_bytes == 0


def test_a_frame_over_the_bound_is_refused_before_its_bytes_arrive() -> None:
    reader = FrameReader(100)
    assert reader.feed(frame(b"x" * 100)) == [b"x" * 100]
    with pytest.raises(FrameError, match="101 bytes is over 100"):
        reader.feed(frame(b"x" * 101)[:4])  # the length alone says it


def _read_in_place(buf: FrameBuffer, stream: bytes, pieces: list[int]) -> list[bytes]:
    """``stream`` read into ``buf`` as a socket would: each read at most the next piece and
    at most the room get_buffer gives; each frame copied before the next read."""
    got: list[bytes] = []
    at = 0
    turn = 0
    while at < len(stream):
        room = buf.get_buffer()
        n = min(len(room), pieces[turn % len(pieces)], len(stream) - at)
        turn += 1
        room[:n] = stream[at : at + n]
        buf.filled(n)
        at += n
        while (payload := buf.next_frame()) is not None:
            got.append(bytes(payload))
    return got


def test_frames_read_in_place_split_anywhere_or_merged_come_out_whole_and_in_order() -> None:
    big = peersock.READ_BUFFER_BYTES
    payloads = [b"", b"a", bytes(range(256)) * 9, b"b" * (big - 2), b"c" * (3 * big + 5)]
    payloads += [b"d" * 100] * 50 + [b"e" * big * 2, b"f"]
    stream = b"".join(frame(p) for p in payloads)
    for pieces in ([1, 2, 3, 5000], [7, 100_000], [big * 5], [4, 3 * big - 1, 17]):
        buf = FrameBuffer(4 * big)
        got = _read_in_place(buf, stream, pieces)
        assert got == payloads, pieces
        assert buf.pending_bytes == 0


def test_a_frame_read_in_place_over_the_bound_is_refused_once_its_length_is_read() -> None:
    buf = FrameBuffer(100)
    assert _read_in_place(buf, frame(b"x" * 100), [1000]) == [b"x" * 100]
    buf.max_bytes = 50  # between frames (after a hello)
    with pytest.raises(FrameError, match="51 bytes is over 50"):
        _read_in_place(buf, frame(b"x" * 51)[:4], [1000])


def test_a_buffer_grown_for_a_huge_frame_is_let_go_after_it() -> None:
    huge = peersock.READ_BUFFER_KEEP_MAX_BYTES + 1
    buf = FrameBuffer(huge)
    assert _read_in_place(buf, frame(b"h" * huge), [1 << 20]) == [b"h" * huge]
    assert len(buf.get_buffer()) == peersock.READ_BUFFER_BYTES
    # A frame a little over the read buffer grows it and keeps it (room for the next ones).
    size = peersock.READ_BUFFER_BYTES + 10
    assert _read_in_place(buf, frame(b"k" * size) * 2, [1 << 20]) == [b"k" * size] * 2
    assert len(buf.get_buffer()) >= 2 * size


def test_a_hello_round_trips_and_every_malformed_one_is_a_frame_error() -> None:
    hello = encode_hello(1, GROUP, PEER)
    assert decode_hello(hello) == peersock.Hello(1, GROUP, PEER)
    bad = {
        "wrong magic": b"XXXX" + hello[4:],
        "garbage": os.urandom(3),
        "truncated group": hello[:8],
        "truncated from": hello[:-1],
        "trailing bytes": hello + b"\0",
        "not UTF-8": encode_hello(1, "g", "n")[:-1] + b"\xff",
    }
    for what, payload in bad.items():
        with pytest.raises(FrameError):
            decode_hello(payload)
        assert what


def test_an_answer_with_an_unknown_code_is_a_frame_error() -> None:
    assert decode_answer(peersock.encode_answer(ANSWER_REFUSED, "no")).reason == "no"
    with pytest.raises(FrameError):
        decode_answer(peersock.ANSWER_MAGIC + b"\x00\x01\x09")


# ---------------------------------------------------------------------- the receiving side


class FakeNode:
    """What the socket's receiving side reads of a node."""

    def __init__(self, tls: TlsFiles | None = None, removed: frozenset[str] = frozenset()):
        self.cfg = SimpleNamespace(group=GROUP, self_id=SELF, tls=tls)
        self.removed = removed
        self.messages: list[tuple[str, pb.PeerMessage]] = []
        # What the socket read in place (large appends: peerwire.decode_append).
        self.in_place: list[tuple[str, Message]] = []
        self.drops: dict[str, int] = {}

    def accepts_peer(self, node_id: str) -> bool:
        return node_id != SELF and node_id not in self.removed and node_id.isalnum()

    def on_peer_message(self, sender: str, pm: pb.PeerMessage) -> None:
        self.messages.append((sender, pm))

    def on_peer_core_message(self, sender: str, m: Message) -> None:
        self.in_place.append((sender, m))

    def note_drop(self, reason: str, detail: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1


async def _serving(node: FakeNode, max_frame_bytes: int = 1 << 20) -> PeerSocketServer:
    server = PeerSocketServer(node, max_frame_bytes)  # type: ignore[arg-type]
    await server.bind("127.0.0.1", 0)
    await server.serve()
    return server


async def _wait(cond: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), WAIT_S), "big")
    return await asyncio.wait_for(reader.readexactly(size), WAIT_S)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the other end closed (EOF or reset) within WAIT_S, whatever it sent first."""
    try:
        async with asyncio.timeout(WAIT_S):
            while await reader.read(4096):
                pass
    except (ConnectionError, TimeoutError):
        return True
    return True


def _message(term: int) -> bytes:
    return pb.PeerMessage(
        timeout_now=pb.TimeoutNowRequest(group=GROUP, from_id=PEER, to_id=SELF, term=term)
    ).SerializeToString()


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def test_plaintext_an_accepted_link_delivers_its_messages_in_order_and_hears_acks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peersock, "LIVENESS_INTERVAL_S", 0.05)
    node = FakeNode()

    async def body() -> None:
        server = await _serving(node)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(frame(encode_hello(1, GROUP, PEER)))
        assert decode_answer(await _read_frame(reader)).code == ANSWER_ACCEPTED
        stream = b"".join(frame(_message(t)) for t in range(1, 6))
        writer.write(stream[:3])
        await writer.drain()
        writer.write(stream[3:])  # split inside a header, merged frames after
        await _wait(lambda: len(node.messages) == 5, "5 messages")
        assert [m.timeout_now.term for _, m in node.messages] == [1, 2, 3, 4, 5]
        assert {s for s, _ in node.messages} == {PEER}
        ack = pb.PeerAck.FromString(await _read_frame(reader))
        assert ack.received == 5
        writer.close()
        await server.stop()

    run(body)
    assert node.drops == {}


def _large_append(k: int) -> AppendRequest:
    bodies = [bytes([k]) * (20_000 + i) for i in range(3)]
    entries = tuple(Entry(2, k * 3 + i + 1, b, 0) for i, b in enumerate(bodies))
    return AppendRequest(PEER, SELF, 2, k * 3, 2 if k else 0, entries, k)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_large_appends_are_read_in_place_small_messages_by_the_runtime(loop: str) -> None:
    node = FakeNode()
    appends = [_large_append(k) for k in range(4)]

    async def body() -> None:
        server = await _serving(node)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(frame(encode_hello(1, GROUP, PEER)))
        assert decode_answer(await _read_frame(reader)).code == ANSWER_ACCEPTED
        stream = b"".join(frame(peerwire.encode(m, GROUP)) + frame(_message(1)) for m in appends)
        for at in range(0, len(stream), 7001):  # frames split and merged
            writer.write(stream[at : at + 7001])
            await writer.drain()
        await _wait(lambda: len(node.messages) == 4, "4 small messages")
        await _wait(lambda: len(node.in_place) == 4, "4 appends")
        writer.close()
        await server.stop()

    if loop == "uvloop":
        uvloop.run(body())
    else:
        run(body)
    assert node.in_place == [(PEER, m) for m in appends]
    assert node.drops == {}


@pytest.mark.parametrize(
    ("group", "sender"),
    [("other-group", PEER), (GROUP, SELF), (GROUP, "gone"), (GROUP, "x" * 200), (GROUP, "")],
)
def test_plaintext_claims_are_refused_like_the_streams(group: str, sender: str) -> None:
    node = FakeNode(removed=frozenset({"gone"}))

    async def body() -> None:
        server = await _serving(node)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(frame(encode_hello(1, group, sender)))
        writer.write(frame(_message(1)))  # never delivered
        answer = decode_answer(await _read_frame(reader))
        assert answer.code == ANSWER_REFUSED
        assert "of group 'g0'" in answer.reason
        assert await _closed(reader)
        writer.close()
        await server.stop()

    run(body)
    assert node.messages == []
    assert node.drops == {DROP_STREAM_REFUSED: 1}


def test_a_future_version_gets_a_version_answer_not_a_misparse() -> None:
    node = FakeNode()

    async def body() -> None:
        server = await _serving(node)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(frame(encode_hello(peersock.MAX_PROTOCOL_VERSION + 1, GROUP, PEER)))
        answer = decode_answer(await _read_frame(reader))
        assert answer.code == ANSWER_VERSION
        assert await _closed(reader)
        writer.close()
        await server.stop()

    run(body)
    assert node.messages == []


@pytest.mark.parametrize(
    ("what", "after_hello", "reason"),
    [
        ("garbage hello", None, peersock.DROP_SOCKET_HANDSHAKE),
        ("oversize frame", frame(b"x" * 101)[:8], peersock.DROP_SOCKET_BAD_FRAME),
        ("no PeerMessage", frame(b"\xff\xff\xff"), peersock.DROP_SOCKET_BAD_FRAME),
    ],
)
def test_bad_frames_close_the_connection_and_are_counted(
    what: str, after_hello: bytes | None, reason: str
) -> None:
    node = FakeNode()

    async def body() -> None:
        server = await _serving(node, max_frame_bytes=100)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        if after_hello is None:
            writer.write(frame(b"GET / HTTP/1.1\r\n"))
        else:
            writer.write(frame(encode_hello(1, GROUP, PEER)))
            assert decode_answer(await _read_frame(reader)).code == ANSWER_ACCEPTED
            writer.write(frame(_message(1)))
            await _wait(lambda: len(node.messages) == 1, "the good message")
            writer.write(after_hello + frame(_message(2)))
        assert await _closed(reader)
        writer.close()
        await server.stop()

    run(body)
    assert node.drops == {reason: 1}, what
    assert [m.timeout_now.term for _, m in node.messages] == ([1] if after_hello else [])


def test_a_truncated_handshake_is_closed_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peersock, "HANDSHAKE_TIMEOUT_S", 0.1)
    node = FakeNode()

    async def body() -> None:
        server = await _serving(node)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(frame(encode_hello(1, GROUP, PEER))[:9])
        assert await _closed(reader)
        assert server.pending == 0
        writer.close()
        await server.stop()

    run(body)
    assert node.drops == {peersock.DROP_SOCKET_HANDSHAKE: 1}


def test_connections_without_a_hello_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peersock, "MAX_PENDING_CONNECTIONS", 2)
    node = FakeNode()

    async def body() -> None:
        server = await _serving(node)
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        await _wait(lambda: server.pending == 2, "2 pending")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _closed(reader)
        for _, w in [*idle, (reader, writer)]:
            w.close()
        await server.stop()

    run(body)
    assert node.drops == {peersock.DROP_SOCKET_OVERFLOW: 1}


def test_a_newer_connection_of_a_sender_replaces_its_older_one() -> None:
    node = FakeNode()

    async def body() -> None:
        server = await _serving(node)
        first_r, first_w = await asyncio.open_connection("127.0.0.1", server.port)
        first_w.write(frame(encode_hello(1, GROUP, PEER)))
        assert decode_answer(await _read_frame(first_r)).code == ANSWER_ACCEPTED
        second_r, second_w = await asyncio.open_connection("127.0.0.1", server.port)
        second_w.write(frame(encode_hello(1, GROUP, PEER)))
        assert decode_answer(await _read_frame(second_r)).code == ANSWER_ACCEPTED
        assert await _closed(first_r)
        assert len(server.by_sender) == 1
        first_w.close()
        second_w.close()
        await server.stop()

    run(body)


# ---------------------------------------------------------------------- mutual TLS


@pytest.fixture(scope="module")
def pki_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    root = str(tmp_path_factory.mktemp("pki"))
    ca = pki.create_authority(root)
    return {
        "self": pki.issue_member(ca, root, GROUP, SELF, ["127.0.0.1"]),
        "peer": pki.issue_member(ca, root, GROUP, PEER, ["127.0.0.1"]),
        "other-group": pki.issue_member(ca, root, "g9", PEER, ["127.0.0.1"]),
        "client": pki.issue_client(ca, root, "tool"),
        "stranger-ca": pki.issue_member(
            pki.create_authority(os.path.join(root, "other")),
            os.path.join(root, "other"),
            GROUP,
            PEER,
            ["127.0.0.1"],
        ),
    }


async def _tls_hello(port: int, files: TlsFiles, ca: TlsFiles, claim: str) -> int | None:
    """The answer's code to a hello claiming ``claim`` over TLS with ``files`` (None: the TLS
    handshake itself failed)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert files.cert_path and files.key_path and ca.ca_path
    context.load_cert_chain(files.cert_path, files.key_path)
    context.load_verify_locations(ca.ca_path)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(frame(encode_hello(1, GROUP, claim)))
        code = decode_answer(await _read_frame(reader)).code
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        return None
    writer.close()
    return code


def test_tls_only_a_member_certificate_of_this_group_gets_in(
    pki_files: dict[str, TlsFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peersock, "HANDSHAKE_TIMEOUT_S", 0.5)
    node = FakeNode(tls=pki_files["self"])
    before = REFUSALS.snapshot()
    got: dict[str, int | None] = {}

    async def body() -> None:
        server = await _serving(node)
        own = pki_files["self"]
        got["member"] = await _tls_hello(server.port, pki_files["peer"], own, PEER)
        got["lie"] = await _tls_hello(server.port, pki_files["peer"], own, "n2")
        got["other-group"] = await _tls_hello(server.port, pki_files["other-group"], own, PEER)
        got["client"] = await _tls_hello(server.port, pki_files["client"], own, PEER)
        got["self"] = await _tls_hello(server.port, pki_files["self"], own, SELF)
        got["stranger-ca"] = await _tls_hello(server.port, pki_files["stranger-ca"], own, PEER)
        await _wait(
            lambda: REFUSALS.snapshot()[TLS_HANDSHAKE] > before[TLS_HANDSHAKE],
            "the failed handshake counted",
        )
        await server.stop()

    run(body)
    assert got == {
        "member": ANSWER_ACCEPTED,
        "lie": ANSWER_REFUSED,
        "other-group": ANSWER_REFUSED,
        "client": ANSWER_REFUSED,
        "self": ANSWER_REFUSED,
        "stranger-ca": None,  # the TLS handshake refuses it: no hello is read
    }
    after = REFUSALS.snapshot()
    assert after[PEER_IDENTITY] - before[PEER_IDENTITY] == 1
    assert after[PEER_CERTIFICATE] - before[PEER_CERTIFICATE] == 3
    assert after[TLS_HANDSHAKE] - before[TLS_HANDSHAKE] == 1  # as the peer port counts them
    assert node.drops == {}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_over_tls_a_links_appends_arrive_whole_and_are_read_in_place(
    pki_files: dict[str, TlsFiles], loop: str
) -> None:
    """Under TLS the link writes an append as its head and the joined entries (two records'
    worth of writes); the receiving side reads the decrypted bytes into its buffer."""
    node = FakeNode(tls=pki_files["self"])
    appends = [_large_append(k) for k in range(4)]

    async def body() -> None:
        server = await _serving(node)
        conn = await peersock.connect(
            "127.0.0.1",
            server.port,
            encode_hello(1, GROUP, PEER),
            peersock.client_context(pki_files["peer"]),
        )
        security = SimpleNamespace(tls=pki_files["peer"])
        links = PeerTransport(GROUP, PEER, "127.0.0.1:2", {SELF: "127.0.0.1:1"}, security)  # type: ignore[arg-type]
        for m in appends:
            links.links[SELF]._write(conn, m)
        links.links[SELF]._write(conn, TimeoutNow(PEER, SELF, 1))
        await _wait(lambda: len(node.in_place) == 4 and len(node.messages) == 1, "all 5")
        assert conn.transport is not None
        conn.transport.abort()
        await server.stop()

    if loop == "uvloop":
        uvloop.run(body())
    else:
        run(body)
    assert node.in_place == [(PEER, m) for m in appends]
    assert node.drops == {}


# ---------------------------------------------------------------------- the link's choice


class _StreamOnly(grpc.GenericRpcHandler):
    """A peer of an older release: the Stream RPC, no PeerSocket (UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.received: list[pb.PeerMessage] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != STREAM_METHOD:
            return None

        async def stream(requests: AsyncIterator[pb.PeerMessage], context: Any) -> pb.PeerAck:
            async for pm in requests:
                batch = pm.batch.messages if pm.WhichOneof("kind") == "batch" else [pm]
                self.received.extend(batch)
            return pb.PeerAck()

        return grpc.stream_unary_rpc_method_handler(
            stream,
            request_deserializer=pb.PeerMessage.FromString,
            response_serializer=pb.PeerAck.SerializeToString,
        )


class _Offering(grpc.GenericRpcHandler):
    """A peer of this release: answers PeerSocket with its socket's port."""

    def __init__(self, port: int) -> None:
        self.port = port

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if not details.method.endswith("/PeerSocket"):
            return None

        async def ask(request: pb.PeerSocketRequest, context: Any) -> pb.PeerSocketInfo:
            return pb.PeerSocketInfo(port=self.port, max_version=peersock.MAX_PROTOCOL_VERSION)

        return grpc.unary_unary_rpc_method_handler(
            ask,
            request_deserializer=pb.PeerSocketRequest.FromString,
            response_serializer=pb.PeerSocketInfo.SerializeToString,
        )


async def _grpc_server(handler: grpc.GenericRpcHandler) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=SERVER_OPTIONS)  # the peer port's (keepalive pings)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def test_a_link_to_an_older_peer_falls_back_to_the_grpc_stream() -> None:
    handler = _StreamOnly()

    async def body() -> None:
        server, port = await _grpc_server(handler)
        link = PeerLink(GROUP, PEER, "127.0.0.1:1", SELF, f"127.0.0.1:{port}")
        link.start()
        for term in (1, 2, 3):
            link.send(TimeoutNow(PEER, SELF, term))
        await _wait(lambda: len(handler.received) == 3, "3 messages over the stream")
        assert link.stats.carrier == "stream"
        await link.stop()
        await server.stop(None)

    run(body)
    assert [m.timeout_now.term for m in handler.received] == [1, 2, 3]


def test_a_link_to_a_peer_offering_its_socket_uses_it() -> None:
    node = FakeNode()

    async def body() -> None:
        sock = await _serving(node)
        server, port = await _grpc_server(_Offering(sock.port))
        link = PeerLink(GROUP, PEER, "127.0.0.1:1", SELF, f"127.0.0.1:{port}")
        link.start()
        link.send(TimeoutNow(PEER, SELF, 1))  # queued while it connects
        await _wait(lambda: link.stats.carrier == "socket", "the socket")
        link.send(TimeoutNow(PEER, SELF, 2))  # written at once
        await _wait(lambda: len(node.messages) == 2, "2 messages over the socket")
        await link.stop()
        await server.stop(None)
        await sock.stop()

    run(body)
    assert [m.timeout_now.term for _, m in node.messages] == [1, 2]


def test_a_link_with_the_socket_off_never_asks(tmp_path: Path) -> None:
    handler = _StreamOnly()

    async def body() -> None:
        server, port = await _grpc_server(handler)
        link = PeerLink(
            GROUP, PEER, "127.0.0.1:1", SELF, f"127.0.0.1:{port}", ClientSecurity(), False
        )
        link.start()
        link.send(TimeoutNow(PEER, SELF, 1))
        await _wait(lambda: len(handler.received) == 1, "the message over the stream")
        assert link.stats.carrier == "stream"
        await link.stop()
        await server.stop(None)

    run(body)


def test_a_message_to_a_socket_the_peer_just_closed_is_dropped_not_a_crash() -> None:
    """Under uvloop (the nodes' loop) a write to a closed transport raises: a Ready sending to
    a peer whose connection had closed before the link's watch woke ended the process."""
    node = FakeNode()
    raised: list[BaseException] = []

    def send_now(link: PeerLink) -> None:
        try:
            for term in range(10):
                link.send(TimeoutNow(PEER, SELF, term))
        except BaseException as exc:
            raised.append(exc)

    async def body() -> None:
        sock = await _serving(node)
        server, port = await _grpc_server(_Offering(sock.port))
        link = PeerLink(GROUP, PEER, "127.0.0.1:1", SELF, f"127.0.0.1:{port}")
        link.start()
        await _wait(lambda: link.stats.carrier == "socket", "the socket")
        conn = link._conn
        assert conn is not None
        # Runs as the connection closes, before the link's task can notice.
        conn.closed.add_done_callback(lambda _: send_now(link))
        await sock.stop()  # closes the link's connection from the peer's side
        await _wait(lambda: conn.closed.done(), "the close")
        await asyncio.sleep(0)
        assert link.stats.dropped >= 10
        await link.stop()
        await server.stop(None)

    uvloop.run(body())
    assert raised == []


# ---------------------------------------------------------------------- writing appends


class _Recorder:
    """A connection's transport that keeps what each write was given."""

    def __init__(self) -> None:
        self.writes: list[tuple[bytes, ...]] = []

    def write(self, data: bytes) -> None:
        self.writes.append((data,))

    def writelines(self, parts: Any) -> None:
        self.writes.append(tuple(parts))


def _written_message(parts: tuple[bytes, ...]) -> pb.PeerMessage:
    (payload,) = FrameReader(1 << 24).feed(b"".join(parts))
    return pb.PeerMessage.FromString(payload)


@pytest.mark.parametrize("tls", [False, True])
def test_followers_appends_share_one_encoding_of_their_entries(tls: bool) -> None:
    """Each follower's frame is its own head, then the entries' one encoding: in plaintext the
    bodies themselves (no copy), under TLS one joined copy for all."""
    security = SimpleNamespace(tls=object() if tls else None)
    peers = {"n1": "127.0.0.1:1", "n2": "127.0.0.1:2", SELF: "127.0.0.1:3"}
    transport = PeerTransport(GROUP, SELF, "127.0.0.1:3", peers, security)  # type: ignore[arg-type]
    entries = _large_append(1).entries
    sent: dict[str, tuple[bytes, ...]] = {}
    for peer, prev in (("n1", 3), ("n2", 4)):  # n2 holds the first entry already
        m = AppendRequest(SELF, peer, 2, prev, 2, entries[prev - 3 :], 3)
        recorder = _Recorder()
        link = transport.links[peer]
        link._write(SimpleNamespace(transport=recorder), m)  # type: ignore[arg-type]
        (sent[peer],) = recorder.writes
        assert _written_message(sent[peer]) == to_pb(m, GROUP)
    # n2's entries are not n1's: encoded anew.
    assert transport.entries.encoded == 2
    m3 = AppendRequest(SELF, "n2", 2, 4, 2, entries[1:], 3, no_reply=True)
    recorder = _Recorder()
    transport.links["n2"]._write(SimpleNamespace(transport=recorder), m3)  # type: ignore[arg-type]
    (again,) = recorder.writes
    assert _written_message(again) == to_pb(m3, GROUP)
    assert transport.entries.reused == 1
    assert all(a is b for a, b in zip(again[1:], sent["n2"][1:], strict=True))
    if tls:
        assert len(again) == 2
    else:
        bodies = [p for p in again if len(p) >= 20_000]
        assert [id(b) for b in bodies] == [id(e.body) for e in entries[1:]]


def test_small_messages_and_heartbeats_are_one_write() -> None:
    transport = PeerTransport(GROUP, SELF, "127.0.0.1:3", {"n1": "127.0.0.1:1"})
    recorder = _Recorder()
    for m in (TimeoutNow(SELF, "n1", 2), AppendRequest(SELF, "n1", 2, 5, 2, (), 5)):
        transport.links["n1"]._write(SimpleNamespace(transport=recorder), m)  # type: ignore[arg-type]
        assert _written_message(recorder.writes[-1]) == to_pb(m, GROUP)
    assert [len(w) for w in recorder.writes] == [1, 1]
    assert transport.entries.encoded == 0
