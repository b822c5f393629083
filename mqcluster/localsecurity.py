"""The files of a secure local group, as ``mqcluster up`` (without ``--insecure``) makes them.

    <base>/tls/ca.crt, ca.key                 the group's own CA (key 0600)
    <base>/tls/<group>-<node>.crt, .key       each node's member certificate (server + client)
    <base>/tls/nameserver.crt, .key           the NameServer's server certificate
    <base>/tls/client-admin.crt, .key         a client certificate for the tools
    <base>/admin.json                         the admin user's credentials (0600)
    <base>/acl.key                            the key that encrypts user secrets at rest (0600)

Every key and secret file is 0600 and the ``tls`` directory 0700. A second ``up`` over the same
base dir keeps the CA, the admin credentials and the ACL key (the group's log already holds the
admin user sealed under that key) and issues fresh leaf certificates.

The keys written into each broker.conf and the NameServer config are the ones the TLS and ACL
servers read (docs/SECURITY.md): :func:`broker_keys` and :func:`namesrv_keys`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mqsecurity import pki
from mqsecurity.channels import ClientSecurity
from mqsecurity.credentials import (
    Credentials,
    load_credentials,
    save_credentials,
    write_private_file,
)
from mqsecurity.options import security_argv
from mqsecurity.tls import TlsFiles

TLS_DIR = "tls"
ADMIN_CREDENTIALS_FILE = "admin.json"
ACL_KEY_FILE = "acl.key"
# The Super user `mqcluster up` creates (initAuthenticationUser) and its client certificate.
ADMIN_USER = "admin"
NAMESRV_CERT_NAME = "nameserver"
# What a local group's certificates name and where its NameServer listens: this machine only.
LOCAL_HOSTS = ("127.0.0.1", "localhost")
LOCAL_BIND_HOST = "127.0.0.1"
# 24 random bytes: a 32-character URL-safe secret (192 bits), within the 8..256 characters a
# SecretKey may have.
ADMIN_SECRET_BYTES = 24
# AES-256-GCM: 32 bytes, written as 64 hex digits and a newline (the ACL key file's format).
ACL_KEY_BYTES = 32
# The NameServer's bind-address key (RocketMQ's NameServer has none of its own; the TLS
# server work names it).
NAMESRV_BIND_HOST_KEY = "listenHost"


@dataclass(frozen=True, slots=True)
class SecureLayout:
    """Where a base dir's security files are (whether or not they exist yet)."""

    base: Path

    @property
    def tls_dir(self) -> Path:
        return self.base / TLS_DIR

    @property
    def ca_cert(self) -> Path:
        return self.tls_dir / "ca.crt"

    @property
    def admin_credentials(self) -> Path:
        return self.base / ADMIN_CREDENTIALS_FILE

    @property
    def acl_key(self) -> Path:
        return self.base / ACL_KEY_FILE

    def member(self, group: str, node_id: str) -> TlsFiles:
        stem = self.tls_dir / f"{group}-{node_id}"
        return TlsFiles(f"{stem}.crt", f"{stem}.key", str(self.ca_cert))

    def namesrv(self) -> TlsFiles:
        stem = self.tls_dir / NAMESRV_CERT_NAME
        return TlsFiles(f"{stem}.crt", f"{stem}.key", str(self.ca_cert))

    def admin_client(self) -> TlsFiles:
        stem = self.tls_dir / f"client-{ADMIN_USER}"
        return TlsFiles(f"{stem}.crt", f"{stem}.key", str(self.ca_cert))

    def exists(self) -> bool:
        return self.ca_cert.exists() and self.admin_credentials.exists()

    def client_security(self) -> ClientSecurity:
        """TLS trusting the group's CA, the admin client certificate, every call signed with
        the admin credentials."""
        return ClientSecurity(
            tls=self.admin_client(), credentials=load_credentials(str(self.admin_credentials))
        )

    def tool_argv(self) -> list[str]:
        """The same as options for a tool process (the secret stays in its file)."""
        return security_argv(self.admin_client(), str(self.admin_credentials))


