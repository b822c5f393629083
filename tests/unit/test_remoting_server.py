"""The remoting server and client (remoting/server.py, connection.py, client.py) on 127.0.0.1:
concurrent answers by opaque, oneway requests, the server asking the client, malformed frames
closing one connection only, and every connection bound (in flight, count, idle)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import pytest

from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import (
    ConnectionClosedError,
    RemotingConnection,
    RequestTimeoutError,
    ServerLimits,
)
from remoting.protocol import (
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCommand,
    encode_frame,
)
from remoting.server import RemotingServer, not_supported

# Every wait in these tests is bounded by this.
DEADLINE_S = 10.0

Handler = Callable[[RemotingCommand, RemotingConnection], Awaitable[RemotingCommand | None]]


async def _echo(request: RemotingCommand, _conn: RemotingConnection) -> RemotingCommand | None:
    return request.response(ResponseCode.SUCCESS, ext_fields=request.ext_fields, body=request.body)


async def _serve(handler: Handler, limits: ServerLimits | None = None) -> RemotingServer:
    server = RemotingServer(handler, limits=limits)
    await server.start("127.0.0.1", 0)
    return server


async def _until(condition: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _request(code: int = 105, **fields: str) -> RemotingCommand:
    return RemotingCommand(code=code, opaque=0, ext_fields=fields)


def test_answers_come_back_by_opaque_while_slow_requests_wait() -> None:
    """A slow request does not hold up the ones behind it on the same connection."""

    async def handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        if request.ext_fields.get("slow"):
            await release.wait()
        return await _echo(request, conn)  # type: ignore[return-value]

    async def main() -> None:
        server = await _serve(handler)
        async with await RemotingClient.connect("127.0.0.1", server.port) as client:
            slow = asyncio.create_task(client.request(_request(slow="1", n="slow"), DEADLINE_S))
            fast = await asyncio.gather(
                *(client.request(_request(n=str(i)), DEADLINE_S) for i in range(50))
            )
            assert [a.ext_fields["n"] for a in fast] == [str(i) for i in range(50)]
            assert not slow.done()
            release.set()
            assert (await slow).ext_fields["n"] == "slow"
        await server.stop()

    release = asyncio.Event()
    asyncio.run(main())


def test_the_answer_uses_the_request_serialize_type_and_opaque() -> None:
    async def main() -> None:
        server = await _serve(_echo)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        request = RemotingCommand(
            code=105, opaque=4242, serialize_type=SERIALIZE_ROCKETMQ, language="JAVA"
        )
        writer.write(encode_frame(request))
        decoder = FrameDecoder()
        answers: list[RemotingCommand] = []
        while not answers:
            answers += decoder.feed(await asyncio.wait_for(reader.read(4096), DEADLINE_S))
        assert answers[0].opaque == 4242 and answers[0].is_response
        assert answers[0].serialize_type == SERIALIZE_ROCKETMQ
        writer.close()
        await server.stop()

    asyncio.run(main())


def test_oneway_requests_get_no_answer() -> None:
    async def handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        seen.append(request.code)
        return request.response(ResponseCode.SUCCESS)

    async def main() -> None:
        server = await _serve(handler)
        async with await RemotingClient.connect("127.0.0.1", server.port) as client:
            client.oneway(_request(RequestCode.UNREGISTER_CLIENT))
            await _until(lambda: seen == [RequestCode.UNREGISTER_CLIENT])
            answer = await client.request(_request(), DEADLINE_S)  # the next answer is its own
            assert answer.code == ResponseCode.SUCCESS
            assert client.connection.stats.unmatched_responses == 0
        await server.stop()

    seen: list[int] = []
    asyncio.run(main())


def test_the_server_asks_the_client_and_awaits_its_answer() -> None:
    """What CHECK_TRANSACTION_STATE needs: a handler sends a request back over the
    connection and gets the client's answer."""

    async def server_handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        check = RemotingCommand(code=RequestCode.CHECK_TRANSACTION_STATE, opaque=0)
        answer = await conn.request(check, DEADLINE_S)
        return request.response(ResponseCode.SUCCESS, remark=answer.remark)

    async def client_handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, remark=f"checked {request.code}")

    async def main() -> None:
        server = await _serve(server_handler)
        client = await RemotingClient.connect("127.0.0.1", server.port, handler=client_handler)
        answer = await client.request(_request(), DEADLINE_S)
        assert answer.remark == "checked 39"
        await client.close()
        await server.stop()

    asyncio.run(main())


def test_a_handler_error_is_answered_system_error_and_counted() -> None:
    async def handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        raise RuntimeError("boom")

    async def main() -> None:
        server = await _serve(handler)
        async with await RemotingClient.connect("127.0.0.1", server.port) as client:
            answer = await client.request(_request(), DEADLINE_S)
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert "RuntimeError" in (answer.remark or "")
        assert server.stats.handler_errors == 1
        await server.stop()

    asyncio.run(main())


