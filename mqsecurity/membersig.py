"""Member-signed requests: a broker proves to the NameServer that it is a member of the group it
registers or unregisters, on a port that also serves clients without certificates.

Why signatures and not mutual TLS: a gRPC Python server either requires a client certificate on
a port or never asks for one, and the NameServer's port also serves producers and consumers that
have none. So the broker signs each call with its member key instead (the key of its
``raftmq://member/<group>/<node-id>`` certificate, `mqsecurity.pki`), in four metadata headers:

- ``x-raftmq-member-cert-bin``: the member certificate (PEM bytes);
- ``x-raftmq-member-time-ms``: the signer's clock, milliseconds since the Unix epoch;
- ``x-raftmq-member-nonce``: 32 lowercase hex digits, random per call;
- ``x-raftmq-member-signature-bin``: the signature, with the certificate's key, of
  ``raftmq-member-signature-v1 \\n method \\n time-ms \\n nonce \\n sha256-hex(body)`` where
  ``body`` is the request's deterministic protobuf serialization and ``method`` the full gRPC
  method name (``/raftmq.nameserver.v1.NameServer/RegisterBroker``): a signature for one call
  is worthless for another method or another request.

`MemberVerifier.verify` checks, in this order and refusing at the first failure: the headers
are there once each and bounded; the certificate chains to the trusted CA and is valid now
(RFC 5280 path validation by `cryptography.x509.verification`, client use); the signature is
the certificate key's; the time is within `MAX_CLOCK_SKEW_MS` of the verifier's clock; the nonce
was not seen within that window (a replay). It returns the member the certificate names; the
caller checks that it is the group and node the request is about.

This module imports nothing of the project but `mqsecurity` (servers and brokers share it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from mqsecurity.errors import CertificateError, SignatureError
from mqsecurity.pki import MemberIdentity, member_identity
from mqsecurity.tls import (
    SERVER_KEY_NAMES,
    TlsFiles,
    TlsKeyNames,
    check_server_files,
    read_pem,
)

HEADER_CERT = "x-raftmq-member-cert-bin"
HEADER_TIME = "x-raftmq-member-time-ms"
HEADER_NONCE = "x-raftmq-member-nonce"
HEADER_SIGNATURE = "x-raftmq-member-signature-bin"
HEADERS = (HEADER_CERT, HEADER_TIME, HEADER_NONCE, HEADER_SIGNATURE)
DOMAIN = "raftmq-member-signature-v1"
# A member certificate is under 1 KiB (EC) or about 2 KiB (RSA 4096); 16 KiB leaves room for
# long host lists and still keeps a hostile header from costing a large parse.
MAX_CERT_BYTES = 16 * 1024
# The largest signature of a supported key: RSA 8192 is 1024 bytes (EC P-521 is 139).
MAX_SIGNATURE_BYTES = 1024
NONCE_HEX_CHARS = 32
_NONCE = re.compile(r"[0-9a-f]{32}")
# Twenty digits hold any int64 of milliseconds; longer is junk, not a time.
MAX_TIME_DIGITS = 20
# How far the signer's clock may be from the verifier's. Brokers and NameServers run NTP; five
# minutes tolerates a drifting one, and bounds how long a nonce must be remembered.
MAX_CLOCK_SKEW_MS = 300_000
# Nonces remembered to refuse replays. Only calls with a valid member signature are
# remembered (so only members fill it), and a member signs a registration per period or
# change; at the cap the oldest is forgotten (a replay then also needs the TLS-protected
# bytes of a call made at least this many calls ago, within the skew window).
MAX_REMEMBERED_NONCES = 100_000


def signed_text(method: str, time_ms: int, nonce: str, body: bytes) -> bytes:
    """The exact bytes a member signs for one call."""
    digest = hashlib.sha256(body).hexdigest()
    return f"{DOMAIN}\n{method}\n{time_ms}\n{nonce}\n{digest}".encode()


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def _sign(key: PrivateKey, data: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    return key.sign(data)


def _signature_ok(cert: x509.Certificate, signature: bytes, data: bytes) -> bool:
    public = cert.public_key()
    try:
        if isinstance(public, ec.EllipticCurvePublicKey):
            public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public, rsa.RSAPublicKey):
            public.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(signature, data)
        else:
            return False
    except InvalidSignature:
        return False
    return True


class MemberSigner:
    """Signs calls with a member certificate's key (the broker side)."""

    def __init__(
        self, cert_path: str, key_path: str, names: TlsKeyNames = SERVER_KEY_NAMES
    ) -> None:
        check_server_files(TlsFiles(cert_path, key_path), names)
        self._cert_pem = read_pem(cert_path, names.cert)
        key = serialization.load_pem_private_key(read_pem(key_path, names.key), None)
        if not isinstance(
            key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
        ):
            raise CertificateError(f"{names.key}: {key_path}: not an EC, RSA or Ed25519 key")
        self._key: PrivateKey = key
        if len(self._cert_pem) > MAX_CERT_BYTES:
            raise CertificateError(f"{names.cert}: {cert_path} is over {MAX_CERT_BYTES} bytes")
        identity = member_identity(self._cert_pem)
        if identity is None:
            raise CertificateError(f"{names.cert}: {cert_path} names no raftmq member")
        self.identity = identity

    def metadata(
        self, method: str, body: bytes, *, now_ms: int | None = None, nonce: str | None = None
    ) -> tuple[tuple[str, str | bytes], ...]:
        """The headers that sign one call of ``method`` carrying ``body``."""
        time_ms = int(time.time() * 1000) if now_ms is None else now_ms
        nonce = secrets.token_hex(NONCE_HEX_CHARS // 2) if nonce is None else nonce
        signature = _sign(self._key, signed_text(method, time_ms, nonce, body))
        return (
            (HEADER_CERT, self._cert_pem),
            (HEADER_TIME, str(time_ms)),
            (HEADER_NONCE, nonce),
            (HEADER_SIGNATURE, signature),
        )


def _headers(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str | bytes]:
    """Our four headers, each exactly once; SignatureError otherwise."""
    found: dict[str, str | bytes] = {}
    for key, value in metadata:
        if key in HEADERS:
            if key in found:
                raise SignatureError(f"header {key} appears more than once")
            found[key] = value
    if not found:
        raise SignatureError("the call is not signed by a member certificate")
    missing = [h for h in HEADERS if h not in found]
    if missing:
        raise SignatureError(f"member signature incomplete: no {missing[0]}")
    return found


def _text(value: str | bytes, what: str, limit: int) -> str:
    if isinstance(value, bytes):
        raise SignatureError(f"{what} must be text")
    if len(value) > limit:
        raise SignatureError(f"{what} is over {limit} characters")
    return value


def _binary(value: str | bytes, what: str, limit: int) -> bytes:
    if not isinstance(value, bytes):
        raise SignatureError(f"{what} must be binary")
    if len(value) > limit:
        raise SignatureError(f"{what} is over {limit} bytes")
    return value


class MemberVerifier:
    """Checks member signatures against the CA of ``ca_pem`` (the NameServer side). Not thread
    safe: one event loop uses it (the replay window is its state)."""

    def __init__(
        self,
        ca_pem: bytes,
        *,
        max_skew_ms: int = MAX_CLOCK_SKEW_MS,
        max_nonces: int = MAX_REMEMBERED_NONCES,
    ) -> None:
        try:
            anchors = x509.load_pem_x509_certificates(ca_pem)
        except ValueError as exc:
            raise CertificateError(f"no CA certificate: {exc}") from None
        self._store = Store(anchors)
        self.max_skew_ms = max_skew_ms
        self.max_nonces = max_nonces
        self._nonces: OrderedDict[str, int] = OrderedDict()  # nonce -> forget after (ms)

    def verify(
        self,
        method: str,
        body: bytes,
        metadata: Iterable[tuple[str, str | bytes]],
        *,
        now_ms: int | None = None,
    ) -> MemberIdentity:
        """The member that signed this call; `SignatureError` (safe to return) otherwise."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        found = _headers(metadata)
        cert_pem = _binary(found[HEADER_CERT], HEADER_CERT, MAX_CERT_BYTES)
        signature = _binary(found[HEADER_SIGNATURE], HEADER_SIGNATURE, MAX_SIGNATURE_BYTES)
        time_text = _text(found[HEADER_TIME], HEADER_TIME, MAX_TIME_DIGITS)
        nonce = _text(found[HEADER_NONCE], HEADER_NONCE, NONCE_HEX_CHARS)
        if not time_text.isascii() or not time_text.isdigit():
            raise SignatureError(f"{HEADER_TIME} is not a number of milliseconds")
        if not _NONCE.fullmatch(nonce):
            raise SignatureError(f"{HEADER_NONCE} is not {NONCE_HEX_CHARS} lowercase hex digits")
        cert = self._trusted(cert_pem, now)
        time_ms = int(time_text)
        if not _signature_ok(cert, signature, signed_text(method, time_ms, nonce, body)):
            raise SignatureError("member signature does not match the call")
        if abs(now - time_ms) > self.max_skew_ms:
            raise SignatureError(
                f"signed {abs(now - time_ms)} ms away from this server's clock "
                f"(at most {self.max_skew_ms})"
            )
        self._remember(nonce, time_ms, now)
        identity = member_identity(cert_pem)
        if identity is None:
            raise SignatureError("the signing certificate names no raftmq member")
        return identity

    def _trusted(self, cert_pem: bytes, now_ms: int) -> x509.Certificate:
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError:
            raise SignatureError("the member certificate is not a PEM certificate") from None
        when = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC)
        verifier = PolicyBuilder().store(self._store).time(when).build_client_verifier()
        try:
            verifier.verify(cert, [])
        except VerificationError as exc:
            raise SignatureError(f"the member certificate is not trusted: {exc}") from None
        return cert

    def _remember(self, nonce: str, time_ms: int, now_ms: int) -> None:
        nonces = self._nonces
        while nonces and next(iter(nonces.values())) < now_ms:
            nonces.popitem(last=False)
        if nonce in nonces:
            raise SignatureError("replayed call: this nonce was already used")
        nonces[nonce] = time_ms + self.max_skew_ms
        while len(nonces) > self.max_nonces:
            nonces.popitem(last=False)