def _keep_or_make_secrets(layout: SecureLayout) -> tuple[pki.Authority, Credentials]:
    """The CA, the admin credentials and the ACL key: the existing ones when the base dir has
    them (its data was written under them), else new ones."""
    if layout.exists() and layout.acl_key.exists():
        return pki.load_authority(str(layout.tls_dir)), load_credentials(
            str(layout.admin_credentials)
        )
    layout.base.mkdir(parents=True, exist_ok=True)
    ca = pki.create_authority(str(layout.tls_dir))
    os.chmod(layout.tls_dir, 0o700)
    credentials = Credentials(ADMIN_USER, secrets.token_urlsafe(ADMIN_SECRET_BYTES))
    save_credentials(str(layout.admin_credentials), credentials)
    write_private_file(str(layout.acl_key), secrets.token_hex(ACL_KEY_BYTES).encode() + b"\n")
    return ca, credentials


def create_secure_files(
    base: Path,
    group: str,
    node_hosts: dict[str, Sequence[str]],
    namesrv_hosts: Sequence[str] = LOCAL_HOSTS,
) -> tuple[SecureLayout, Credentials]:
    """Every file of the layout above for ``group``'s nodes (``node_hosts``: node id -> the
    hosts its certificate names); returns the layout and the admin credentials."""
    layout = SecureLayout(base)
    ca, credentials = _keep_or_make_secrets(layout)
    for node_id, hosts in node_hosts.items():
        pki.issue_member(ca, str(layout.tls_dir), group, node_id, hosts)
    pki.issue_server(ca, str(layout.tls_dir), NAMESRV_CERT_NAME, namesrv_hosts)
    pki.issue_client(ca, str(layout.tls_dir), ADMIN_USER)
    return layout, credentials


def add_member_files(layout: SecureLayout, group: str, node_id: str) -> Credentials:
    """A member certificate for a node added to a running secure group (its id in the
    certificate, as the peer port's member check wants), by the group's own CA; returns the
    admin credentials its broker.conf names."""
    ca = pki.load_authority(str(layout.tls_dir))
    pki.issue_member(ca, str(layout.tls_dir), group, node_id, LOCAL_HOSTS)
    return load_credentials(str(layout.admin_credentials))


def _tls_keys(files: TlsFiles) -> dict[str, str]:
    assert files.cert_path is not None and files.key_path is not None
    assert files.ca_path is not None
    return {
        "tlsEnable": "true",
        "tlsServerCertPath": files.cert_path,
        "tlsServerKeyPath": files.key_path,
        "tlsServerTrustCertPath": files.ca_path,
    }


def broker_keys(
    layout: SecureLayout, group: str, node_id: str, admin: Credentials
) -> dict[str, str]:
    """The broker.conf keys of one node of a secure group: TLS on every port with its member
    certificate, authentication and authorization on, the admin user to create first."""
    init_user = json.dumps({"username": admin.access_key, "password": admin.secret_key})
    return {
        **_tls_keys(layout.member(group, node_id)),
        "authenticationEnabled": "true",
        "authorizationEnabled": "true",
        "initAuthenticationUser": init_user,
        "aclEncryptionKeyPath": str(layout.acl_key),
    }


def namesrv_keys(layout: SecureLayout, bind_host: str = LOCAL_BIND_HOST) -> dict[str, str]:
    """The NameServer config keys of a secure group: TLS, only members register, this
    machine only."""
    return {
        NAMESRV_BIND_HOST_KEY: bind_host,
        **_tls_keys(layout.namesrv()),
        "brokerAuthenticationEnabled": "true",
    }


def credentials_notice(layout: SecureLayout) -> str:
    """What `mqcluster up` prints: where the admin credentials and the CA are, and how the
    tools use them."""
    return (
        f"security: TLS, member certificates and ACLs on; admin credentials in "
        f"{layout.admin_credentials} (0600), CA certificate {layout.ca_cert}\n"
        f"  for mqadmin and the clients: export RAFTMQ_CREDENTIALS={layout.admin_credentials} "
        f"RAFTMQ_TLS_CA={layout.ca_cert}"
    )