def test_an_unknown_code_is_refused_with_a_remark() -> None:
    async def handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return not_supported(request)

    async def main() -> None:
        server = await _serve(handler)
        async with await RemotingClient.connect("127.0.0.1", server.port) as client:
            answer = await client.request(_request(code=12345), DEADLINE_S)
        assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert answer.remark == "request code 12345 (12345) is not supported"
        await server.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    "junk",
    [
        struct.pack(">i", 1 << 30),  # an oversized length
        struct.pack(">iI", 8, 4) + b"{[}]",  # a header that is not JSON
        b"GET / HTTP/1.1\r\n\r\n",  # another protocol
    ],
)
def test_a_malformed_client_is_closed_without_disturbing_another(junk: bytes) -> None:
    async def main() -> None:
        server = await _serve(_echo)
        good = await RemotingClient.connect("127.0.0.1", server.port)
        assert (await good.request(_request(n="1"), DEADLINE_S)).ext_fields["n"] == "1"
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(junk)
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # closed, no answer
        assert server.stats.malformed_frames == 1
        assert (await good.request(_request(n="2"), DEADLINE_S)).ext_fields["n"] == "2"
        assert len(server.connections) == 1
        writer.close()
        await good.close()
        await server.stop()

    asyncio.run(main())


def test_requests_past_the_in_flight_limit_are_answered_busy() -> None:
    async def handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        await release.wait()
        return request.response(ResponseCode.SUCCESS)

    async def main() -> None:
        server = await _serve(handler, ServerLimits(max_in_flight_per_connection=3))
        async with await RemotingClient.connect("127.0.0.1", server.port) as client:
            held = [asyncio.create_task(client.request(_request(), DEADLINE_S)) for _ in range(3)]
            await _until(lambda: sum(c.in_flight for c in server.connections) == 3)
            busy = await client.request(_request(), DEADLINE_S)
            assert busy.code == ResponseCode.SYSTEM_BUSY and "3 requests" in (busy.remark or "")
            release.set()
            assert [a.code for a in await asyncio.gather(*held)] == [0, 0, 0]
        assert server.stats.busy_refusals == 1
        await server.stop()

    release = asyncio.Event()
    asyncio.run(main())


def test_connections_past_the_limit_are_closed() -> None:
    async def main() -> None:
        server = await _serve(_echo, ServerLimits(max_connections=2))
        clients = [await RemotingClient.connect("127.0.0.1", server.port) for _ in range(2)]
        await _until(lambda: len(server.connections) == 2)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        assert server.connections_refused == 1
        for client in clients:
            assert (await client.request(_request(), DEADLINE_S)).code == 0
            await client.close()
        writer.close()
        await server.stop()

    asyncio.run(main())


def test_an_idle_connection_is_closed_and_a_busy_one_is_not() -> None:
    async def handler(request: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        await release.wait()
        return request.response(ResponseCode.SUCCESS)

    async def main() -> None:
        server = await _serve(handler, ServerLimits(idle_timeout_s=0.2))
        idle = await RemotingClient.connect("127.0.0.1", server.port)
        busy = await RemotingClient.connect("127.0.0.1", server.port)
        waiting = asyncio.create_task(busy.request(_request(), DEADLINE_S))
        await _until(lambda: idle.closed)
        assert server.stats.idle_closed >= 1
        assert not busy.closed  # a request in flight (a long poll) is not idleness
        release.set()
        assert (await waiting).code == ResponseCode.SUCCESS
        await busy.close()
        await server.stop()

    release = asyncio.Event()
    asyncio.run(main())


def test_a_request_times_out_and_a_closed_connection_fails_its_requests() -> None:
    async def handler(request: RemotingCommand, conn: RemotingConnection) -> None:
        await asyncio.Event().wait()  # never answers

    async def main() -> None:
        server = await _serve(handler)
        client = await RemotingClient.connect("127.0.0.1", server.port)
        with pytest.raises(RequestTimeoutError, match="no answer"):
            await client.request(_request(), 0.05)
        waiting = asyncio.create_task(client.request(_request(), DEADLINE_S))
        await _until(lambda: sum(c.in_flight for c in server.connections) == 2)
        await server.stop()
        with pytest.raises(ConnectionClosedError):
            await waiting
        with pytest.raises(ConnectionClosedError):
            await client.request(_request(), DEADLINE_S)
        await client.close()

    asyncio.run(main())


def test_a_taken_port_fails_to_start() -> None:
    async def main() -> None:
        server = await _serve(_echo)
        other = RemotingServer(_echo)
        with pytest.raises(OSError):
            await other.start("127.0.0.1", server.port)
        await server.stop()

    asyncio.run(main())
