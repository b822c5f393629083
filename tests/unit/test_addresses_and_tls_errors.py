"""Addresses as users type them and the TLS mistakes gRPC reports only as a transport failure
(issue #35): a NameServer without a port is at 9876 (as in RocketMQ, not gRPC's 443), a broker
address without a port is refused saying so, and a failed TLS connect is named with what to
give (the CA, the name) instead of ``UNAVAILABLE ... Socket closed``."""

from __future__ import annotations

import grpc
import pytest

from client import mqadmin
from client.errors import MQClientError
from client.route import parse_namesrv_addr
from mqcli.addrs import MAX_ADDR_CHARS, broker_addr, host_port, namesrv_addrs
from rpckit.tlsdiag import tls_diagnosis

# gRPC's details of connects that failed, as grpcio 1.85 words them (from real runs against a
# secure group and a plaintext NameServer: tests/integration/test_tls_trust_errors.py).
PLAINTEXT_TO_TLS = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:28568: "
    "Socket closed"
)
UNKNOWN_CA = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:28568: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
    "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK"
)
WRONG_NAME = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:28568: Custom "
    "verification check failed with error: UNAUTHENTICATED: Hostname Verification Check failed."
)
TLS_TO_PLAINTEXT = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:28999: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:"
    "OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification context: OK"
)
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9876: Failed to "
    "connect to remote host: Connection refused"
)


def test_a_namesrv_address_without_a_port_is_at_9876() -> None:
    assert namesrv_addrs("127.0.0.1") == ["127.0.0.1:9876"]
    assert namesrv_addrs(" a ; b:9877 ;; [::1] ;[::1]:1") == [
        "a:9876",
        "b:9877",
        "[::1]:9876",
        "[::1]:1",
    ]
    assert parse_namesrv_addr("localhost") == ["localhost:9876"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "the NameServer address list is empty"),
        (";;", "the NameServer address list is empty"),
        ("a:0", "port '0' is not 1 to 65535"),
        ("a:x", "port 'x' is not 1 to 65535"),
        ("a:", "port '' is not 1 to 65535"),
        (":9876", "has no host"),
        ("::1", "write an IPv6 address in brackets, e.g. [::1]:9876"),
        ("[::1", "is not [IPv6]:port"),
        ("http://a:9876", "without a scheme or path"),
        ("a" * (MAX_ADDR_CHARS + 1), f"longer than {MAX_ADDR_CHARS} chars"),
    ],
)
def test_bad_namesrv_addresses_are_refused_with_the_reason(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        namesrv_addrs(text)
    assert needle in str(err.value)
    assert len(str(err.value)) < 200  # a pasted blob is quoted in part only
    with pytest.raises(MQClientError) as client_err:
        parse_namesrv_addr(text)
    assert client_err.value.code == "INVALID_NAMESRV_ADDR" and needle in client_err.value.message


def test_a_broker_address_needs_its_port() -> None:
    assert broker_addr(" 10.0.0.1:10911 ") == "10.0.0.1:10911"
    with pytest.raises(ValueError) as err:
        broker_addr("10.0.0.1")
    assert str(err.value) == (
        "broker address '10.0.0.1' has no port: write host:port (e.g. 10.0.0.1:10911, the "
        "listenPort of its broker.conf)"
    )
    assert host_port("h", "peer", 1) == "h:1"


def test_mqadmin_refuses_a_broker_address_without_a_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        mqadmin.main(["-n", "127.0.0.1:1", "brokerStatus", "-b", "127.0.0.1"])
    assert done.value.code == 2
    assert "broker address '127.0.0.1' has no port: write host:port" in capsys.readouterr().err


def test_tls_connect_failures_are_named_with_what_to_give() -> None:
    code, message = tls_diagnosis(PLAINTEXT_TO_TLS) or ("", "")
    assert code == "TLS_REQUIRED"
    assert message.startswith(
        "127.0.0.1:28568 closed the connection as it opened: it most likely serves TLS only "
        "and this client spoke plaintext; give the CA that signed the server's certificate: "
        "--tls-ca FILE or RAFTMQ_TLS_CA=FILE for the tools, "
        "ClientSecurity(tls=TlsFiles(ca_path=FILE)) in code (gRPC: failed to connect"
    )
    code, message = tls_diagnosis(UNKNOWN_CA) or ("", "")
    assert code == "TLS_UNTRUSTED"
    assert message.startswith("the certificate of 127.0.0.1:28568 is not trusted: no CA this")
    code, message = tls_diagnosis(WRONG_NAME) or ("", "")
    assert code == "TLS_UNTRUSTED" and "--tls-server-name NAME" in message
    code, message = tls_diagnosis(TLS_TO_PLAINTEXT) or ("", "")
    assert code == "TLS_NOT_SERVED"
    assert message.startswith("127.0.0.1:28999 does not speak TLS (it serves plaintext)")
    # Not a TLS mistake: left as gRPC said it.
    assert tls_diagnosis(REFUSED) is None
    assert tls_diagnosis("Deadline Exceeded") is None
    assert tls_diagnosis("Socket closed") is None  # a call that had connected


class _Failed(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_the_client_error_carries_the_diagnosis_and_its_retry() -> None:
    untrusted = MQClientError.from_rpc(_Failed(UNKNOWN_CA))
    assert (untrusted.code, untrusted.status) == ("TLS_UNTRUSTED", "UNAVAILABLE")
    # A configuration mistake: no retry cures it, and the request never left the client.
    assert not untrusted.retryable and not untrusted.outcome_unknown
    # A closed socket may also be a node going down: retried (another member) as before.
    closed = MQClientError.from_rpc(_Failed(PLAINTEXT_TO_TLS))
    assert closed.code == "TLS_REQUIRED" and closed.retryable and closed.leader_moved
    refused = MQClientError.from_rpc(_Failed(REFUSED))
    assert refused.code == "UNAVAILABLE" and refused.retryable and refused.outcome_unknown
