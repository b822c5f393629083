"""Certificate, key and CA files, and the gRPC credentials made from them.

Every file is read once when a server or channel is set up, bounded in size, and a missing or
unreadable file is a `CertificateError` naming the file and the setting it came from.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from mqsecurity.errors import CertificateError

# A PEM certificate chain of a few certificates is a few KiB; a bound keeps a wrong path (a
# log file, a device) from being read whole.
MAX_PEM_FILE_BYTES = 256 * 1024


def read_pem(path: str, what: str) -> bytes:
    """The bytes of the PEM file ``path`` (``what`` names it in errors: "tlsServerCertPath")."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PEM_FILE_BYTES + 1)
    except OSError as exc:
        raise CertificateError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_PEM_FILE_BYTES:
        raise CertificateError(f"{what}: {path} is over {MAX_PEM_FILE_BYTES} bytes, not a PEM file")
    if b"-----BEGIN " not in data:
        raise CertificateError(f"{what}: {path} holds no PEM block")
    return data


@dataclass(frozen=True)
class TlsFiles:
    """One party's TLS material: its certificate chain and key, and the CA it trusts.

    ``cert_path``/``key_path`` may be None for a client that presents no certificate;
    ``ca_path`` None means the system's trust store (a server with ``require_client_cert``
    needs it)."""

    cert_path: str | None = None
    key_path: str | None = None
    ca_path: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_path is None) != (self.key_path is None):
            raise CertificateError("a certificate needs its key and a key its certificate")

    def has_identity(self) -> bool:
        return self.cert_path is not None

    def check_private_key(self) -> None:
        """Refuse a key file that group or others may read, like ssh does."""
        if self.key_path is None:
            return
        try:
            mode = os.stat(self.key_path).st_mode
        except OSError as exc:
            raise CertificateError(f"cannot stat key {self.key_path}: {exc.strerror}") from None
        if mode & 0o077:
            raise CertificateError(
                f"key {self.key_path} is accessible by group or others "
                f"(mode {mode & 0o777:o}); chmod 600 it"
            )


def server_credentials(files: TlsFiles, require_client_cert: bool) -> grpc.ServerCredentials:
    """Credentials for a TLS server port. With ``require_client_cert`` every client must show a
    certificate signed by ``files.ca_path`` (mutual TLS), else the handshake fails."""
    if files.cert_path is None or files.key_path is None:
        raise CertificateError("a TLS server port needs a certificate and a key")
    if require_client_cert and files.ca_path is None:
        raise CertificateError("mutual TLS needs the CA that signs client certificates")
    files.check_private_key()
    chain = read_pem(files.cert_path, "certificate")
    key = read_pem(files.key_path, "private key")
    ca = read_pem(files.ca_path, "CA") if files.ca_path is not None else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=require_client_cert
    )


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Credentials for a TLS client channel: trust ``files.ca_path`` (or the system store) and
    present the certificate when there is one."""
    ca = read_pem(files.ca_path, "CA") if files.ca_path is not None else None
    if files.cert_path is None or files.key_path is None:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    files.check_private_key()
    return grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=read_pem(files.key_path, "private key"),
        certificate_chain=read_pem(files.cert_path, "certificate"),
    )


def https_server_context(files: TlsFiles) -> ssl.SSLContext:
    """The context of an HTTPS server port (the /metrics endpoint) serving ``files``'
    certificate chain and key: TLS 1.2 or later, no client certificate asked (a scraper checks
    ours against its CA). `CertificateError` for a missing or unusable certificate or key."""
    if files.cert_path is None or files.key_path is None:
        raise CertificateError("an HTTPS port needs a certificate and a key")
    files.check_private_key()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_path, files.key_path)
    except (OSError, ValueError) as exc:
        raise CertificateError(
            f"cannot load certificate {files.cert_path} with key {files.key_path}: {exc}"
        ) from None
    return context


def metrics_over_tls(tls_enable: bool, metrics_tls_enable: bool | None) -> bool:
    """Whether a process serves /metrics over HTTPS: with its TLS (``tlsEnable``), unless
    ``metricsTlsEnable`` is false (None: not set). One rule for the broker, the NameServer and
    the tools that scrape them (docs/METRICS.md)."""
    return tls_enable and metrics_tls_enable is not False


def tls_files_of(cert_path: str, key_path: str, ca_path: str) -> TlsFiles | None:
    """The files configuration keys name ("" for unset): None without a certificate."""
    if not cert_path:
        return None
    return TlsFiles(cert_path, key_path or None, ca_path or None)


@dataclass(frozen=True)
class TlsKeyNames:
    """The configuration keys the three files came from, for error messages."""

    cert: str = "tlsServerCertPath"
    key: str = "tlsServerKeyPath"
    ca: str = "tlsServerTrustCertPath"


SERVER_KEY_NAMES = TlsKeyNames()


def check_server_files(files: TlsFiles, names: TlsKeyNames = SERVER_KEY_NAMES) -> None:
    """Read and parse a server's certificate chain, key and CA now, so a wrong file is one
    `CertificateError` line naming its key at start, not a handshake failure later: each file
    readable PEM, the key private (0600), the key the certificate's, the CA a certificate."""
    if files.cert_path is None or files.key_path is None:
        raise CertificateError(f"{names.cert} and {names.key} are both required")
    try:
        files.check_private_key()
    except CertificateError as exc:
        raise CertificateError(f"{names.key}: {exc}") from None
    chain = _certificates(read_pem(files.cert_path, names.cert), names.cert, files.cert_path)
    key_pem = read_pem(files.key_path, names.key)
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{names.key}: {files.key_path}: not a private key: {exc}") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != chain[0].public_key().public_bytes(der, spki):
        raise CertificateError(
            f"{names.key}: {files.key_path} is not the key of {names.cert} {files.cert_path}"
        )
    if files.ca_path is not None:
        _certificates(read_pem(files.ca_path, names.ca), names.ca, files.ca_path)


def _certificates(pem: bytes, what: str, path: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertificateError(f"{what}: {path} holds no valid certificate: {exc}") from None
    return certs
