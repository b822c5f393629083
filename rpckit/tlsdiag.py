"""gRPC's own failure to connect, read for the TLS mistake it shows: a client of any service
(the broker's clients, the DLedger log client, the tools) tells its user what to do instead of
gRPC's raw text. Shared by `client` and `dledger.server.client` (which may not import
`client`)."""

from __future__ import annotations

import re

from mqerrors import codes as E

# What a client is told to give for trust, in every TLS message: the tools' option and
# environment variable, and the client library's argument.
_GIVE_CA = (
    "give the CA that signed the server's certificate: --tls-ca FILE or RAFTMQ_TLS_CA=FILE "
    "for the tools, ClientSecurity(tls=TlsFiles(ca_path=FILE)) in code"
)
# The address gRPC names in a connect failure ("ipv4:127.0.0.1:9876: ...").
_FAILED_ADDR = re.compile(r"(?:ipv4|ipv6|dns):(\S+?):\s")
# gRPC's words (the detail of a call that never connected) for each TLS mistake.
_CONNECT_FAILED = "failed to connect"
_UNTRUSTED_CA = ("CERTIFICATE_VERIFY_FAILED",)
_UNTRUSTED_NAME = ("Hostname Verification Check failed", "is not in peer certificate")
_NOT_TLS = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG")
_CLOSED = "Socket closed"
_TLS_WORDS = ("Tls", "TLS", "Ssl", "SSL")


def tls_diagnosis(details: str) -> tuple[str, str] | None:
    """For gRPC's own failure to connect (no server answered), the TLS mistake it shows, as
    (code, message saying what to do), or None when it shows none. The message keeps gRPC's
    text after it, in parentheses."""
    if _CONNECT_FAILED not in details:
        return None
    found = _FAILED_ADDR.search(details)
    where = found.group(1) if found else "the server"
    grpc_text = f" (gRPC: {details})"
    if any(word in details for word in _UNTRUSTED_CA):
        return E.TLS_UNTRUSTED, (
            f"the certificate of {where} is not trusted: no CA this client trusts signed it; "
            f"{_GIVE_CA}{grpc_text}"
        )
    if any(word in details for word in _UNTRUSTED_NAME):
        return E.TLS_UNTRUSTED, (
            f"the certificate of {where} does not name the host dialled: dial a name it "
            "carries, or give that name with --tls-server-name NAME "
            f"(ClientSecurity(server_name=NAME) in code){grpc_text}"
        )
    if any(word in details for word in _NOT_TLS):
        return E.TLS_NOT_SERVED, (
            f"{where} does not speak TLS (it serves plaintext): drop --tls-ca, --tls and "
            f"RAFTMQ_TLS_CA, or set tlsEnable=true on the server{grpc_text}"
        )
    if _CLOSED in details and not any(word in details for word in _TLS_WORDS):
        return E.TLS_REQUIRED, (
            f"{where} closed the connection as it opened: it most likely serves TLS only and "
            f"this client spoke plaintext; {_GIVE_CA}{grpc_text}"
        )
    return None
