"""mqsecurity: the RocketMQ 5 signature, credentials files, the local CA, and channels that
speak TLS and sign their calls, against a real gRPC server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from concurrent import futures
from datetime import UTC, datetime, timedelta

import grpc
import grpc.aio
import pytest

from mqsecurity import pki, signing
from mqsecurity.channels import ClientSecurity, open_aio_channel, open_channel
from mqsecurity.credentials import Credentials, load_credentials, save_credentials
from mqsecurity.errors import CertificateError, SecurityError, SignatureError
from mqsecurity.tls import TlsFiles, server_credentials

CREDS = Credentials("alice", "12345678")
WHEN = datetime(2026, 11, 24, 20, 15, 0, tzinfo=UTC)


def test_signature_matches_an_independent_hmac() -> None:
    # `printf 20261124T201500Z | openssl dgst -sha1 -hmac 12345678`
    assert signing.signature("12345678", "20261124T201500Z") == (
        "6c2be7eb66dbc60f374b976eb413f4ce88b79f47"
    )
    meta = dict(signing.signed_metadata(CREDS, WHEN))
    assert meta["x-mq-date-time"] == "20261124T201500Z"
    assert meta["authorization"] == (
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, "
        "Signature=6c2be7eb66dbc60f374b976eb413f4ce88b79f47"
    )


def test_a_signed_call_verifies_and_a_wrong_secret_does_not() -> None:
    request = signing.read_signed_request(dict(signing.signed_metadata(CREDS, WHEN)))
    assert request is not None and request.access_key == "alice"
    signing.check_signature(request, "12345678", now=WHEN + timedelta(seconds=30))
    with pytest.raises(SignatureError, match="does not match"):
        signing.check_signature(request, "87654321", now=WHEN)
    with pytest.raises(SignatureError, match="away from the server's clock"):
        signing.check_signature(request, "12345678", now=WHEN + timedelta(hours=1))


def test_old_credential_form_and_upper_case_hex_are_read() -> None:
    sig = signing.signature("12345678", "20261124T201500Z").upper()
    meta = {
        "x-mq-date-time": "20261124T201500Z",
        "authorization": f"MQv2-HMAC-SHA1 Credential=alice/region/rocketmq, "
        f"SignedHeaders=x-mq-date-time, Signature={sig}",
    }
    request = signing.read_signed_request(meta)
    assert request is not None and request.access_key == "alice"
    signing.check_signature(request, "12345678", now=WHEN)


@pytest.mark.parametrize(
    "header",
    [
        "Basic YWxpY2U6MTIzNDU2Nzg=",
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=host, Signature=" + "0" * 40,
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=abc",
        "MQv2-HMAC-SHA1 Credential="
        + "a" * 65
        + ", SignedHeaders=x-mq-date-time, Signature="
        + "0" * 40,
        "x" * 600,
    ],
)
def test_malformed_authorization_is_refused(header: str) -> None:
    with pytest.raises(SignatureError):
        signing.read_signed_request({"authorization": header, "x-mq-date-time": "20261124T201500Z"})


def test_anonymous_and_missing_date() -> None:
    assert signing.read_signed_request({}) is None
    header = dict(signing.signed_metadata(CREDS, WHEN))["authorization"]
    with pytest.raises(SignatureError, match="x-mq-date-time"):
        signing.read_signed_request({"authorization": header})


def test_credentials_never_show_the_secret_and_files_must_be_private(tmp_path) -> None:
    assert "12345678" not in repr(CREDS)
    path = str(tmp_path / "admin.json")
    save_credentials(path, CREDS)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert load_credentials(path) == CREDS
    os.chmod(path, 0o644)
    with pytest.raises(SecurityError, match="chmod 600"):
        load_credentials(path)
    with pytest.raises(SecurityError):
        Credentials("bad user!", "12345678")
    with pytest.raises(SecurityError):
        Credentials("alice", "short")


def test_member_certificates_carry_their_identity(tmp_path) -> None:
    ca = pki.create_authority(str(tmp_path))
    files = pki.issue_member(ca, str(tmp_path), "broker-a", "n1", ["127.0.0.1", "localhost"])
    assert files.cert_path is not None and files.key_path is not None
    assert os.stat(files.key_path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.join(tmp_path, "ca.key")).st_mode & 0o777 == 0o600
    with open(files.cert_path, "rb") as f:
        pem = f.read()
    assert pki.member_identity(pem) == pki.MemberIdentity("broker-a", "n1")
    assert pki.client_name(pem) is None
    client = pki.issue_client(ca, str(tmp_path), "admin")
    assert client.cert_path is not None
    with open(client.cert_path, "rb") as f:
        assert pki.client_name(f.read()) == "admin"
    assert pki.load_authority(str(tmp_path)).cert == ca.cert
    with pytest.raises(CertificateError):
        pki.issue_member(ca, str(tmp_path), "broker/a", "n1", ["127.0.0.1"])


class _Echo(grpc.GenericRpcHandler):
    """Answers any unary call with the caller's authorization header and certificate URI."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            meta = dict(context.invocation_metadata())
            pem = context.auth_context().get("x509_pem_cert", [b""])[0]
            who = pki.member_identity(pem)
            return f"{meta.get('authorization', '-')}|{who.uri if who else '-'}".encode()

        return grpc.unary_unary_rpc_method_handler(answer)


