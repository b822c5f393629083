"""``mqcert``: the certificates of a cluster on several hosts, from the command line.

One CA per cluster (every broker group and NameServer of it trusts the same ``ca.crt``), and
from it (docs/DEPLOY.md, docs/SECURITY.md "Members"):

- ``mqcert ca --dir DIR``: a new CA, ``DIR/ca.crt`` and ``DIR/ca.key`` (0600); refused when
  ``DIR/ca.key`` exists (a second CA would split the cluster's trust);
- ``mqcert member --dir DIR --group G --id N --host H [--host ...]``: a broker node's member
  certificate ``raftmq://member/G/N`` valid for the hosts it serves, ``G-N.crt/.key``;
- ``mqcert server --dir DIR --name nameserver --host H ...``: a NameServer's (hosts only, no
  member identity), ``NAME.crt/.key``;
- ``mqcert client --dir DIR --name admin``: a tool's client certificate
  ``raftmq://client/admin``, ``client-NAME.crt/.key``;
- ``mqcert show FILE``: what a certificate says (identity, hosts, validity, issuer).

``--out`` writes the pair elsewhere (default: the CA's directory). Issuing again writes a fresh
key and certificate over the old pair (atomically, file by file): that is rotation; the process
reads its files when it starts, so restart it after. Keys are ECDSA P-256 and leaves are valid
for 825 days (``mqsecurity.pki``). Exit 0 and one line per file written; exit 2 and one line
naming the problem otherwise, nothing written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from mqsecurity import pki
from mqsecurity.errors import SecurityError
from mqsecurity.tls import TlsFiles, read_pem

# Hosts one certificate may name: far above a node's addresses (a name per interface).
MAX_HOSTS = 32
# The longest host name DNS allows.
MAX_HOST_CHARS = 253
EXIT_USAGE = 2


class ToolError(SecurityError):
    """A request the tool refuses; the message says why."""


def _parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="mqcert",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = cli.add_subparsers(dest="cmd", required=True)
    ca = sub.add_parser("ca", help="create the cluster's CA")
    ca.add_argument("--dir", required=True, help="where ca.crt and ca.key go")
    ca.add_argument("--name", default="raftmq cluster CA", help="the CA's common name")
    for kind, what in (("member", "a broker node"), ("server", "a NameServer")):
        p = sub.add_parser(kind, help=f"issue {what}'s certificate")
        p.add_argument("--dir", required=True, help="the CA's directory")
        p.add_argument("--out", help="where the pair goes (default: --dir)")
        p.add_argument("--host", action="append", required=True, help="an address it serves")
        if kind == "member":
            p.add_argument("--group", required=True, help="its broker group (brokerName)")
            p.add_argument("--id", required=True, help="its node id (dLegerSelfId)")
        else:
            p.add_argument("--name", default="nameserver", help="the files' stem")
    client = sub.add_parser("client", help="issue a tool's client certificate")
    client.add_argument("--dir", required=True, help="the CA's directory")
    client.add_argument("--out", help="where the pair goes (default: --dir)")
    client.add_argument("--name", required=True, help="raftmq://client/<name>")
    show = sub.add_parser("show", help="print what a certificate says")
    show.add_argument("file")
    return cli


def _hosts(hosts: Sequence[str]) -> list[str]:
    if len(hosts) > MAX_HOSTS:
        raise ToolError(f"{len(hosts)} hosts: at most {MAX_HOSTS}")
    for host in hosts:
        if not 0 < len(host) <= MAX_HOST_CHARS or any(c.isspace() or c in "/,;" for c in host):
            raise ToolError(f"host {host[:80]!r} is not an address or a DNS name")
    return list(dict.fromkeys(hosts))


def _out_dir(ns: argparse.Namespace) -> str:
    out: str = ns.out or ns.dir
    os.makedirs(out, mode=0o700, exist_ok=True)
    return out


def _create_ca(ns: argparse.Namespace) -> list[str]:
    if os.path.exists(os.path.join(ns.dir, "ca.key")):
        raise ToolError(f"{ns.dir}/ca.key exists: one CA per cluster, never replaced by mqcert")
    ca = pki.create_authority(ns.dir, ns.name)
    return [ca.cert_path, os.path.join(ns.dir, "ca.key")]


def _issue(ns: argparse.Namespace) -> list[str]:
    ca = pki.load_authority(ns.dir)
    hosts = _hosts(ns.host) if ns.cmd != "client" else []  # checked before anything is written
    files: TlsFiles
    if ns.cmd == "member":
        files = pki.issue_member(ca, _out_dir(ns), ns.group, ns.id, hosts)
    elif ns.cmd == "server":
        files = pki.issue_server(ca, _out_dir(ns), ns.name, hosts)
    else:
        files = pki.issue_client(ca, _out_dir(ns), ns.name)
    assert files.cert_path is not None and files.key_path is not None
    return [files.cert_path, files.key_path]


def describe(cert_pem: bytes) -> list[str]:
    """What a certificate says, one ``key: value`` line each."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = alt.get_values_for_type(x509.UniformResourceIdentifier)
        hosts = [str(v) for v in alt.get_values_for_type(x509.IPAddress)]
        hosts += alt.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        uris, hosts = [], []
    member = pki.member_identity(cert_pem)
    client = pki.client_name(cert_pem)
    kind = "member" if member else "client" if client else "CA" if _is_ca(cert) else "server"
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    return [
        f"kind: {kind}",
        f"subject: {cert.subject.rfc4514_string()}",
        f"issuer: {cert.issuer.rfc4514_string()}",
        f"identity: {' '.join(uris) or '-'}",
        f"hosts: {' '.join(hosts) or '-'}",
        f"valid: {cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
        f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ} ({left.days} days left)",
        f"sha256: {cert.fingerprint(hashes.SHA256()).hex()}",
    ]


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.cmd == "show":
            lines = describe(read_pem(ns.file, "certificate"))
        elif ns.cmd == "ca":
            lines = [f"wrote {p}" for p in _create_ca(ns)]
        else:
            lines = [f"wrote {p}" for p in _issue(ns)]
    except (SecurityError, ValueError, OSError) as exc:
        print(f"mqcert: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
