"""The bundled clients speak TLS and sign every call: ``ChannelPool(security)`` against a real
gRPC server on 127.0.0.1 whose certificate comes from ``mqsecurity.pki``, and every client
class hands its ``security`` to its pool."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from client import MQAdmin, Producer, PullConsumer, PushConsumer
from client.route import ChannelPool
from mqsecurity import pki
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials
from mqsecurity.tls import TlsFiles, server_credentials

CREDS = Credentials("admin", "s3cret-key-for-tests")
METHOD = "/x.Echo/Call"


class _Echo(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers any unary call with its authorization header and the transport it came over."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            meta = dict(context.invocation_metadata())
            transport = context.auth_context().get("transport_security_type", [b"none"])[0]
            return f"{meta.get('authorization', '-')}|{transport.decode()}".encode()

        return grpc.unary_unary_rpc_method_handler(answer)


@pytest.fixture
def tls_server(tmp_path):
    """A TLS server (no client certificate required, as a broker's client port) and the CA."""
    ca = pki.create_authority(str(tmp_path / "ca"))
    files = pki.issue_member(ca, str(tmp_path / "ca"), "broker-a", "n0", ["127.0.0.1"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([_Echo()])
    port = server.add_secure_port("127.0.0.1:0", server_credentials(files, False))
    server.start()
    other = pki.create_authority(str(tmp_path / "other"))
    try:
        yield f"127.0.0.1:{port}", ca.cert_path, other.cert_path
    finally:
        server.stop(None)


def _call(pool: ChannelPool, addr: str, timeout_s: float) -> str:
    answer: bytes = pool.get(addr).unary_unary(METHOD)(b"", timeout=timeout_s)
    return answer.decode()


def test_pool_speaks_tls_and_signs_every_call(tls_server) -> None:
    addr, ca_path, _ = tls_server
    pool = ChannelPool(ClientSecurity(tls=TlsFiles(ca_path=ca_path), credentials=CREDS))
    try:
        for _ in range(2):  # the second call on the cached channel is signed afresh too
            header, transport = _call(pool, addr, 10).split("|")
            assert header.startswith("MQv2-HMAC-SHA1 Credential=admin, ")
            assert "SignedHeaders=x-mq-date-time, Signature=" in header
            assert transport == "ssl"
        assert pool.get(addr) is pool.get(addr)  # one channel per address
    finally:
        pool.close()


def test_pool_with_a_wrong_ca_or_plaintext_fails(tls_server) -> None:
    addr, _, other_ca = tls_server
    for security in (ClientSecurity(tls=TlsFiles(ca_path=other_ca), credentials=CREDS), PLAINTEXT):
        pool = ChannelPool(security)
        try:
            with pytest.raises(grpc.RpcError) as err:
                _call(pool, addr, 3)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            pool.close()


def test_every_client_hands_its_security_to_its_channels() -> None:
    security = ClientSecurity(tls=TlsFiles(ca_path="/nonexistent/ca.crt"), credentials=CREDS)
    producer = Producer("pg", "127.0.0.1:9876", security=security)
    pull = PullConsumer("cg", "127.0.0.1:9876", security)
    push = PushConsumer("cg", "127.0.0.1:9876", security=security)
    admin = MQAdmin("127.0.0.1:9876", security)
    assert producer._channels.security is security
    assert pull._channels.security is security
    assert push._channels.security is security
    assert admin._pool().security is security
    # Today's callers, with no security argument, keep plaintext.
    assert Producer("pg", "127.0.0.1:9876")._channels.security is PLAINTEXT
    assert MQAdmin("127.0.0.1:9876")._pool().security is PLAINTEXT