@pytest.fixture
def pki_dir(tmp_path):
    ca = pki.create_authority(str(tmp_path))
    member = pki.issue_member(ca, str(tmp_path), "broker-a", "n0", ["127.0.0.1"])
    other = pki.create_authority(str(tmp_path / "other"))
    stranger = pki.issue_member(other, str(tmp_path / "other"), "broker-a", "n2", ["127.0.0.1"])
    return ca, member, stranger


def _mtls_server(member: TlsFiles) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([_Echo()])
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(member, require_client_cert=True)
    )
    server.start()
    return server, port


def test_mutual_tls_and_signed_calls(pki_dir) -> None:
    ca, member, stranger = pki_dir
    server, port = _mtls_server(member)
    try:
        addr = f"127.0.0.1:{port}"
        with open_channel(addr, ClientSecurity(tls=member, credentials=CREDS)) as ch:
            answer = ch.unary_unary("/x.Echo/Call")(b"", timeout=10).decode()
        header, uri = answer.split("|")
        assert header.startswith("MQv2-HMAC-SHA1 Credential=alice,")
        assert uri == "raftmq://member/broker-a/n0"
        for security in (
            ClientSecurity(tls=TlsFiles(ca_path=ca.cert_path)),  # no client certificate
            ClientSecurity(tls=TlsFiles(stranger.cert_path, stranger.key_path, ca.cert_path)),
            ClientSecurity(),  # plaintext against a TLS port
        ):
            with open_channel(addr, security) as ch, pytest.raises(grpc.RpcError) as err:
                ch.unary_unary("/x.Echo/Call")(b"", timeout=3)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)


def test_aio_channel_signs_and_speaks_tls(pki_dir) -> None:
    _, member, _ = pki_dir
    server, port = _mtls_server(member)

    async def call() -> str:
        async with open_aio_channel(f"127.0.0.1:{port}", ClientSecurity(member, CREDS)) as ch:
            return (await ch.unary_unary("/x.Echo/Call")(b"", timeout=10)).decode()

    try:
        header, uri = asyncio.run(call()).split("|")
        assert header.startswith("MQv2-HMAC-SHA1 Credential=alice,") and uri.endswith("/n0")
    finally:
        server.stop(None)


def test_tls_files_are_checked(tmp_path) -> None:
    with pytest.raises(CertificateError):
        TlsFiles(cert_path="a.crt")
    loose = tmp_path / "loose.key"
    loose.write_text("-----BEGIN PRIVATE KEY-----\n")
    os.chmod(loose, 0o644)
    with pytest.raises(CertificateError, match="chmod 600"):
        TlsFiles(str(tmp_path / "x.crt"), str(loose)).check_private_key()
    with pytest.raises(CertificateError, match=r"cannot (read|stat)"):
        server_credentials(TlsFiles(str(tmp_path / "none.crt"), str(tmp_path / "none.key")), False)


def test_refusals_are_counted_by_a_fixed_vocabulary_and_logging_is_bounded(caplog) -> None:
    from mqsecurity.refusals import LOG_PER_REASON_PER_S, Refusals

    table = Refusals()
    with caplog.at_level("WARNING", logger="raftmq.security"):
        for _ in range(100):
            table.count("authentication", "bad signature for alice")
    assert table.snapshot()["authentication"] == 100
    assert table.snapshot()["authorization"] == 0
    assert 1 <= len(caplog.records) <= 2 * LOG_PER_REASON_PER_S  # a second boundary may split
    with pytest.raises(ValueError):
        table.count("anything the caller says", "x")
