"""decodeguard: undecodable request bytes are answered INVALID_ARGUMENT ``BAD_REQUEST`` with a
rate-limited log line, for every kind of method, instead of UNKNOWN and a traceback each."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.common.v1 import error_pb2

from broker.frontends.v1.service import BrokerServicer
from rpckit import decodeguard, status

JUNK = b"\xff\xff\xff\xff"  # field 31, wire type 7: not protobuf
GOOD = pb.GetTopicRequest(topic="T").SerializeToString()
ANSWER = pb.GetTopicResponse(topic=pb.TopicConfig(topic_name="T"))
TYPE = "raftmq.broker.v1.GetTopicRequest"


async def _uu(request: pb.GetTopicRequest, context: Any) -> pb.GetTopicResponse:
    assert isinstance(request, pb.GetTopicRequest)
    return ANSWER


async def _us(request: pb.GetTopicRequest, context: Any) -> AsyncIterator[pb.GetTopicResponse]:
    assert isinstance(request, pb.GetTopicRequest)
    yield ANSWER
    yield ANSWER


async def _su(requests: AsyncIterator[pb.GetTopicRequest], context: Any) -> pb.GetTopicResponse:
    async for r in requests:
        assert isinstance(r, pb.GetTopicRequest)
    return ANSWER


async def _ss(
    requests: AsyncIterator[pb.GetTopicRequest], context: Any
) -> AsyncIterator[pb.GetTopicResponse]:
    async for r in requests:
        assert isinstance(r, pb.GetTopicRequest)
        yield ANSWER


def _handlers() -> dict[str, grpc.RpcMethodHandler]:
    de, ser = pb.GetTopicRequest.FromString, pb.GetTopicResponse.SerializeToString
    return {
        "UU": grpc.unary_unary_rpc_method_handler(_uu, de, ser),
        "US": grpc.unary_stream_rpc_method_handler(_us, de, ser),
        "SU": grpc.stream_unary_rpc_method_handler(_su, de, ser),
        "SS": grpc.stream_stream_rpc_method_handler(_ss, de, ser),
    }


async def _serve(register: Callable[[grpc.aio.Server], object]) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


async def _stream(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


def test_every_kind_of_method_refuses_junk_and_serves_good_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        guarded = {m: decodeguard.guard_handler(h, f"/t.S/{m}") for m, h in _handlers().items()}
        server, addr = await _serve(
            lambda s: s.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler("t.S", guarded),)
            )
        )
        try:
            async with grpc.aio.insecure_channel(addr) as ch:
                de = pb.GetTopicResponse.FromString
                uu = ch.unary_unary("/t.S/UU", response_deserializer=de)
                us = ch.unary_stream("/t.S/US", response_deserializer=de)
                su = ch.stream_unary("/t.S/SU", response_deserializer=de)
                ss = ch.stream_stream("/t.S/SS", response_deserializer=de)
                assert await uu(GOOD) == ANSWER
                assert [r async for r in us(GOOD)] == [ANSWER, ANSWER]
                assert await su(_stream(GOOD, GOOD)) == ANSWER
                assert [r async for r in ss(_stream(GOOD, GOOD))] == [ANSWER, ANSWER]
                calls: list[Callable[[], Awaitable[Any]]] = [
                    lambda: uu(JUNK),
                    lambda: _collect(us(JUNK)),
                    lambda: su(_stream(GOOD, JUNK)),
                    lambda: _collect(ss(_stream(GOOD, JUNK))),
                ]
                for call in calls:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call()
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert err.value.details() == f"BAD_REQUEST undecodable {TYPE}"
                    info = status.read_error(err.value)
                    assert info is not None and info.code == "BAD_REQUEST", info
        finally:
            await server.stop(None)

    caplog.set_level(logging.WARNING)
    _run(body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def _collect(stream: Any) -> list[Any]:
    return [r async for r in stream]


def test_the_broker_service_refuses_undecodable_requests_with_one_log_line() -> None:
    """Finding: undecodable bytes gave UNKNOWN and an ERROR traceback per request."""
    servicer = object.__new__(BrokerServicer)  # register() needs nothing else

    async def body() -> None:
        server, addr = await _serve(servicer.register)
        try:
            async with grpc.aio.insecure_channel(addr) as ch:
                send = ch.unary_unary("/raftmq.broker.v1.Broker/SendMessage")
                for _ in range(20):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await send(JUNK)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert err.value.details() == (
                        "BAD_REQUEST undecodable raftmq.broker.v1.SendMessageRequest"
                    )
        finally:
            await server.stop(None)

    # A handler of its own on the module's logger: what earlier tests in the same process did
    # to the root logger's handlers or levels (pyspark, for one) cannot hide the line.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    decodeguard.logger.addHandler(handler)
    decodeguard.logger.disabled = False
    old_level = decodeguard.logger.level
    decodeguard.logger.setLevel(logging.INFO)
    decodeguard.REFUSALS._last_s = float("-inf")
    try:
        _run(body)
    finally:
        decodeguard.logger.removeHandler(handler)
        decodeguard.logger.setLevel(old_level)
    lines = [r for r in records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].getMessage().startswith("BAD_REQUEST undecodable request")


def test_sync_behaviors_are_guarded_too() -> None:
    calls: list[Any] = []

    def uu(request: Any, context: Any) -> str:
        calls.append(request)
        return "ok"

    class Aborted(Exception):
        pass

    class Context:
        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

        def set_trailing_metadata(self, metadata: Any) -> None:
            calls.append(dict(metadata))

        def abort(self, code: grpc.StatusCode, detail: str) -> None:
            calls.append((code, detail))
            raise Aborted

    h = decodeguard.guard_handler(
        grpc.unary_unary_rpc_method_handler(uu, pb.GetTopicRequest.FromString, None), "/t.S/UU"
    )
    assert h.unary_unary(h.request_deserializer(GOOD), Context()) == "ok"
    with pytest.raises(Aborted):
        h.unary_unary(h.request_deserializer(JUNK), Context())
    assert calls[-1] == (grpc.StatusCode.INVALID_ARGUMENT, f"BAD_REQUEST undecodable {TYPE}")
    trailer = status_pb2.Status.FromString(calls[-2][status.DETAILS_KEY])
    info = error_pb2.ErrorInfo()
    assert trailer.details[0].Unpack(info) and info.code == "BAD_REQUEST"
    assert not info.retryable and trailer.message == calls[-1][1]


def test_add_servicer_needs_registered_handlers() -> None:
    def old_style(servicer: object, server: Any) -> None:
        server.add_generic_rpc_handlers(())

    with pytest.raises(TypeError, match="registered no method handlers"):
        decodeguard.add_servicer(object(), old_style, object())
