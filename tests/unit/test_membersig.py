"""mqsecurity.membersig: member-signed requests, hostile input first (every refusal a
SignatureError, nothing remembered from a refused call), then the call that passes."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mqsecurity import membersig, pki
from mqsecurity.errors import CertificateError, SignatureError
from mqsecurity.membersig import (
    HEADER_CERT,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIME,
    MemberSigner,
    MemberVerifier,
)
from mqsecurity.tls import TlsFiles

METHOD = "/raftmq.nameserver.v1.NameServer/RegisterBroker"
BODY = b"\x0a\x0eDefaultCluster\x12\x08broker-a"
NONCE = "0123456789abcdef0123456789abcdef"


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = pki.create_authority(str(root / "ca"))
        self.member = pki.issue_member(self.ca, str(root / "ca"), "broker-a", "n0", ["127.0.0.1"])
        self.other_group = pki.issue_member(
            self.ca, str(root / "ca"), "broker-b", "n0", ["127.0.0.1"]
        )
        self.client = pki.issue_client(self.ca, str(root / "ca"), "admin")
        rogue = pki.create_authority(str(root / "rogue"))
        self.rogue = pki.issue_member(rogue, str(root / "rogue"), "broker-a", "n0", ["127.0.0.1"])
        with open(self.ca.cert_path, "rb") as f:
            self.ca_pem = f.read()
        # The verifier checks the certificates' dates at this time: just after they were made
        # (not at import: a long test session would start before the certificates are valid).
        self.now_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)

    def signer(self, files: TlsFiles) -> MemberSigner:
        assert files.cert_path is not None and files.key_path is not None
        return MemberSigner(files.cert_path, files.key_path)

    def verifier(self) -> MemberVerifier:
        return MemberVerifier(self.ca_pem)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("membersig"))


def _signed(keys: Pki, **changes: object) -> list[tuple[str, str | bytes]]:
    headers = dict(keys.signer(keys.member).metadata(METHOD, BODY, now_ms=keys.now_ms, nonce=NONCE))
    for key, value in changes.items():
        name = {
            "cert": HEADER_CERT,
            "time": HEADER_TIME,
            "nonce": HEADER_NONCE,
            "signature": HEADER_SIGNATURE,
        }[key]
        if callable(value):
            value = value(keys)
        if value is None:
            del headers[name]
        else:
            headers[name] = value  # type: ignore[assignment]
    return list(headers.items())


def _refused(keys: Pki, metadata: list[tuple[str, str | bytes]], match: str, **kw: object) -> None:
    verifier = keys.verifier()
    with pytest.raises(SignatureError, match=match):
        method, body = kw.get("method", METHOD), kw.get("body", BODY)
        verifier.verify(method, body, metadata, now_ms=keys.now_ms)  # type: ignore[arg-type]
    # A refused call is not remembered: the genuine one still passes afterwards.
    verifier.verify(METHOD, BODY, _signed(keys), now_ms=keys.now_ms)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"cert": None}, "incomplete: no x-raftmq-member-cert-bin"),
        ({"signature": None}, "incomplete"),
        ({"time": None}, "incomplete"),
        ({"nonce": None}, "incomplete"),
        ({"cert": "-----BEGIN CERTIFICATE-----"}, "must be binary"),
        ({"cert": b"x" * (membersig.MAX_CERT_BYTES + 1)}, "over"),
        ({"cert": b"not a certificate"}, "not a PEM certificate"),
        ({"signature": b"s" * (membersig.MAX_SIGNATURE_BYTES + 1)}, "over"),
        ({"signature": "text"}, "must be binary"),
        ({"signature": b"\x30\x06\x02\x01\x01\x02\x01\x01"}, "does not match"),
        ({"time": b"1"}, "must be text"),
        ({"time": "9" * 21}, "over"),
        ({"time": "-5"}, "not a number"),
        ({"time": "١٢٣"}, "not a number"),  # non-ASCII digits
        ({"time": lambda k: str(k.now_ms + 1)}, "does not match"),  # the time is signed
        ({"nonce": "0123456789ABCDEF0123456789ABCDEF"}, "lowercase hex"),
        ({"nonce": "f" * 33}, "over"),
        ({"nonce": "f" * 32}, "does not match"),  # the nonce is signed
    ],
)
def test_malformed_or_forged_headers_are_refused(
    keys: Pki, changes: dict[str, object], match: str
) -> None:
    _refused(keys, _signed(keys, **changes), match)


def test_unsigned_and_duplicated_headers(keys: Pki) -> None:
    _refused(keys, [("user-agent", "x")], "not signed by a member certificate")
    twice = _signed(keys)
    twice.append((HEADER_NONCE, NONCE))
    _refused(keys, twice, "more than once")


def test_the_signature_binds_method_and_body(keys: Pki) -> None:
    _refused(keys, _signed(keys), "does not match", body=BODY + b"\x18\x01")
    _refused(
        keys,
        _signed(keys),
        "does not match",
        method="/raftmq.nameserver.v1.NameServer/UnregisterBroker",
    )


def test_certificates_of_another_ca_or_copied_from_a_member_are_refused(keys: Pki) -> None:
    # Signed by a member key of a CA the verifier does not trust.
    rogue = keys.signer(keys.rogue).metadata(METHOD, BODY, now_ms=keys.now_ms, nonce=NONCE)
    _refused(keys, list(rogue), "not trusted")
    # The genuine member certificate, but the signature made with another (trusted) key.
    other = keys.signer(keys.other_group)
    stolen = dict(other.metadata(METHOD, BODY, now_ms=keys.now_ms, nonce=NONCE))
    with open(keys.member.cert_path or "", "rb") as f:
        stolen[HEADER_CERT] = f.read()
    _refused(keys, list(stolen.items()), "does not match")


def test_old_future_and_replayed_calls_are_refused(keys: Pki) -> None:
    verifier = keys.verifier()
    skew = membersig.MAX_CLOCK_SKEW_MS
    for offset in (-skew - 1, skew + 1):
        headers = keys.signer(keys.member).metadata(
            METHOD, BODY, now_ms=keys.now_ms + offset, nonce=NONCE
        )
        with pytest.raises(SignatureError, match="away from this server's clock"):
            verifier.verify(METHOD, BODY, headers, now_ms=keys.now_ms)
    signer = keys.signer(keys.member)
    headers = signer.metadata(METHOD, BODY, now_ms=keys.now_ms - skew + 10, nonce=NONCE)
    assert verifier.verify(METHOD, BODY, headers, now_ms=keys.now_ms).node_id == "n0"
    with pytest.raises(SignatureError, match="replayed"):
        verifier.verify(METHOD, BODY, headers, now_ms=keys.now_ms + 1)
    # Past the window the nonce is forgotten, and the time check refuses the call instead.
    with pytest.raises(SignatureError, match="away from"):
        verifier.verify(METHOD, BODY, headers, now_ms=keys.now_ms + 2 * skew)


def test_the_replay_window_is_bounded(keys: Pki) -> None:
    verifier = MemberVerifier(keys.ca_pem, max_nonces=3)
    signer = keys.signer(keys.member)
    first = signer.metadata(METHOD, BODY, now_ms=keys.now_ms)
    verifier.verify(METHOD, BODY, first, now_ms=keys.now_ms)
    for _ in range(3):
        headers = signer.metadata(METHOD, BODY, now_ms=keys.now_ms)
        verifier.verify(METHOD, BODY, headers, now_ms=keys.now_ms)
    assert len(verifier._nonces) == 3
    # The oldest was forgotten at the cap (documented: replays then need old TLS bytes).
    verifier.verify(METHOD, BODY, first, now_ms=keys.now_ms)


def test_expired_member_certificate_is_refused(keys: Pki, tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "broker-a/n0")]))
        .issuer_name(keys.ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(keys.ca.key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier("raftmq://member/broker-a/n0")]
            ),
            critical=False,
        )
        .sign(keys.ca.key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "old.crt", tmp_path / "old.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    now_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    headers = MemberSigner(str(cert_path), str(key_path)).metadata(METHOD, BODY, now_ms=now_ms)
    with pytest.raises(SignatureError, match="not trusted"):
        keys.verifier().verify(METHOD, BODY, headers, now_ms=now_ms)


def test_a_signer_needs_a_member_certificate_and_its_own_key(keys: Pki) -> None:
    assert keys.client.cert_path and keys.client.key_path
    with pytest.raises(CertificateError, match="names no raftmq member"):
        MemberSigner(keys.client.cert_path, keys.client.key_path)
    assert keys.member.cert_path and keys.other_group.key_path
    with pytest.raises(CertificateError, match="is not the key of tlsServerCertPath"):
        MemberSigner(keys.member.cert_path, keys.other_group.key_path)
    with pytest.raises(CertificateError, match="no CA certificate"):
        MemberVerifier(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


def test_a_member_signature_verifies_and_names_the_member(keys: Pki) -> None:
    verifier = keys.verifier()
    identity = verifier.verify(METHOD, BODY, _signed(keys), now_ms=keys.now_ms)
    assert identity == pki.MemberIdentity("broker-a", "n0")
    other = keys.signer(keys.other_group).metadata(METHOD, BODY, now_ms=keys.now_ms)
    assert verifier.verify(METHOD, BODY, other, now_ms=keys.now_ms).group == "broker-b"
