"""A local certificate authority and the certificates it issues (the `cryptography` library).

Identities live in the certificate's subject alternative name as a URI:

- a member of a broker group: ``raftmq://member/<group>/<node-id>`` (``member_identity``);
- a tool or client: ``raftmq://client/<name>``.

A member certificate also names the hosts it serves (DNS names and IP addresses), so clients
check it like any TLS server certificate, and it is valid for both server and client use: the
same certificate serves the node's ports and identifies it on its outgoing peer streams and to
the NameServer. Keys are ECDSA P-256 (fast handshakes, small files). Every key file is written
0600; certificates 0644.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mqsecurity.credentials import write_private_file
from mqsecurity.errors import CertificateError
from mqsecurity.tls import TlsFiles, read_pem

MEMBER_URI_PREFIX = "raftmq://member/"
CLIENT_URI_PREFIX = "raftmq://client/"
# Group names and node ids follow the broker's naming rules; this is the subset a URI needs.
_NAME = re.compile(r"[A-Za-z0-9_.%-]{1,127}")
# Long enough that a local group never meets an expiry, short enough that a stolen key of a
# forgotten test CA does not live forever. Operators with their own CA choose their own.
CA_VALIDITY_DAYS = 3650
LEAF_VALIDITY_DAYS = 825
# Certificates are back-dated a little so a node whose clock is slightly behind accepts them.
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class MemberIdentity:
    """Who a member certificate says its holder is."""

    group: str
    node_id: str

    @property
    def uri(self) -> str:
        return f"{MEMBER_URI_PREFIX}{self.group}/{self.node_id}"


def _check_name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise CertificateError(f"{what} {value!r} cannot be named in a certificate")
    return value


def _uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def member_identity(cert_pem: bytes) -> MemberIdentity | None:
    """The member a certificate names, or None when it names none or more than one (a
    certificate claiming two members is refused, not resolved)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return None
    found = []
    for uri in _uris(cert):
        if uri.startswith(MEMBER_URI_PREFIX):
            group, _, node_id = uri[len(MEMBER_URI_PREFIX) :].partition("/")
            if _NAME.fullmatch(group) and _NAME.fullmatch(node_id):
                found.append(MemberIdentity(group, node_id))
    return found[0] if len(found) == 1 else None


def client_name(cert_pem: bytes) -> str | None:
    """The tool or client name a certificate carries, or None."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return None
    names = [u[len(CLIENT_URI_PREFIX) :] for u in _uris(cert) if u.startswith(CLIENT_URI_PREFIX)]
    return names[0] if len(names) == 1 and _NAME.fullmatch(names[0]) else None


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate and key, loaded in memory to issue certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_path: str


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_pair(
    directory: str, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> TlsFiles:
    cert_path = os.path.join(directory, f"{stem}.crt")
    key_path = os.path.join(directory, f"{stem}.key")
    write_private_file(key_path, _key_pem(key))
    write_private_file(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    os.chmod(cert_path, 0o644)
    return TlsFiles(cert_path=cert_path, key_path=key_path)


def create_authority(directory: str, name: str = "raftmq local CA") -> Authority:
    """A new self-signed CA written to ``directory/ca.crt`` and ``ca.key`` (0600)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    files = _write_pair(directory, "ca", cert, key)
    assert files.cert_path is not None
    return Authority(cert, key, files.cert_path)


def load_authority(directory: str) -> Authority:
    """The CA in ``directory`` (``ca.crt``, ``ca.key``)."""
    cert_path = os.path.join(directory, "ca.crt")
    cert = x509.load_pem_x509_certificate(read_pem(cert_path, "CA certificate"))
    key = serialization.load_pem_private_key(
        read_pem(os.path.join(directory, "ca.key"), "CA key"), None
    )
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{directory}/ca.key is not an EC key")
    return Authority(cert, key, cert_path)


def _host_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _issue(
    ca: Authority, common_name: str, alt_names: list[x509.GeneralName]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=LEAF_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return cert, key


def issue_member(
    ca: Authority, directory: str, group: str, node_id: str, hosts: Sequence[str]
) -> TlsFiles:
    """A member certificate for ``node_id`` of ``group`` serving ``hosts``, written to
    ``directory/<group>-<node_id>.crt/.key``; the returned files trust ``ca``."""
    identity = MemberIdentity(_check_name(group, "group"), _check_name(node_id, "node id"))
    alt: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(identity.uri),
        *_host_names(hosts),
    ]
    cert, key = _issue(ca, f"{group}/{node_id}", alt)
    files = _write_pair(directory, f"{group}-{node_id}", cert, key)
    return TlsFiles(files.cert_path, files.key_path, ca.cert_path)


def issue_client(ca: Authority, directory: str, name: str) -> TlsFiles:
    """A client certificate ``raftmq://client/<name>`` (tools, admin), written to
    ``directory/client-<name>.crt/.key``; the returned files trust ``ca``."""
    uri = f"{CLIENT_URI_PREFIX}{_check_name(name, 'client name')}"
    cert, key = _issue(ca, name, [x509.UniformResourceIdentifier(uri)])
    files = _write_pair(directory, f"client-{name}", cert, key)
    return TlsFiles(files.cert_path, files.key_path, ca.cert_path)


def issue_server(ca: Authority, directory: str, name: str, hosts: Sequence[str]) -> TlsFiles:
    """A server certificate for ``hosts`` with no member identity (a NameServer: it serves,
    it never joins a group), written to ``directory/<name>.crt/.key``; the returned files
    trust ``ca``."""
    if not hosts:
        raise CertificateError("a server certificate must name at least one host")
    cert, key = _issue(ca, _check_name(name, "server name"), _host_names(hosts))
    files = _write_pair(directory, name, cert, key)
    return TlsFiles(files.cert_path, files.key_path, ca.cert_path)
